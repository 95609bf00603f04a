// TrainState packing: cursor as two int64, RNG states concatenated rank by rank, the rest in extra JSON.
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/train/resume_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "shardtrain/train/leaf_plan.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/small_file.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::train {
namespace {

// splitmix64: decorrelates nearby (seed, rank, step) triples.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Torch's default generator of the device (CPU, or the GPU's; at::Context knows both kinds
// without CUDA headers).
at::Generator default_generator(const c10::Device& device) {
  return device.is_cpu() ? at::detail::getDefaultCPUGenerator() : at::globalContext().defaultGenerator(device);
}

const char* generator_name(const c10::Device& device) {
  return device.is_cpu() ? "torch_cpu_default" : "torch_cuda_default";
}

std::vector<uint8_t> generator_state(const c10::Device& device) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  at::Tensor t = gen.get_state().contiguous();
  const auto* p = t.data_ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + t.numel());
}

// The layout of the CPU generator's state (ATen/CPUGeneratorImpl.cpp, CPUGeneratorImplState):
// libtorch copies it into its mt19937 without checking the indices, so a state with a wild
// `left` or `next` would read outside the 624-word array at the first draw.
struct CpuStateLegacy {
  uint64_t the_initial_seed;
  int left;
  int seeded;
  uint64_t next;
  uint64_t state[624];
  double normal_x, normal_y, normal_rho;
  int normal_is_valid;
};
struct CpuState {
  CpuStateLegacy legacy_pod;
  float next_float_normal_sample;
  bool is_next_float_normal_sample_valid;
};

// "" when the bytes can be a CPU generator state; otherwise why not.
std::string cpu_state_problem(const uint8_t* p, int64_t n, int64_t expected_size) {
  if (n != expected_size) return "has " + std::to_string(n) + " bytes, a CPU generator state has " + std::to_string(expected_size);
  if (expected_size != static_cast<int64_t>(sizeof(CpuState))) return "";  // another libtorch layout: its own checks
  CpuState st;
  std::memcpy(&st, p, sizeof st);
  const CpuStateLegacy& l = st.legacy_pod;
  if (l.left < 1 || l.left > 624 || l.next > 624 || static_cast<uint64_t>(l.left) + l.next > 625)
    return "has generator indices (left " + std::to_string(l.left) + ", next " + std::to_string(l.next) +
           ") outside the 624-word state";
  for (uint64_t w : l.state)
    if (w > 0xFFFFFFFFull) return "has a state word above 32 bits";
  if ((l.seeded != 0 && l.seeded != 1) || (l.normal_is_valid != 0 && l.normal_is_valid != 1))
    return "has flags that are neither 0 nor 1";
  return "";
}

void set_generator_state(const uint8_t* p, int64_t n, const c10::Device& device, const std::string& path, int rank) {
  at::Generator gen = default_generator(device);
  const std::string what = path + ": /train/rng_state of rank " + std::to_string(rank);
  if (device.is_cpu()) {
    const std::string problem = cpu_state_problem(p, n, static_cast<int64_t>(generator_state(device).size()));
    if (!problem.empty()) throw UserError(what + " is not a generator state: it " + problem + " (corrupt checkpoint)");
  }
  at::Tensor t = at::empty({n}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(t.data_ptr<uint8_t>(), p, static_cast<size_t>(n));
  std::lock_guard<std::mutex> lock(gen.mutex());
  try {
    gen.set_state(t);
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    msg = msg.substr(0, msg.find('\n'));
    throw UserError(what + " cannot be restored (" + msg + "): corrupt checkpoint");
  }
}

void reseed(uint64_t seed, int rank, int64_t step, const c10::Device& device) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(mix(mix(seed) ^ (static_cast<uint64_t>(rank) << 32) ^ static_cast<uint64_t>(step)));
}

}  // namespace

void seed_default_generator(uint64_t seed, int rank, const c10::Device& device) { reseed(seed, rank, 0, device); }

void seed_leaf_generator(uint64_t seed, int64_t step, int64_t leaf, const c10::Device& device) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(mix(mix(mix(seed) ^ 0x4C454146ull ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(leaf)));
}

