// Training metrics: one console line and one JSONL record per logged step, plus the summary.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/util/file_io.h"

namespace shardtrain::train {

struct StepRecord {
  int64_t step = 0;             // optimizer steps completed
  int64_t max_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double items_per_s = 0;       // tokens/s for language models, samples/s for ViT
  bool items_are_tokens = true;
  double step_ms = 0;
  double tflops = 0;            // achieved model TFLOP/s per rank
  double mfu = 0;               // tflops / the hardware's peak per rank (train/peak_flops.h)
  double mfu_matmul = 0;        // tflops / the measured matmul per rank (0 = not measured)
  double comm_share = 0;        // exposed communication / step time
  int64_t peak_mem_bytes = 0;   // max over ranks of the process peak RSS
  int64_t peak_tensor_bytes = 0;  // max over ranks: peak CPU tensor bytes since start + optimizer state
  int64_t peak_device_bytes = -1;  // max over ranks: CUDA max_memory_allocated; -1 = CPU device
  int64_t tokens_seen = 0;
  // Bytes the engine's collectives sent per step, summed over ranks, inside nodes and between
  // them (fsdp::CommStats' ring model), the mean over the steps since the last record.
  double intra_node_bytes = 0, inter_node_bytes = 0;
  // Quantized collectives (fsdp.quantize_*): the last accuracy-guard step's largest relative
  // errors (-1: not measured yet) and the flats fallen back to full precision so far.
  bool quantized = false;
  double quant_weight_err = -1, quant_grad_err = -1;
  int64_t quant_fallbacks = 0;
  // DiLoCo (parallel.replica_sync = "diloco"): outer steps of the whole model and fragment syncs
  // so far (fsdp::CommStats).
  bool diloco = false;
  int64_t outer_steps = 0, fragment_syncs = 0;
  double outer_quant_err = -1;  // DiLoCo int8 / int4: the last guard check's relative error (-1: none)
  int outer_fallbacks = 0;      // fragments whose outer average fell back to fp32
};

struct EvalRecord {
  int64_t step = 0;
  double val_loss = 0;
  std::optional<double> val_acc;  // classification only
};

// Rank 0 writes: the other ranks construct it with enabled = false. Every record is written
// whole or not at all (io::AppendFile); a failed write throws IoError (exit 5). With a
// communicator, every call is collective over it and a failed write on rank 0 throws the same
// agreed error on every rank; without one (MPI_COMM_NULL) only the writing rank throws.
class MetricsLog {
 public:
  // resumed_step < 0: a fresh run, the file starts empty. Otherwise the run continues a
  // checkpoint of that step: records of later steps (written before a crash, and about to
  // be written again) are dropped and new records are appended, so the file reads as one run.
  MetricsLog(const std::string& jsonl_path, bool enabled, int64_t resumed_step = -1, MPI_Comm comm = MPI_COMM_NULL);
  void log_step(const StepRecord& r);
  void log_eval(const EvalRecord& r);
  // A record {"step", "event": kind, "detail"} (a resume on changed data, ...): no loss, so
  // plots and step tables skip it.
  void log_event(int64_t step, const std::string& kind, const std::string& detail);
  // Median step time excluding `warmup` first logged steps, throughput and losses; written
  // through summary.json.tmp + rename after the metrics are synced.
  void write_summary(const std::string& json_path, int warmup, double final_loss,
                     std::optional<double> val_loss, std::optional<double> val_acc, bool items_are_tokens);

 private:
  std::string format_step(const StepRecord& r);  // prints the console line, returns the JSONL record
  std::string format_eval(const EvalRecord& r);
  void agreed_write(const std::function<void()>& write);
  bool enabled_;
  MPI_Comm comm_;
  io::AppendFile out_;
  std::vector<double> step_ms_, items_per_s_;
  int64_t peak_tensor_bytes_ = 0;
  int64_t peak_device_bytes_ = -1;
};

}  // namespace shardtrain::train
