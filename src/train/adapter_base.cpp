// load_adapter_base / check_adapter_base: the frozen base of a LoRA run (adapter_base.h).
#include "shardtrain/train/adapter_base.h"

#include <cstdio>
#include <set>

#include "shardtrain/ckpt/peft.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"

namespace shardtrain::train {

ckpt::BaseIdentity load_adapter_base(const deck::Deck& d, fsdp::Engine& engine, MPI_Comm world, bool verbose) {
  int rank = 0;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  std::string init_from, source;
  runtime::run_agreed(world, [&] {
    init_from = d.get_string("checkpoint.init_from");
    source = init_from.empty() ? "run.seed = " + std::to_string(d.get_int("run.seed")) : init_from;
    // A clear error before any collective read.
    for (const std::string& f : init_from.empty() ? std::vector<std::string>{} : ckpt::safetensors_files(init_from))
      ckpt::read_safetensors_header(f);
  });
  Timer t;
  if (!init_from.empty()) {
    ckpt::TensorPick pick;
    pick.wanted = [](const std::string& name) { return !model::is_lora_param(name); };  // the adapters are not in a base
    ckpt::load_safetensors(init_from, engine, world, pick);
  }
  ckpt::BaseIdentity id = ckpt::frozen_identity(engine, world, source);
  if (verbose && rank == 0) {
    std::printf("# LoRA base: %zu frozen tensors from %s, read and identified in %.2f s\n", id.digests.size(),
                source.c_str(), t.seconds());
    std::fflush(stdout);
  }
  return id;
}

void load_peft_adapter(const std::string& dir, fsdp::Engine& engine, MPI_Comm world, bool verbose) {
  std::set<std::string> trained;
  for (fsdp::FlatParam* fp : engine.flat_params())
    for (const auto& s : fp->slots())
      if (!fp->frozen()) trained.insert(s.name);
  const std::string file = dir + "/" + ckpt::kPeftWeightsFile;
  runtime::run_agreed(world, [&] { ckpt::read_safetensors_header(file); });
  Timer t;
  ckpt::TensorPick pick;
  pick.wanted = [&](const std::string& name) { return trained.count(name) > 0; };
  pick.in_file = ckpt::peft_tensor_name;
  pick.extras_are_errors = true;
  pick.what = "PEFT adapter";
  ckpt::load_safetensors(file, engine, world, pick);
  if (verbose) {
    std::printf("# LoRA adapters from %s (lora.init_from): %zu tensors in %.2f s\n", dir.c_str(), trained.size(), t.seconds());
    std::fflush(stdout);
  }
}

void check_adapter_base(const std::string& ckpt_path, const std::string& recorded_json, const ckpt::BaseIdentity& now,
                        const std::string& action) {
  ST_USER_CHECK(!recorded_json.empty(), ckpt_path,
                " holds a whole model, not a LoRA adapter (no base attribute), but this run has lora.rank > 0: ",
                action, " it without LoRA (--set lora.rank=0), or start the adapters from it with checkpoint.init_from");
  const ckpt::BaseIdentity recorded = ckpt::BaseIdentity::parse(recorded_json, "checkpoint " + ckpt_path);
  const std::string diff = recorded.differences(now);
  ST_USER_CHECK(diff.empty(), ckpt_path, ": cannot ", action, " this LoRA adapter on another base: it was ", diff,
                ". Point checkpoint.init_from at the base it was trained on");
}

}  // namespace shardtrain::train