ckpt::TrainState make_train_state(const LoopPosition& pos, int64_t global_batch, uint64_t seed, MPI_Comm world,
                                  const c10::Device& device, const std::string& guarantee) {
  int size = 1;
  ST_MPI_CHECK(MPI_Comm_size(world, &size));
  const std::vector<uint8_t> mine = generator_state(device);
  const int64_t bytes = static_cast<int64_t>(mine.size());
  // The train state of a checkpoint: every rank's generator state, in rank order.
  const std::vector<std::string> all =
      runtime::all_gather_bytes(world, std::string(mine.begin(), mine.end()), "save.rng_state");
  ckpt::TrainState st;
  for (const std::string& s : all) {
    ST_CHECK(static_cast<int64_t>(s.size()) == bytes, "generator state sizes differ between ranks (", bytes, " vs ",
             s.size(), " bytes)");
    st.rng_state.insert(st.rng_state.end(), s.begin(), s.end());
  }
  st.step = pos.step;
  st.lr_step = pos.step;
  st.tokens_seen = pos.tokens_seen;
  auto c = pos.cursor.to_array();
  st.data_cursor.assign(c.begin(), c.end());
  nlohmann::json extra = {{"rng_generator", generator_name(device)}, {"rng_ranks", size}, {"rng_bytes_per_rank", bytes},
                          {"global_batch", global_batch}, {"seed", seed}};
  if (!guarantee.empty()) extra["reproducible"] = nlohmann::json::parse(guarantee);
  st.extra_json = extra.dump();
  return st;
}

LoopPosition apply_train_state(const ckpt::TrainState& st, const std::string& path, int64_t global_batch,
                               uint64_t seed, int rank, int world_size, std::string& notes,
                               const c10::Device& device, const std::string& guarantee) {
  ST_USER_CHECK(st.data_cursor.size() == 2, path, ": /train/data_cursor has ", st.data_cursor.size(),
                " values, expected 2 (epoch, position)");
  ST_USER_CHECK(st.step >= 0 && st.tokens_seen >= 0, path, ": negative /train step or tokens_seen");
  ST_USER_CHECK(st.lr_step == st.step, path, ": /train lr_step ", st.lr_step, " differs from step ", st.step,
                " (this trainer keeps them equal)");
  nlohmann::json extra;
  try {
    check_json_depth(st.extra_json, kMaxJsonDepth, path + ": /train attribute 'extra'");
    extra = nlohmann::json::parse(st.extra_json);
  } catch (const std::exception& e) {
    throw UserError(path + ": /train attribute 'extra' is not JSON: " + e.what());
  }
  if (!extra.is_object()) throw UserError(path + ": /train attribute 'extra' is not a JSON object");
  // Typed reads of the optional fields: a wrong type is the checkpoint's fault, not a bug.
  auto int_field = [&](const char* key, int64_t dflt) -> int64_t {
    if (!extra.contains(key)) return dflt;
    const nlohmann::json& v = extra[key];
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}))
      throw UserError(path + ": /train attribute 'extra': " + key + " is " + v.dump() + ", not a 64-bit integer");
    return v.get<int64_t>();
  };
  LoopPosition pos;
  pos.step = st.step;
  pos.tokens_seen = st.tokens_seen;
  pos.cursor = data::SamplerCursor::from_array({st.data_cursor[0], st.data_cursor[1]});

  const int64_t ranks = int_field("rng_ranks", 0), bytes = int_field("rng_bytes_per_rank", 0);
  int64_t total = 0;
  const bool rng_ok = ranks > 0 && bytes > 0 && !__builtin_mul_overflow(ranks, bytes, &total) &&
                      static_cast<int64_t>(st.rng_state.size()) == total;
  std::string kind = "torch_cpu_default";
  if (extra.contains("rng_generator")) {
    if (!extra["rng_generator"].is_string())
      throw UserError(path + ": /train attribute 'extra': rng_generator is " + extra["rng_generator"].dump() +
                      ", not a string");
    kind = extra["rng_generator"].get<std::string>();
  }
  if (rng_ok && ranks == world_size && kind == generator_name(device)) {
    set_generator_state(st.rng_state.data() + static_cast<size_t>(rank) * bytes, bytes, device, path, rank);
  } else {
    reseed(seed, rank, st.step, device);
    if (!rng_ok) notes += "# RNG: checkpoint holds no usable generator states: reseeded from run.seed\n";
    else if (ranks != world_size)
      notes += "# RNG: checkpoint holds " + std::to_string(ranks) + " rank states, this run has " +
               std::to_string(world_size) + " ranks: generators reseeded from run.seed (only dropout differs)\n";
    else
      notes += "# RNG: checkpoint holds " + kind + " generator states, this run draws from " +
               generator_name(device) + ": reseeded from run.seed (only dropout differs)\n";
  }
  if (!guarantee.empty()) {
    if (!extra.contains("reproducible") || !extra["reproducible"].is_object())
      notes += "# note: train.reproducible: the checkpoint was written without it, so this run reproduces itself from "
               "here on, not an uninterrupted reproducible run\n";
    else
      notes += guarantee_differences(extra["reproducible"], nlohmann::json::parse(guarantee));
  }
  const int64_t saved_batch = int_field("global_batch", global_batch);
  if (saved_batch != global_batch)
    notes += "# note: checkpoint was trained with global batch " + std::to_string(saved_batch) + ", this run uses " +
             std::to_string(global_batch) + "\n";
  // Printed as stored (dump), so a negative or odd value is not shown wrapped to 2^64 - 1.
  if (extra.contains("seed") && !(extra["seed"].is_number_unsigned() && extra["seed"].get<uint64_t>() == seed) &&
      !(extra["seed"].is_number_integer() && extra["seed"].get<int64_t>() >= 0 &&
        static_cast<uint64_t>(extra["seed"].get<int64_t>()) == seed))
    notes += "# note: checkpoint was trained with run.seed " + extra["seed"].dump() + ", this run uses " +
             std::to_string(seed) + " (the data order changes)\n";
  return pos;
}

