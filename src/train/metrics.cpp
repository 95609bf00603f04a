// MetricsLog: console lines for people, JSONL records for tools, summary.json at the end.
#include "shardtrain/train/metrics.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "shardtrain/runtime/agree.h"
#include "shardtrain/util/error.h"

namespace shardtrain::train {
namespace {
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

MetricsLog::MetricsLog(const std::string& jsonl_path, bool enabled, int64_t resumed_step, MPI_Comm comm)
    : enabled_(enabled), comm_(comm) {
  if (!enabled_) return;
  if (resumed_step >= 0) {
    // Keep the records up to the checkpoint's step; rewrite the file through a temporary
    // so a crash here cannot lose the history.
    std::vector<std::string> keep;
    std::ifstream in(jsonl_path);
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object()) continue;  // a line torn by the crash
      if (j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() > resumed_step) continue;
      keep.push_back(line);
    }
    std::string text;
    for (const auto& l : keep) text += l + "\n";
    io::write_file_atomic(jsonl_path, text);  // IoError (exit 5) naming the file and the reason
  }
  out_.open(jsonl_path, /*truncate=*/resumed_step < 0);
}

// Rank 0 writes, every rank learns whether it worked: a full disk under out_dir ends the job
// with exit 5 on every rank (one agreement, "metrics.write", per logged record; records are rare
// next to a step's exchanges) instead of rank 0 alone failing or the run ending rc 0 with lost metrics.
void MetricsLog::agreed_write(const std::function<void()>& write) {
  if (comm_ == MPI_COMM_NULL) {
    if (enabled_) write();
    return;
  }
  runtime::run_agreed(
      comm_,
      [&] {
        if (enabled_) write();
      },
      "metrics.write");
}

void MetricsLog::log_step(const StepRecord& r) {
  std::string line;
  if (enabled_) line = format_step(r);
  agreed_write([&] { out_.append(line); });
}

std::string MetricsLog::format_step(const StepRecord& r) {
  step_ms_.push_back(r.step_ms);
  items_per_s_.push_back(r.items_per_s);
  peak_tensor_bytes_ = std::max(peak_tensor_bytes_, r.peak_tensor_bytes);
  peak_device_bytes_ = std::max(peak_device_bytes_, r.peak_device_bytes);
  // On a GPU the device's peak is the memory that matters; the host RSS is the CPU run's.
  const bool dev = r.peak_device_bytes >= 0;
  std::printf("step %6lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %9.0f %s | %7.1f ms | %.3f TFLOP/s | "
              "MFU %4.1f%% | comm %3.0f%% | %s %.2f GiB\n",
              static_cast<long long>(r.step), static_cast<long long>(r.max_steps), r.loss, r.lr, r.grad_norm,
              r.items_per_s, r.items_are_tokens ? "tok/s" : "img/s", r.step_ms, r.tflops, 100 * r.mfu,
              100 * r.comm_share, dev ? "dev" : "mem",
              (dev ? r.peak_device_bytes : r.peak_mem_bytes) / 1073741824.0);
  std::fflush(stdout);
  nlohmann::json j = {{"step", r.step},
                      {"loss", r.loss},
                      {"lr", r.lr},
                      {"grad_norm", r.grad_norm},
                      {r.items_are_tokens ? "tokens_per_s" : "samples_per_s", r.items_per_s},
                      {"step_ms", r.step_ms},
                      {"tflops", r.tflops},
                      {"mfu", r.mfu},
                      {"comm_share", r.comm_share},
                      {"peak_mem_bytes", r.peak_mem_bytes},
                      {"peak_tensor_bytes", r.peak_tensor_bytes},
                      {"tokens_seen", r.tokens_seen},
                      {"intra_node_bytes", r.intra_node_bytes},
                      {"inter_node_bytes", r.inter_node_bytes}};
  if (r.quantized) {
    j["quant_fallbacks"] = r.quant_fallbacks;
    if (r.quant_weight_err >= 0) j["quant_weight_err"] = r.quant_weight_err;
    if (r.quant_grad_err >= 0) j["quant_grad_err"] = r.quant_grad_err;
  }
  if (r.diloco) {
    j["outer_steps"] = r.outer_steps;
    j["fragment_syncs"] = r.fragment_syncs;
    // A resumed run has its checkpoint's fallbacks before its own first guard check.
    if (r.outer_quant_err >= 0) j["outer_quant_err"] = r.outer_quant_err;
    if (r.outer_quant_err >= 0 || r.outer_fallbacks > 0) j["outer_fallbacks"] = r.outer_fallbacks;
  }
  if (dev) j["peak_device_bytes"] = r.peak_device_bytes;
  if (r.mfu_matmul > 0) j["mfu_matmul"] = r.mfu_matmul;
  if (!r.items_are_tokens) j["tokens_per_s"] = r.items_per_s;  // the key tools expect; here: samples
  return j.dump() + "\n";
}

