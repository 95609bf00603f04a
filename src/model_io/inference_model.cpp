// open_inference_model / checkpoint_deck / resolve_checkpoint_path: a checkpoint's model for
// `eval` and `generate`.
#include "shardtrain/model_io/inference_model.h"

#include <sys/stat.h>

#include <filesystem>
#include <set>
#include <sstream>

#include "shardtrain/ckpt/tools.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/model.h"
#include "shardtrain/model_io/import.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/train/adapter_base.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/path_inside.h"
#include "shardtrain/util/small_file.h"
#include "spec_from_json.h"

namespace shardtrain::model_io {

std::string resolve_checkpoint_path(const std::string& p, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  ST_USER_CHECK(!p.empty(), what, ": no checkpoint given");
  if (fs::is_directory(p, ec)) {
    const std::string latest = p + "/latest";
    ST_USER_CHECK(fs::exists(fs::symlink_status(latest, ec)), what, " = '", p,
                  "' is a directory without a 'latest' file: name a ",
                  "checkpoint file (step_NNNNNNNN.h5) in it, or a checkpoint directory a run wrote");
    std::string name = read_small_file(latest, 4096, "checkpoint 'latest' file");
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    ST_USER_CHECK(!name.empty(), what, ": '", latest, "' is empty");
    // `latest` names a file next to it, nothing else (docs/security.md): a directory from
    // someone else cannot send the reader to an absolute or ../ path.
    const std::string why = plain_name_reason(name);
    ST_USER_CHECK(why.empty(), what, ": '", latest, "' must name a checkpoint file in ", p, " (a plain file name), but ",
                  why);
    const std::string file = p + "/" + name;
    struct stat st {};
    ST_USER_CHECK(::lstat(file.c_str(), &st) == 0, what, ": '", latest, "' names '", file, "', which does not exist");
    ST_USER_CHECK(S_ISREG(st.st_mode), what, ": '", latest, "' names '", file,
                  "', which is not a regular file (a symbolic link, directory or device is not followed)");
    return file;
  }
  ST_USER_CHECK(fs::is_regular_file(p, ec), what, " = '", p, "': no such checkpoint file or directory");
  return p;
}

namespace {
// A resolved deck with its [lora] keys that were defaults left out (resolved_toml marks them
// "(default)"): a base checkpoint read with --set lora.init_from=DIR lets the adapter's
// adapter_config.json fill them, as a deck that never named them would.
std::string without_lora_defaults(const std::string& text) {
  std::istringstream in(text);
  std::string line, out, section;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '[') section = line.substr(1, line.find(']') - 1);
    const bool dflt = line.size() >= 9 && line.compare(line.size() - 9, 9, "(default)") == 0;
    if (!(section == "lora" && dflt)) out += line + "\n";
  }
  return out;
}
}  // namespace

deck::Deck checkpoint_deck(const std::string& ckpt_path, const std::vector<std::string>& overrides) {
  const ckpt::CheckpointMeta meta = ckpt::read_checkpoint_meta(ckpt_path);
  ST_USER_CHECK(!meta.deck_text.empty(), ckpt_path, ": the checkpoint records no deck (deck_text attribute)");
  // Where and how the training job ran, not what it trained: back to the defaults.
  std::vector<std::string> o;
  for (const char* key : {"parallel.strategy", "parallel.shard_group_size", "parallel.simulate_ranks_per_host",
                          "fsdp.cpu_offload", "fsdp.activation_checkpointing", "run.threads", "run.device",
                          "comm.backend", "optimizer.host_threads"}) {
    const deck::KeySpec* k = deck::find_key(key);
    ST_CHECK(k != nullptr, "unknown deck key ", key);
    std::string v;
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::string>) v = "\"" + x + "\"";
          else if constexpr (std::is_same_v<T, bool>) v = x ? "true" : "false";
          else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>) v = std::to_string(x);
        },
        k->default_value);
    o.push_back(std::string(key) + "=" + v);
  }
  // One intra-op thread per rank unless overridden: at a fixed thread count the forwards give the
  // same bits at every world size (with cores / ranks threads, some GEMMs round differently).
  o.push_back("run.threads=1");
  // A model read from a Hugging Face directory (model.from_hf, or init_from naming one) is
  // rebuilt from the spec the checkpoint recorded, not from that directory again: the checkpoint
  // stays usable when the download has moved, and a changed config.json cannot change it.
  // An adapter checkpoint (LoRA) holds no base: its init_from stays, to load the base from.
  const deck::Deck as_trained = deck::Deck::parse(meta.deck_text, ckpt_path + " (its resolved deck)", {});
  if (!as_trained.get_string("model.from_hf").empty() || !as_trained.get_string("checkpoint.init_from").empty()) {
    const auto recorded = spec_overrides(model_spec_from_json(meta.model_spec_json, "checkpoint " + ckpt_path));
    o.push_back("model.from_hf=\"\"");
    if (meta.base_json.empty()) o.push_back("checkpoint.init_from=\"\"");
    o.insert(o.end(), recorded.begin(), recorded.end());
  }
  // An adapter checkpoint: its [lora] as recorded (lora.init_from's filled keys included).
  if (!meta.base_json.empty()) {
    const auto ft = finetune_overrides(model_spec_from_json(meta.model_spec_json, "checkpoint " + ckpt_path));
    o.insert(o.end(), ft.begin(), ft.end());
  }
  o.insert(o.end(), overrides.begin(), overrides.end());
  return deck::Deck::parse(without_lora_defaults(meta.deck_text), ckpt_path + " (its resolved deck)", o);
}

