// TextSampler: the sampling schedule, the generation (infer/sampling.h) and the records.
#include "text_sampler.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardtrain/data/paths.h"
#include "shardtrain/infer/sampling.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::train {

TextSampler::TextSampler(const TrainerSettings& s, model::Model& net, c10::Device device, int64_t resumed_step,
                         MPI_Comm world)
    : s_(s), net_(net), device_(device), world_(world) {
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank_));
  if (s.sample_every <= 0) return;
  runtime::run_agreed(world, [&] {
    ST_USER_CHECK(model::input_kind(net.spec()) == model::InputKind::Tokens,
                  "train.sample_every = ", s.sample_every, ": text samples need a language model (gpt2, llama), not ",
                  net.spec().arch, "; set train.sample_every = 0");
    tok_ = data::make_tokenizer(s.tokenizer, data::default_data_dir());
    ST_USER_CHECK(tok_->vocab_size() <= net.spec().vocab_size, "train.sample_every: the ", s.tokenizer,
                  " tokenizer (data.tokenizer) has ", tok_->vocab_size(), " tokens, more than model.vocab_size ",
                  net.spec().vocab_size);
    // What the tokenizer's post-processor puts first (Llama's BOS; nothing for gpt2, byte).
    prompt_ids_ = tok_->prefix_ids();
    tok_->encode_append(s.sample_prompt, prompt_ids_);
    if (prompt_ids_.empty()) {
      if (tok_->eot_id() >= 0) prompt_ids_.push_back(tok_->eot_id());
      else prompt_ids_ = tok_->encode("\n");
    }
    if (rank_ != 0) return;
    const std::string path = s.out_dir + "/samples.jsonl";
    if (resumed_step >= 0) {  // keep the records up to the checkpoint, as the metrics do
      std::ifstream in(path);
      std::ostringstream kept;
      for (std::string line; std::getline(in, line);) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_discarded() && j.contains("step") && j["step"].is_number_integer() &&
            j["step"].get<int64_t>() <= resumed_step)
          kept << line << "\n";
      }
      out_.open(path, true);
      if (!kept.str().empty()) out_.append(kept.str());
    } else {
      out_.open(path, true);
    }
  });
}

void TextSampler::after_step(int64_t step) {
  if (s_.sample_every <= 0 || !(step % s_.sample_every == 0 || step == s_.max_steps)) return;
  infer::SamplingOptions o;
  o.temperature = s_.sample_temperature;
  o.top_k = s_.sample_top_k;
  o.max_new_tokens = s_.sample_tokens;
  o.seed = s_.seed + static_cast<uint64_t>(step);
  const std::vector<int32_t> out = infer::generate_tokens(net_, prompt_ids_, tok_->vocab_size(), o, device_, world_);
  runtime::run_agreed(world_, [&] {
    if (rank_ != 0) return;
    const std::vector<int32_t> fresh(out.begin() + static_cast<std::ptrdiff_t>(prompt_ids_.size()), out.end());
    const std::string text = tok_->decode(fresh);
    std::printf("sample    %lld | %s%s\n", static_cast<long long>(step), s_.sample_prompt.c_str(), text.c_str());
    std::fflush(stdout);
    nlohmann::json j;
    j["step"] = step;
    j["prompt"] = s_.sample_prompt;
    j["text"] = text;
    j["seed"] = o.seed;
    out_.append(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  });
}

}  // namespace shardtrain::train
