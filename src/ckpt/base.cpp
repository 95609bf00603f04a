// BaseIdentity and frozen_identity (see base.h).
#include "shardtrain/ckpt/base.h"

#include <nlohmann/json.hpp>

#include "plan.h"
#include "shardtrain/fsdp/options.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::ckpt {

std::string BaseIdentity::json() const {
  nlohmann::json d = nlohmann::json::object();
  for (const auto& [name, g] : digests) d[name] = {g.sum, g.weighted};
  return nlohmann::json{{"source", source}, {"dtype", dtype}, {"digests", d}}.dump();
}

BaseIdentity BaseIdentity::parse(const std::string& text, const std::string& what) {
  check_json_depth(text, kMaxJsonDepth, what);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& why) { return UserError(what + ": the base's identity is malformed (" + why + ")"); };
  if (!j.is_object() || !j.contains("digests") || !j["digests"].is_object()) throw bad("no \"digests\" object");
  BaseIdentity b;
  if (j.contains("source") && j["source"].is_string()) b.source = j["source"].get<std::string>();
  if (j.contains("dtype") && j["dtype"].is_string()) b.dtype = j["dtype"].get<std::string>();
  for (const auto& [name, v] : j["digests"].items()) {
    if (!v.is_array() || v.size() != 2 || !v[0].is_number_unsigned() || !v[1].is_number_unsigned())
      throw bad("digest of '" + name + "' is not [sum, weighted]");
    b.digests[name] = Digest{v[0].get<uint64_t>(), v[1].get<uint64_t>()};
  }
  return b;
}

std::string BaseIdentity::differences(const BaseIdentity& now) const {
  std::vector<std::string> missing, extra, changed;
  for (const auto& [name, g] : digests) {
    auto it = now.digests.find(name);
    if (it == now.digests.end()) missing.push_back(name);
    else if (it->second != g) changed.push_back(name);
  }
  for (const auto& [name, g] : now.digests)
    if (!digests.count(name)) extra.push_back(name);
  if (missing.empty() && extra.empty() && changed.empty()) return "";
  auto first = [](const std::vector<std::string>& v) {
    return "'" + v.front() + "'" + (v.size() > 1 ? " and " + std::to_string(v.size() - 1) + " more" : "");
  };
  std::string why;
  if (!changed.empty()) why = "tensor " + first(changed) + " holds other values";
  if (!missing.empty()) why += (why.empty() ? "" : "; ") + std::string("tensor ") + first(missing) + " is not frozen here";
  if (!extra.empty()) why += (why.empty() ? "" : "; ") + std::string("tensor ") + first(extra) + " is frozen only here";
  if (dtype != now.dtype && !dtype.empty())
    why += " (held in " + now.dtype + " here, in " + dtype + " there: fsdp.param_dtype rounds the base)";
  return "trained on the base from " + (source.empty() ? std::string("?") : source) + ", this run's base is from " +
         now.source + ": " + why;
}

std::string base_dtype_text(const std::string& param_dtype, int64_t nf4_block, bool nf4_double_quant) {
  if (nf4_block <= 0) return param_dtype;
  return param_dtype + " with nf4 linear weights (block " + std::to_string(nf4_block) +
         (nf4_double_quant ? ", double-quantized)" : ")");
}

std::string base_param_dtype(const std::string& dtype_text) { return dtype_text.substr(0, dtype_text.find(' ')); }

BaseIdentity frozen_identity(fsdp::Engine& engine, MPI_Comm world, const std::string& source) {
  BaseIdentity b;
  b.source = source;
  // QLoRA: the digests are of the NF4 weights dequantized, as the run computes with them.
  const fsdp::Nf4Base& q = engine.options().nf4;
  b.dtype = base_dtype_text(fsdp::dtype_name(engine.options().mp.param_dtype), q.block, q.double_quant);
  // The frozen flats as a snapshot, split among the ranks that hold each element as a checkpoint's
  // writes are. Their values are read one flat at a time (an fp32 host copy of its shard, an NF4
  // flat's dequantized), so a 70B base is never widened whole.
  Snapshot snap;
  std::vector<const fsdp::FlatParam*> frozen;
  const std::vector<fsdp::FlatParam*> flats = engine.flat_params();
  for (size_t i = 0; i < flats.size(); ++i) {
    if (!flats[i]->frozen()) continue;
    snap.flats.push_back(flat_view(*flats[i], i));
    frozen.push_back(flats[i]);
  }
  const std::vector<ParamPlan> plan = make_plan(snap, world, /*split=*/true);
  std::vector<uint64_t> sums(2 * plan.size(), 0);
  for (size_t f = 0; f < frozen.size(); ++f) {
    const at::Tensor values = frozen[f]->shard_values().to(at::kCPU, at::kFloat).contiguous();
    const float* data = values.data_ptr<float>();
    for (size_t i = 0; i < plan.size(); ++i) {
      const ParamPlan& p = plan[i];
      if (p.flat != f || !p.own.numel()) continue;
      Digest dg;
      dg.add(data + p.own.shard_offset, p.own.numel(), 4, p.own.lo);
      sums[2 * i] = dg.sum;
      sums[2 * i + 1] = dg.weighted;
    }
  }
  runtime::sum(world, sums, "base.digests");
  for (size_t i = 0; i < plan.size(); ++i) b.digests[plan[i].name] = Digest{sums[2 * i], sums[2 * i + 1]};
  return b;
}

}  // namespace shardtrain::ckpt
