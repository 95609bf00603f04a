// SpmTokenizer: a SentencePiece tokenizer.model (Llama 2, Mistral, Gemma ...) through the
// SentencePiece library (opened privately through the shardtrain_spm_shim module, see
// spm_shim.cpp), with the model's control pieces ("<s>", "</s>") read as tokens when they
// appear in the text (TokenizerOptions::specials_in_text).
#pragma once
#include <memory>
#include <string>
#include <unordered_map>

#include "shardtrain/data/added_tokens.h"
#include "shardtrain/data/tokenizer.h"

namespace shardtrain::data {

class SpmTokenizer final : public Tokenizer {
 public:
  // model_path: the .model file; config_path: tokenizer_config.json next to it or "" (its
  // add_bos_token / add_eos_token / bos_token / eos_token); name: what name() returns.
  SpmTokenizer(const std::string& model_path, const std::string& config_path, const std::string& name,
               const TokenizerOptions& options);
  ~SpmTokenizer() override;

  std::unique_ptr<Tokenizer> for_thread() const override;
  std::vector<std::int32_t> encode(std::string_view text) override;
  void encode_append(std::string_view text, std::vector<std::int32_t>& out) override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override;
  std::string name() const override { return m_->name; }
  std::int32_t eot_id() const override { return m_->eos; }
  std::int32_t token_id(std::string_view token) const override;
  std::vector<std::int32_t> prefix_ids() const override { return m_->prefix; }
  std::vector<std::int32_t> suffix_ids() const override { return m_->suffix; }
  std::int32_t bos_id() const override { return m_->bos; }
  std::int32_t eos_id() const override { return m_->eos; }

 private:
  struct Model {
    ~Model();
    std::string path, name;
    void* sp = nullptr;  // the library's processor (Encode/Decode are const: shared by threads)
    AddedTokens controls;
    std::int32_t bos = -1, eos = -1;
    std::vector<std::int32_t> prefix, suffix;
  };
  explicit SpmTokenizer(std::shared_ptr<const Model> m) : m_(std::move(m)) {}
  std::shared_ptr<const Model> m_;
  std::vector<int> scratch_;
};

}  // namespace shardtrain::data
