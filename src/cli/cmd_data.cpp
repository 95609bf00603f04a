// `shardtrain data ...`: extract-austen, prepare, encode, decode, info. The work runs on rank 0
// (these are single-process tools); failures are agreed so every rank exits with one message.
#include <cstdio>

#include "command.h"
#include <algorithm>

#include "shardtrain/data/commands.h"
#include "shardtrain/data/corpus.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/util/choices.h"
#include "shardtrain/util/error.h"

namespace shardtrain::cli {
namespace {

struct DataArgs {
  std::string data_dir;
  std::string out;
  data::PrepareArgs prepare;
  std::string tokenizer = choices::kTokenizers[0], dtype, in, info_dir;
  std::string special_tokens = "match";
};

std::string tokenizer_help() {
  std::string help;
  for (const char* n : choices::kTokenizers) help += std::string(n) + " | ";
  return help + "a model's tokenizer: tokenizer.json, tokenizer.model or the model directory (docs/data.md)";
}
constexpr const char* kSpecialTokensHelp =
    "match: special-token text in the input (\"<|eot_id|>\") is that token (default, as Hugging Face); "
    "text: it is ordinary text";

int run_on_rank0(runtime::Runtime& rt, const std::function<std::string()>& fn) {
  std::string summary;
  runtime::run_agreed(rt.world(), [&] {
    if (rt.rank() == 0) summary = fn();
  });
  if (rt.rank() == 0) std::printf("%s\n", summary.c_str());
  return kExitOk;
}

std::string dir_or_default(const std::string& d) { return d.empty() ? data::default_data_dir() : d; }

void add_data(CLI::App& app, CommandFn& selected) {
  auto args = std::make_shared<DataArgs>();
  auto* data = app.add_subcommand("data", "Data sources, tokenizers and datasets (see docs/data.md)");
  data->require_subcommand(1);
  data->add_option("--data-dir", args->data_dir,
                   "Where scripts/fetch-data put the sources (default $SHARDTRAIN_DATA_DIR or <repo>/.data)");

  auto* ex = data->add_subcommand("extract-austen", "Write the janeaustenr novels as <out>/<name>.txt");
  ex->add_option("--out", args->out, "Output directory (default <data-dir>/austen)");
  ex->callback([args, &selected] {
    selected = [args](runtime::Runtime& rt) {
      return run_on_rank0(rt, [&] { return data::cmd_extract_austen(dir_or_default(args->data_dir), args->out); });
    };
  });

  auto* pr = data->add_subcommand(
      "prepare", "Tokenize a corpus into DIR/{train,val}.bin + meta.json (or MNIST); in parallel under mpirun");
  pr->add_option("--tokenizer", args->prepare.tokenizer, tokenizer_help());
  pr->add_option("--special-tokens", args->special_tokens, kSpecialTokensHelp)->check(CLI::IsMember({"match", "text"}));
  pr->add_option("--source", args->prepare.sources,
                 "austen | mnist | a text or JSONL file (.gz too), a directory of them, or a glob pattern (repeatable)")
      ->required();
  pr->add_option("--out", args->prepare.out_dir, "Output dataset directory")->required();
  auto* vf = pr->add_option("--val-fraction", args->prepare.val_fraction,
                             "Held-out fraction of each document in [0, 1) (default 0.05 for text, 0.2 for mnist)");
  pr->add_option("--text-field", args->prepare.text_field, "JSONL: the field holding a document's text (default text)");
  pr->add_flag("--skip-bad", args->prepare.skip_bad, "JSONL: skip and count malformed lines instead of failing");
  pr->add_option("--chat-format", args->prepare.chat_format,
                 "Instruction data: JSONL rows {prompt, completion} or {messages}, rendered as plain | llama3 | "
                 "llama3.1 | chatml | qwen2 | qwen2.5 | auto (tokenizer_config.json's chat_template), with a loss "
                 "mask: only completion / assistant tokens count (docs/data.md)");
  pr->add_option("--tokenizer-config", args->prepare.tokenizer_config,
                 "--chat-format auto: the model's tokenizer_config.json (default: beside the tokenizer)");
  pr->add_option("--chat-date", args->prepare.chat_date,
                 "Llama 3.2-style templates: the \"Today Date\" to render, e.g. \"26 Jul 2024\"");
  pr->add_option("--threads", args->prepare.threads, "tokenizer threads per rank (default: cores / ranks on the host)");
  pr->add_option("--progress-every", args->prepare.progress_every_s, "seconds between progress lines (0 = none; default 5)");
  pr->callback([args, vf, &selected] {
    args->prepare.val_fraction_given = vf->count() > 0;
    selected = [args](runtime::Runtime& rt) -> int {
      auto a = args->prepare;
      a.data_dir = dir_or_default(args->data_dir);
      a.tokenizer_options.specials_in_text = args->special_tokens == "match";
      const bool mnist = std::find(a.sources.begin(), a.sources.end(), "mnist") != a.sources.end();
      if (mnist) return run_on_rank0(rt, [&] { return data::cmd_prepare(a); });
      // Text corpora: every rank tokenizes its byte ranges (docs/data.md "Bring your own corpus").
      const std::string summary = data::prepare_corpus(a, rt.world(), [&](const std::function<void()>& f) {
        runtime::run_agreed(rt.world(), f);
      });
      if (rt.rank() == 0) std::printf("%s\n", summary.c_str());
      return kExitOk;
    };
  });

  for (bool encode : {true, false}) {
    auto* c = data->add_subcommand(encode ? "encode" : "decode",
                                   encode ? "Text file -> raw little-endian token ids"
                                          : "Raw little-endian token ids -> text file");
    c->add_option("--tokenizer", args->tokenizer, tokenizer_help());
    if (encode)
      c->add_option("--special-tokens", args->special_tokens, kSpecialTokensHelp)->check(CLI::IsMember({"match", "text"}));
    c->add_option("--dtype", args->dtype, "uint16 | uint32 (default: smallest that fits the vocabulary)")
        ->check(CLI::IsMember({"uint16", "uint32"}));
    c->add_option("in", args->in, "Input file")->required();
    c->add_option("out", args->out, "Output file")->required();
    c->callback([args, encode, &selected] {
      selected = [args, encode](runtime::Runtime& rt) {
        return run_on_rank0(rt, [&] {
          auto dir = dir_or_default(args->data_dir);
          data::TokenizerOptions o;
          o.specials_in_text = args->special_tokens == "match";
          return encode ? data::cmd_encode(dir, args->tokenizer, args->in, args->out, args->dtype, o)
                        : data::cmd_decode(dir, args->tokenizer, args->in, args->out, args->dtype);
        });
      };
    });
  }

  auto* info = data->add_subcommand("info", "Validate a prepared dataset and describe it");
  info->add_option("dir", args->info_dir, "Dataset directory")->required();
  info->callback([args, &selected] {
    selected = [args](runtime::Runtime& rt) { return run_on_rank0(rt, [&] { return data::cmd_info(args->info_dir); }); };
  });
}

}  // namespace
ST_REGISTER_COMMAND(data, add_data);

}  // namespace shardtrain::cli
