// `shardtrain generate CKPT --prompt TEXT`: text from a trained language model's checkpoint
// (written at any world size), loaded sharded over this job's ranks (one rank works too).
#include <cstdio>
#include <memory>

#include "command.h"
#include "shardtrain/util/timer.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/data/tokenizer.h"
#include "shardtrain/infer/sampling.h"
#include "shardtrain/model_io/inference_model.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::cli {
namespace {

struct GenerateArgs {
  std::string ckpt, prompt, prompt_file, tokenizer, data_dir;
  std::vector<std::string> overrides;
  infer::SamplingOptions sampling;
  int64_t samples = 1;
};

int run_generate(runtime::Runtime& rt, const GenerateArgs& a) {
  std::string path, prompt = a.prompt;
  deck::Deck d = deck::Deck::defaults();
  std::unique_ptr<data::Tokenizer> tok;
  std::vector<int32_t> ids;
  runtime::run_agreed(rt.world(), [&] {
    infer::check_sampling_options(a.sampling, {"--temperature", "--top-k", "--top-p", "--max-new-tokens"});
    ST_USER_CHECK(a.samples >= 1 && a.samples <= 1000, "--samples must be in [1, 1000], got ", a.samples);
    ST_USER_CHECK(a.prompt_file.empty() || a.prompt.empty(), "give --prompt or --prompt-file, not both");
    if (!a.prompt_file.empty()) prompt = read_small_file(a.prompt_file, 16 * kMiB, "--prompt-file");
    path = model_io::resolve_checkpoint_path(a.ckpt, "generate CKPT");
    d = model_io::checkpoint_deck(path, a.overrides);
    ST_USER_CHECK(model::input_kind(train::model_spec_from_deck(d)) == model::InputKind::Tokens, path,
                  ": generate needs a language model (gpt2, llama); this checkpoint holds a ", d.get_string("model.arch"),
                  " (use `shardtrain eval` for classifiers)");
    const std::string name = a.tokenizer.empty() ? d.get_string("data.tokenizer") : a.tokenizer;
    tok = data::make_tokenizer(name, a.data_dir.empty() ? data::default_data_dir() : a.data_dir);
    const int64_t vocab = d.get_int("model.vocab_size");
    ST_USER_CHECK(tok->vocab_size() <= vocab, "the ", name, " tokenizer has ", tok->vocab_size(),
                  " tokens but the checkpoint's model has vocab_size ", vocab,
                  ": pick the tokenizer it was trained with (--tokenizer gpt2 | byte | PATH)");
    // As the model saw text in training: after what the tokenizer's post-processor puts first
    // (Llama's BOS; nothing for gpt2 and byte).
    ids = tok->prefix_ids();
    tok->encode_append(prompt, ids);
    if (ids.empty()) {
      ST_USER_CHECK(tok->eot_id() >= 0, "empty --prompt: the ", name,
                    " tokenizer has no end-of-text token to start from; give some text");
      ids.push_back(tok->eot_id());  // a fresh document
    }
  });
  // Progress on stderr (stdout is the text): a big model takes a while to load and to generate.
  if (rt.rank() == 0) std::fprintf(stderr, "# generate: loading %s on %d rank%s\n", path.c_str(), rt.size(), rt.size() == 1 ? "" : "s");
  Timer load_timer;
  auto m = model_io::open_inference_model(rt.world(), d, path);
  if (rt.rank() == 0) {
    std::fprintf(stderr, "# generate: loaded in %.1f s\n", load_timer.seconds());
    std::fprintf(stderr, "# generate: %s (step %lld, %s), %d rank%s; temperature %g, top-k %lld, top-p %g, seed %llu\n",
                 path.c_str(), static_cast<long long>(m->state.step), d.get_string("model.arch").c_str(), rt.size(),
                 rt.size() == 1 ? "" : "s", a.sampling.temperature, static_cast<long long>(a.sampling.top_k),
                 a.sampling.top_p, static_cast<unsigned long long>(a.sampling.seed));
  }
  for (int64_t s = 0; s < a.samples; ++s) {
    infer::SamplingOptions o = a.sampling;
    o.seed = a.sampling.seed + static_cast<uint64_t>(s);
    Timer gen_timer;
    double last_report = 0;
    auto progress = [&](int64_t n) {  // rank 0: a line every 5 s while it runs
      if (rt.rank() != 0 || gen_timer.seconds() - last_report < 5) return;
      last_report = gen_timer.seconds();
      std::fprintf(stderr, "# generate: %lld of %lld tokens, %.0f s\n", static_cast<long long>(n),
                   static_cast<long long>(o.max_new_tokens), last_report);
    };
    const std::vector<int32_t> out =
        infer::generate_tokens(m->net(), ids, tok->vocab_size(), o, m->job.device, rt.world(), -1, progress);
    if (rt.rank() != 0) continue;
    std::fprintf(stderr, "# generate: %lld tokens in %.2f s\n", static_cast<long long>(out.size() - ids.size()),
                 gen_timer.seconds());
    const std::string text = tok->decode(out);  // ids below the tokenizer's vocabulary (choose_token)
    if (a.samples > 1) std::printf("%s--- sample %lld (seed %llu)\n", s ? "\n" : "", static_cast<long long>(s + 1),
                                   static_cast<unsigned long long>(o.seed));
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
    std::fflush(stdout);
  }
  return kExitOk;
}

void add_generate(CLI::App& app, CommandFn& selected) {
  auto a = std::make_shared<GenerateArgs>();
  auto* sub = app.add_subcommand("generate", "Generate text from a language model's checkpoint (docs/evaluate.md)");
  sub->add_option("CKPT", a->ckpt, "checkpoint file, or a checkpoint directory (its `latest`)")->required();
  sub->add_option("--prompt", a->prompt, "text to continue (\"\" = start a new document)");
  sub->add_option("--prompt-file", a->prompt_file, "read the prompt from a file");
  sub->add_option("--max-new-tokens", a->sampling.max_new_tokens, "tokens to generate (default 100)");
  sub->add_option("--temperature", a->sampling.temperature, "0 = greedy (default 0.8)");
  sub->add_option("--top-k", a->sampling.top_k, "sample among the k most likely tokens; 0 = all (default)");
  sub->add_option("--top-p", a->sampling.top_p, "nucleus sampling: the smallest set reaching probability p (default 1)");
  sub->add_option("--seed", a->sampling.seed, "sampling seed (default 0); sample i uses seed + i");
  sub->add_option("--samples", a->samples, "independent samples to print (default 1)");
  sub->add_option("--tokenizer", a->tokenizer, "gpt2 | byte | tokenizer.json / tokenizer.model / model directory (default: the checkpoint deck's data.tokenizer)");
  sub->add_option("--data-dir", a->data_dir, "where the GPT-2 tokenizer files are (default $SHARDTRAIN_DATA_DIR or <repo>/.data)");
  sub->add_option("--set", a->overrides, "override a key of the checkpoint's deck (run.threads, fsdp.param_dtype, ...)")
      ->type_name("KEY=VALUE");
  sub->callback([&selected, a] { selected = [a](runtime::Runtime& rt) { return run_generate(rt, *a); }; });
}

}  // namespace
ST_REGISTER_COMMAND(generate, add_generate);
}  // namespace shardtrain::cli