void MetricsLog::log_eval(const EvalRecord& r) {
  std::string line;
  if (enabled_) line = format_eval(r);
  agreed_write([&] { out_.append(line); });
}

void MetricsLog::log_event(int64_t step, const std::string& kind, const std::string& detail) {
  std::string line;
  if (enabled_) line = nlohmann::json{{"step", step}, {"event", kind}, {"detail", detail}}.dump() + "\n";
  agreed_write([&] { out_.append(line); });
}

std::string MetricsLog::format_eval(const EvalRecord& r) {
  nlohmann::json j = {{"step", r.step}, {"val_loss", r.val_loss}, {"val_ppl", std::exp(std::min(r.val_loss, 50.0))}};
  std::string acc;
  if (r.val_acc) {
    j["val_acc"] = *r.val_acc;
    acc = " | val acc " + std::to_string(100 * *r.val_acc).substr(0, 5) + "%";
  }
  std::printf("eval %6lld | val loss %.4f | val ppl %.2f%s\n", static_cast<long long>(r.step), r.val_loss,
              std::exp(std::min(r.val_loss, 50.0)), acc.c_str());
  std::fflush(stdout);
  return j.dump() + "\n";
}

void MetricsLog::write_summary(const std::string& json_path, int warmup, double final_loss,
                               std::optional<double> val_loss, std::optional<double> val_acc, bool items_are_tokens) {
  if (!enabled_) {
    agreed_write([] {});
    return;
  }
  std::vector<double> ms(step_ms_.begin() + std::min<size_t>(warmup, step_ms_.size()), step_ms_.end());
  std::vector<double> ips(items_per_s_.begin() + std::min<size_t>(warmup, items_per_s_.size()), items_per_s_.end());
  if (ms.empty()) ms = step_ms_, ips = items_per_s_;
  nlohmann::json j = {{"logged_steps", step_ms_.size()},
                      {"median_step_ms", median(ms)},
                      {items_are_tokens ? "tokens_per_s" : "samples_per_s", median(ips)},
                      {"final_loss", final_loss}};
  if (peak_tensor_bytes_ > 0) j["peak_tensor_bytes"] = peak_tensor_bytes_;
  if (peak_device_bytes_ >= 0) j["peak_device_bytes"] = peak_device_bytes_;
  if (val_loss) j["val_loss"] = *val_loss;
  if (val_acc) j["val_acc"] = *val_acc;
  // The metrics on stable storage, then summary.json through tmp + rename: never empty or half.
  agreed_write([&] {
    out_.sync();
    io::write_file_atomic(json_path, j.dump(2) + "\n");
  });
  std::printf("summary: median step %.1f ms (after %d warm-up logs), %.0f %s, final loss %.4f", median(ms), warmup,
              median(ips), items_are_tokens ? "tok/s" : "img/s", final_loss);
  if (val_loss) std::printf(", val loss %.4f", *val_loss);
  if (val_acc) std::printf(", val acc %.2f%%", 100 * *val_acc);
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace shardtrain::train
