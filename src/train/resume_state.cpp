// TrainState packing: cursor as two int64, RNG states concatenated rank by rank, the rest in extra JSON.
#include "resume_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "shardtrain/util/error.h"
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

void set_generator_state(const uint8_t* p, int64_t n, const c10::Device& device) {
  at::Generator gen = default_generator(device);
  at::Tensor t = at::empty({n}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(t.data_ptr<uint8_t>(), p, static_cast<size_t>(n));
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(t);
}

void reseed(uint64_t seed, int rank, int64_t step, const c10::Device& device) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(mix(mix(seed) ^ (static_cast<uint64_t>(rank) << 32) ^ static_cast<uint64_t>(step)));
}

}  // namespace

void seed_default_generator(uint64_t seed, int rank, const c10::Device& device) { reseed(seed, rank, 0, device); }

ckpt::TrainState make_train_state(const LoopPosition& pos, int64_t global_batch, uint64_t seed, MPI_Comm world,
                                  const c10::Device& device) {
  int size = 1;
  ST_MPI_CHECK(MPI_Comm_size(world, &size));
  std::vector<uint8_t> mine = generator_state(device);
  int64_t bytes = static_cast<int64_t>(mine.size()), max_bytes = 0;
  ST_MPI_CHECK(MPI_Allreduce(&bytes, &max_bytes, 1, MPI_INT64_T, MPI_MAX, world));
  ST_CHECK(max_bytes == bytes, "generator state sizes differ between ranks (", bytes, " vs ", max_bytes, " bytes)");
  ckpt::TrainState st;
  st.rng_state.resize(static_cast<size_t>(bytes) * size);
  ST_MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(bytes), MPI_UINT8_T, st.rng_state.data(),
                             static_cast<int>(bytes), MPI_UINT8_T, world));
  st.step = pos.step;
  st.lr_step = pos.step;
  st.tokens_seen = pos.tokens_seen;
  auto c = pos.cursor.to_array();
  st.data_cursor.assign(c.begin(), c.end());
  nlohmann::json extra = {{"rng_generator", generator_name(device)}, {"rng_ranks", size}, {"rng_bytes_per_rank", bytes},
                          {"global_batch", global_batch}, {"seed", seed}};
  st.extra_json = extra.dump();
  return st;
}

LoopPosition apply_train_state(const ckpt::TrainState& st, const std::string& path, int64_t global_batch,
                               uint64_t seed, int rank, int world_size, std::string& notes,
                               const c10::Device& device) {
  ST_USER_CHECK(st.data_cursor.size() == 2, path, ": /train/data_cursor has ", st.data_cursor.size(),
                " values, expected 2 (epoch, position)");
  ST_USER_CHECK(st.step >= 0 && st.tokens_seen >= 0, path, ": negative /train step or tokens_seen");
  ST_USER_CHECK(st.lr_step == st.step, path, ": /train lr_step ", st.lr_step, " differs from step ", st.step,
                " (this trainer keeps them equal)");
  nlohmann::json extra;
  try {
    extra = nlohmann::json::parse(st.extra_json);
  } catch (const std::exception& e) {
    throw UserError(path + ": /train attribute 'extra' is not JSON: " + e.what());
  }
  LoopPosition pos;
  pos.step = st.step;
  pos.tokens_seen = st.tokens_seen;
  pos.cursor = data::SamplerCursor::from_array({st.data_cursor[0], st.data_cursor[1]});

  const int64_t ranks = extra.value("rng_ranks", int64_t{0}), bytes = extra.value("rng_bytes_per_rank", int64_t{0});
  const bool rng_ok = ranks > 0 && bytes > 0 && static_cast<int64_t>(st.rng_state.size()) == ranks * bytes;
  const std::string kind = extra.value("rng_generator", std::string("torch_cpu_default"));
  if (rng_ok && ranks == world_size && kind == generator_name(device)) {
    set_generator_state(st.rng_state.data() + static_cast<size_t>(rank) * bytes, bytes, device);
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
  if (extra.contains("global_batch") && extra["global_batch"].get<int64_t>() != global_batch)
    notes += "# note: checkpoint was trained with global batch " + std::to_string(extra["global_batch"].get<int64_t>()) +
             ", this run uses " + std::to_string(global_batch) + "\n";
  if (extra.contains("seed") && extra["seed"].get<uint64_t>() != seed)
    notes += "# note: checkpoint was trained with run.seed " + std::to_string(extra["seed"].get<uint64_t>()) +
             ", this run uses " + std::to_string(seed) + " (the data order changes)\n";
  return pos;
}

}  // namespace shardtrain::train
