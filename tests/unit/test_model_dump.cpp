// Dumps tiny GPT-2 and Llama models (parameters, tokens, logits) for the Python cross-check
// in tests/python/hf_reference.py, which re-implements the Hugging Face forward passes in
// plain PyTorch. Runs only when SHARDTRAIN_MODEL_DUMP_DIR is set (ctest sets it).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "shardtrain/model/model.h"
#include "test_model_util.h"

namespace shardtrain::model {
namespace {
using namespace shardtrain::model::testing;

// <dir>/<tag>/manifest.txt lists "name dtype dims..." per tensor; each tensor is raw
// little-endian data in <dir>/<tag>/<name>.bin; spec.txt holds the sizes.
void dump(const std::filesystem::path& dir, const std::map<std::string, at::Tensor>& tensors,
          const ModelSpec& s) {
  std::filesystem::create_directories(dir);
  std::ofstream manifest(dir / "manifest.txt");
  for (const auto& [name, tensor] : tensors) {
    at::Tensor t = tensor.detach().contiguous();
    manifest << name << ' ' << (t.scalar_type() == at::kLong ? "int64" : "float32");
    for (int64_t d : t.sizes()) manifest << ' ' << d;
    manifest << '\n';
    std::ofstream out(dir / (name + ".bin"), std::ios::binary);
    out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    ASSERT_TRUE(out.good()) << name;
  }
  std::ofstream spec(dir / "spec.txt");
  spec << "arch " << s.arch << "\nvocab_size " << s.vocab_size << "\nd_model " << s.d_model << "\nn_layers "
       << s.n_layers << "\nn_heads " << s.n_heads << "\nn_kv_heads " << s.n_kv_heads << "\nnorm_eps "
       << s.norm_eps << "\nrope_theta " << s.rope_theta << "\n";
}

void dump_model(const std::string& tag, ModelSpec spec, uint64_t seed) {
  const char* root = std::getenv("SHARDTRAIN_MODEL_DUMP_DIR");
  if (root == nullptr) GTEST_SKIP() << "SHARDTRAIN_MODEL_DUMP_DIR not set";
  auto model = build_model(spec, at::kCPU);
  fill_random(*model, seed, 0.3);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& item : model->named_parameters()) tensors["param." + item.key()] = item.value();
  at::Tensor ids = at::randint(spec.vocab_size, {2, 9}, at::TensorOptions().dtype(at::kLong));
  tensors["ids"] = ids;
  tensors["logits"] = model->forward(ids);
  EXPECT_EQ(tensors["logits"].sizes().vec(), (std::vector<int64_t>{2, 9, spec.vocab_size}));
  dump(std::filesystem::path(root) / tag, tensors, model->spec());
}

TEST(ModelDump, Gpt2ForPythonCrossCheck) {
  ModelSpec s;
  s.arch = "gpt2";
  s.vocab_size = 53;
  s.seq_len = 16;
  s.d_model = 24;
  s.n_layers = 2;
  s.n_heads = 3;
  dump_model("gpt2", s, 31);
}

TEST(ModelDump, LlamaForPythonCrossCheck) {
  ModelSpec s;
  s.arch = "llama";
  s.vocab_size = 47;
  s.seq_len = 16;
  s.d_model = 32;
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.tie_embeddings = false;
  s.norm_eps = 1e-6;
  dump_model("llama", s, 37);
}

}  // namespace
}  // namespace shardtrain::model
