// Checkpointer: the save decision of each step boundary, the save itself and its console line.
#include "checkpointer.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "shardtrain/util/log.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"

namespace shardtrain::train {

Checkpointer::Checkpointer(ckpt::CheckpointManager& mgr, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt,
                           ckpt::CheckpointInfo info, SaveSchedule schedule, int64_t global_batch, uint64_t seed,
                           c10::Device device, int64_t resumed_step, MPI_Comm world)
    : mgr_(mgr), engine_(engine), opt_(opt), info_(std::move(info)), schedule_(std::move(schedule)),
      global_batch_(global_batch), seed_(seed), device_(device), last_saved_(resumed_step), world_(world) {
  ST_MPI_CHECK(MPI_Comm_rank(world_, &rank_));
}

void Checkpointer::save(const LoopPosition& pos, const std::string& why) {
  Timer save_timer;
  ckpt::TrainState st = make_train_state(pos, global_batch_, seed_, world_, device_, guarantee_);
  if (!data_identity_.empty()) {
    nlohmann::json extra = nlohmann::json::parse(st.extra_json);
    extra["data"] = nlohmann::json::parse(data_identity_);
    st.extra_json = extra.dump();
  }
  put_guard_state(st, engine_.guard_state());
  const std::string path = mgr_.save(pos.step, engine_, opt_, st, info_);
  schedule_.saved();
  if (path.empty()) return;  // refused (non-finite state; the manager said so)
  last_saved_ = pos.step;
  if (rank_ != 0) return;
  if (mgr_.async())
    std::printf("checkpoint: step %lld -> %s (%s; blocked %.2f s)\n", static_cast<long long>(pos.step), path.c_str(),
                why.c_str(), save_timer.seconds());
  else
    std::printf("checkpoint: step %lld -> %s (%s; wrote and verified in %.2f s, verification %.2f s)\n",
                static_cast<long long>(pos.step), path.c_str(), why.c_str(), save_timer.seconds(),
                mgr_.last_verify_seconds());
  std::fflush(stdout);
}

bool Checkpointer::after_step(const LoopPosition& pos, bool finished, const StepAgreed& agreed) {
  // Every rank decides on the same agreed inputs, so all save at the same step boundary.
  const SaveSchedule::Decision dec = schedule_.decide(pos.step, finished, agreed);
  if (dec.stop && rank_ == 0)
    log::info(log::fmt("stop requested (signal ", dec.signal, ") at step ", pos.step,
                       finished ? ": training is finished anyway" : ": checkpointing, then exit 42 (requeue me)"));
  if (dec.save) save(pos, dec.reason);
  return dec.stop && !finished;
}

bool Checkpointer::finish(const LoopPosition& pos, bool save_final) {
  // Every way out of the loop has saved its step; this keeps a future exit path from ending a
  // run without its final checkpoint.
  bool ok = true;
  if (save_final && pos.step > 0 && last_saved_ != pos.step) {
    save(pos, "final");
    ok = last_saved_ == pos.step;
  }
  mgr_.wait();  // a background save must be committed before the exit code promises it
  return ok;
}

}  // namespace shardtrain::train
