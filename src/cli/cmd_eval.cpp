// `shardtrain eval DECK`: a checkpoint's loss and perplexity (accuracy for classifiers) over a
// whole split, at any world size, printed and written as JSON.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "command.h"
#include "shardtrain/infer/evaluate.h"
#include "shardtrain/model_io/inference_model.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/file_io.h"

namespace shardtrain::cli {
namespace {

struct EvalArgs {
  DeckArgs deck;
  std::string dataset, split = "val", out;
  int64_t max_windows = 0;
};

int run_eval(runtime::Runtime& rt, const EvalArgs& a) {
  deck::Deck d = load_deck_agreed(a.deck, rt.world());
  if (!d.is_set("run.threads")) {
    // A fixed intra-op thread count makes the loss the same bits at every world size (cores /
    // ranks threads would round some GEMMs differently at 1 rank than at 2).
    DeckArgs pinned = a.deck;
    pinned.overrides.insert(pinned.overrides.begin(), "run.threads=1");
    d = load_deck_agreed(pinned, rt.world());
  }
  std::string path, dataset, out;
  data::PackingOptions packing;
  runtime::run_agreed(rt.world(), [&] {
    ST_USER_CHECK(a.max_windows >= 0, "--max-windows must be >= 0 (0 = the whole split), got ", a.max_windows);
    // auto and never (a demo deck's "start fresh" for training) both mean the run's newest
    // checkpoint here; a path names one.
    const std::string resume = d.get_string("checkpoint.resume");
    const bool newest = resume == "auto" || resume == "never";
    // A base with lora.init_from's adapters needs no checkpoint (model_io::open_inference_model).
    std::error_code ec;
    const bool none = newest && !d.get_string("lora.init_from").empty() &&
                      !std::filesystem::exists(std::filesystem::symlink_status(d.checkpoint_dir() + "/latest", ec));
    if (!none)
      path = model_io::resolve_checkpoint_path(newest ? d.checkpoint_dir() : resume,
                                            newest ? "checkpoint.dir (its newest checkpoint; or --set checkpoint.resume=PATH)"
                                                   : "checkpoint.resume");
    dataset = a.dataset.empty() ? d.get_string("data.dataset") : a.dataset;
    packing = train::packing_from_deck(d, dataset);
    out = a.out.empty() ? d.out_dir() + "/eval.json" : a.out;
  });
  auto m = model_io::open_inference_model(rt.world(), d, path);
  // What was evaluated: the checkpoint, or a base with lora.init_from's adapters.
  if (path.empty()) {
    const std::string base = d.get_string("checkpoint.init_from");
    path = (base.empty() ? "run.seed's base" : base) + " + " + d.get_string("lora.init_from");
  }
  const infer::EvalResult r = infer::evaluate_split(m->net(), dataset, a.split, d.get_int("train.micro_batch"),
                                                    a.max_windows, m->job.device, rt.world(), packing);
  const std::string json = infer::eval_json(r, path, m->state.step);
  runtime::run_agreed(rt.world(), [&] {
    if (rt.rank() != 0) return;
    std::error_code ec;
    const auto parent = std::filesystem::path(out).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    io::write_file_atomic(out, json);
  });
  if (rt.rank() == 0) {
    if (r.accuracy)
      std::printf("eval %s (step %lld) on %s/%s: %lld images, loss %.17g, accuracy %.6f; %d rank%s, %.2f s -> %s\n",
                  path.c_str(), static_cast<long long>(m->state.step), dataset.c_str(), a.split.c_str(),
                  static_cast<long long>(r.items), r.loss, *r.accuracy, rt.size(), rt.size() == 1 ? "" : "s", r.seconds,
                  out.c_str());
    else
      std::printf("eval %s (step %lld) on %s/%s: %lld windows x %lld tokens%s, loss %.17g, perplexity %.6g; %d rank%s, "
                  "%.2f s -> %s\n",
                  path.c_str(), static_cast<long long>(m->state.step), dataset.c_str(), a.split.c_str(),
                  static_cast<long long>(r.items), static_cast<long long>(r.seq_len),
                  // instruction data: only the counted targets (a loss mask) enter the loss
                  r.targets == r.items * r.seq_len ? "" : (" (" + std::to_string(r.targets) + " counted targets)").c_str(),
                  r.loss, r.perplexity, rt.size(), rt.size() == 1 ? "" : "s", r.seconds, out.c_str());
    std::fflush(stdout);
  }
  return kExitOk;
}

void add_eval(CLI::App& app, CommandFn& selected) {
  auto a = std::make_shared<EvalArgs>();
  auto* sub = app.add_subcommand(
      "eval", "Loss and perplexity (accuracy for ViT) of a checkpoint over a whole split (docs/evaluate.md)");
  add_deck_args(sub, a->deck, true);
  sub->add_option("--dataset", a->dataset, "prepared dataset directory (default: data.dataset)");
  sub->add_option("--split", a->split, "val (default) | train")->check(CLI::IsMember({"val", "train"}));
  sub->add_option("--max-windows", a->max_windows, "evaluate only the first N windows (images); 0 = all (default)");
  sub->add_option("--out", a->out, "JSON result file (default <run.out_dir>/eval.json)");
  sub->callback([&selected, a] { selected = [a](runtime::Runtime& rt) { return run_eval(rt, *a); }; });
}

}  // namespace
ST_REGISTER_COMMAND(eval, add_eval);
}  // namespace shardtrain::cli
