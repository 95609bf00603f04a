// Tokenizer interface (text <-> token ids) and the factory that builds one by name.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace shardtrain::data {

// Not thread-safe: implementations may cache (one tokenizer per thread; for_thread() makes one).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Another tokenizer with the same vocabulary, for another thread: it shares this one's
  // read-only tables (nothing is read or parsed again) and has its own cache.
  virtual std::unique_ptr<Tokenizer> for_thread() const = 0;
  virtual std::vector<std::int32_t> encode(std::string_view text) = 0;
  // Appends the ids of `text` to `out` (avoids a copy per document).
  virtual void encode_append(std::string_view text, std::vector<std::int32_t>& out) = 0;
  // Throws UserError on an id outside [0, vocab_size()).
  virtual std::string decode(const std::vector<std::int32_t>& ids) const = 0;
  virtual std::int64_t vocab_size() const = 0;
  // "gpt2" or "byte", or the path a model's tokenizer was read from: what make_tokenizer()
  // accepts and meta.json records.
  virtual std::string name() const = 0;
  // The end-of-text id placed between documents, or -1 when the tokenizer has none.
  virtual std::int32_t eot_id() const = 0;

  // Model tokenizers (tokenizer.json, tokenizer.model) have special and added tokens
  // ("<|begin_of_text|>", "<s>", "<|im_start|>"). The id of `token` when it is a single token
  // of this tokenizer (an added token, or an entry of the model's vocabulary), else -1.
  virtual std::int32_t token_id(std::string_view token) const { (void)token; return -1; }
  // What the tokenizer's post-processor puts before and after one sequence when special
  // tokens are added (Hugging Face `add_special_tokens=True`): Llama 2/3 {BOS} and {};
  // GPT-2, Qwen2 and the byte tokenizer nothing. encode() itself never adds them.
  virtual std::vector<std::int32_t> prefix_ids() const { return {}; }
  virtual std::vector<std::int32_t> suffix_ids() const { return {}; }
  // Beginning / end of sequence ids the tokenizer declares, -1 when it declares none.
  virtual std::int32_t bos_id() const { return -1; }
  virtual std::int32_t eos_id() const { return eot_id(); }
};

// How make_tokenizer() reads a model tokenizer.
struct TokenizerOptions {
  // true (the Hugging Face libraries' default): a special token's text inside the input
  // ("<|eot_id|>") is read as that token. false: it is ordinary text, tokenized as such.
  bool specials_in_text = true;
};

// "byte": ids are the bytes, vocab 256, needs no files.
// "gpt2": reads <data_dir>/gpt2/encoder.json and vocab.bpe (see gpt2_files_dir()).
// Unknown names and missing files are UserErrors naming what was expected.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& data_dir,
                                          const TokenizerOptions& options = {});

}  // namespace shardtrain::data