void put_guard_state(ckpt::TrainState& st, const fsdp::GuardState& g) {
  if (g.weights.empty() && g.grads.empty() && g.outer.empty()) return;
  nlohmann::json extra = nlohmann::json::parse(st.extra_json);
  extra["guard"] = {{"weights", g.weights}, {"grads", g.grads}, {"steps", g.steps}, {"outer", g.outer}};
  st.extra_json = extra.dump();
}

std::optional<fsdp::GuardState> guard_state_of(const ckpt::TrainState& st, const std::string& path) {
  const nlohmann::json extra = nlohmann::json::parse(st.extra_json, nullptr, false);
  if (!extra.is_object() || !extra.contains("guard")) return std::nullopt;
  const nlohmann::json& j = extra["guard"];
  const std::string where = path + ": /train attribute 'extra': guard";
  if (!j.is_object()) throw UserError(where + " is " + j.dump() + ", not an object");
  fsdp::GuardState g;
  auto flags = [&](const char* key, std::vector<uint8_t>& out) {
    if (!j.contains(key)) return;
    const nlohmann::json& v = j[key];
    if (!v.is_array()) throw UserError(where + "." + key + " is not an array");
    for (const nlohmann::json& x : v) {
      if (!x.is_number_integer() || (x.get<int64_t>() != 0 && x.get<int64_t>() != 1))
        throw UserError(where + "." + key + " holds " + x.dump() + ", not 0 or 1");
      out.push_back(static_cast<uint8_t>(x.get<int64_t>()));
    }
  };
  flags("weights", g.weights);
  flags("grads", g.grads);
  flags("outer", g.outer);
  if (j.contains("steps")) {
    const nlohmann::json& v = j["steps"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      throw UserError(where + ".steps is " + v.dump() + ", not a step count");
    g.steps = v.get<int64_t>();
  }
  return g;
}

}  // namespace shardtrain::train