std::unique_ptr<InferenceModel> open_inference_model(MPI_Comm world, const deck::Deck& d, const std::string& ckpt_path) {
  int rank = 0;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  // Not a checkpoint at all, or one whose recorded model does not match its datasets (a
  // crafted deck claiming a model far larger than the file): one UserError before anything is
  // allocated or read collectively (the load checks the rest, digests included).
  runtime::run_agreed(world, [&] {
    if (rank != 0 || ckpt_path.empty()) return;
    const ckpt::CheckpointMeta meta = ckpt::read_checkpoint_meta(ckpt_path);
    model::ModelSpec spec = train::model_spec_from_deck(d);
    // A whole model's checkpoint as the base of an adapter model holds the base's parameters.
    if (meta.base_json.empty()) spec.finetune = model::Finetune{};
    ckpt::check_model_datasets(ckpt_path, expected_tensors(spec));
  });
  auto m = std::make_unique<InferenceModel>();
  m->path = ckpt_path;
  m->job = train::open_sharded_job(world, d);
  fsdp::OptimizerConfig opt_cfg;
  runtime::run_agreed(world, [&] { opt_cfg = train::optimizer_config_from_deck(d); });
  // Every value is read from the file; the init only has to be cheap. An adapter checkpoint's
  // base is not in it: loaded first (checkpoint.init_from, or run.seed's init) and compared.
  const bool adapter = train::is_adapter_run(m->job.spec);
  fsdp::InitFn zeros = [](const std::string&, at::Tensor& t) { t.zero_(); };
  uint64_t seed = 0;
  if (adapter) runtime::run_agreed(world, [&] { seed = static_cast<uint64_t>(d.get_int("run.seed")); });
  m->engine = std::make_unique<fsdp::Engine>(*m->job.net, m->job.comms.engine(), m->job.engine_options,
                                             adapter ? train::seeded_init(*m->job.net, seed) : zeros);
  m->optimizer = std::make_unique<fsdp::ShardedOptimizer>(*m->engine, opt_cfg);
  std::string recorded, adapters;
  runtime::run_agreed(world, [&] {
    if (!ckpt_path.empty()) recorded = ckpt::read_checkpoint_meta(ckpt_path).base_json;
    adapters = d.get_string("lora.init_from");
    ST_USER_CHECK(adapter || recorded.empty(), ckpt_path, " holds a LoRA adapter, but the deck it is read with has lora.rank = 0");
    ST_USER_CHECK(!adapter || !recorded.empty() || !adapters.empty(), ckpt_path.empty() ? "no checkpoint" : ckpt_path,
                  ": the deck has lora.rank > 0 but no adapters to read: give an adapter checkpoint, or the adapters "
                  "with --set lora.init_from=DIR");
  });
  if (!adapter) {
    ckpt::load_checkpoint(ckpt_path, *m->engine, *m->optimizer, m->state, world);
  } else if (!recorded.empty()) {  // an adapter checkpoint on its base
    const ckpt::BaseIdentity base = train::load_adapter_base(d, *m->engine, world, /*verbose=*/false);
    runtime::run_agreed(world, [&] { train::check_adapter_base(ckpt_path, recorded, base, "use"); });
    ckpt::load_checkpoint(ckpt_path, *m->engine, *m->optimizer, m->state, world);
  } else {  // a base (a whole model's checkpoint, or the deck's init_from) plus lora.init_from's adapters
    if (ckpt_path.empty()) {
      train::load_adapter_base(d, *m->engine, world, /*verbose=*/false);
    } else {
      ckpt::load_model_parameters(ckpt_path, *m->engine, world, [](const std::string& n) { return !model::is_lora_param(n); });
      runtime::run_agreed(world, [&] { m->state = ckpt::read_train_state(ckpt_path); });
    }
    train::load_peft_adapter(adapters, *m->engine, world, /*verbose=*/false);
  }
  return m;
}

}  // namespace shardtrain::model_io
