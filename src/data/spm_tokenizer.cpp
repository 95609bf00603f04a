// SpmTokenizer over libsentencepiece, reached through the shardtrain_spm_shim module. The file
// is read with our size cap and handed to the library as bytes, so a missing, truncated or
// garbage file is one UserError naming it.
#include "shardtrain/data/spm_tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <mutex>

#include "shardtrain/data/paths.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/model_limits.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::data {
namespace {
// The shim's C functions (spm_shim.cpp).
struct Shim {
  void* (*load)(const char*, std::size_t, char*, std::size_t);
  void (*free)(void*);
  int (*piece_size)(const void*);
  int (*bos)(const void*);
  int (*eos)(const void*);
  int (*is_control)(const void*, int);
  const char* (*piece)(const void*, int, std::size_t*);
  int (*piece_to_id)(const void*, const char*, std::size_t);
  int (*encode)(const void*, const char*, std::size_t, void*, char*, std::size_t);
  int (*decode)(const void*, const int*, std::size_t, void*, char*, std::size_t);
};

// Opens the module once.
const Shim& shim() {
  static Shim s{};
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    // Beside the executable (the build tree's bin/), in an install's <libdir>/shardtrain, else
    // where this build put it.
    std::vector<std::string> candidates;
    if (const std::string dir = executable_dir(); !dir.empty()) {
      candidates.push_back(dir + "/shardtrain_spm_shim.so");
      candidates.push_back(dir + "/" SHARDTRAIN_INSTALL_SHIM);
    }
    candidates.push_back(SHARDTRAIN_SPM_SHIM);
    void* h = nullptr;
    for (const auto& c : candidates) {
      if (!file_exists(c)) continue;
      h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (h) break;
      error = dlerror();
    }
    if (!h) {
      if (error.empty()) error = "shardtrain_spm_shim.so not found next to the executable nor at " SHARDTRAIN_SPM_SHIM;
      return;
    }
    auto sym = [&](const char* name) {
      void* p = dlsym(h, name);
      if (!p && error.empty()) error = std::string("shardtrain_spm_shim.so lacks ") + name;
      return p;
    };
    s.load = reinterpret_cast<decltype(s.load)>(sym("st_spm_load"));
    s.free = reinterpret_cast<decltype(s.free)>(sym("st_spm_free"));
    s.piece_size = reinterpret_cast<decltype(s.piece_size)>(sym("st_spm_piece_size"));
    s.bos = reinterpret_cast<decltype(s.bos)>(sym("st_spm_bos"));
    s.eos = reinterpret_cast<decltype(s.eos)>(sym("st_spm_eos"));
    s.is_control = reinterpret_cast<decltype(s.is_control)>(sym("st_spm_is_control"));
    s.piece = reinterpret_cast<decltype(s.piece)>(sym("st_spm_piece"));
    s.piece_to_id = reinterpret_cast<decltype(s.piece_to_id)>(sym("st_spm_piece_to_id"));
    s.encode = reinterpret_cast<decltype(s.encode)>(sym("st_spm_encode"));
    s.decode = reinterpret_cast<decltype(s.decode)>(sym("st_spm_decode"));
  });
  if (!error.empty() || !s.load) throw Error("SentencePiece is unavailable: " + error);
  return s;
}

std::string piece(void* sp, int id) {
  std::size_t len = 0;
  const char* p = shim().piece(sp, id, &len);
  return std::string(p, len);
}
}  // namespace

SpmTokenizer::Model::~Model() {
  if (sp) shim().free(sp);
}

SpmTokenizer::SpmTokenizer(const std::string& model_path, const std::string& config_path, const std::string& name,
                           const TokenizerOptions& options) {
  auto m = std::make_shared<Model>();
  m->path = model_path;
  m->name = name;
  const std::string bytes = read_file(model_path, kMaxAuxFileBytes, "SentencePiece tokenizer.model");
  const Shim& lib = shim();
  char err[512] = "";
  m->sp = lib.load(bytes.data(), bytes.size(), err, sizeof err);
  if (!m->sp) throw UserError("'" + model_path + "' is not a SentencePiece model (truncated or another format): " + err);
  const int n = lib.piece_size(m->sp);
  ST_USER_CHECK(n > 0, "'", model_path, "': the SentencePiece model has no pieces");
  // Control pieces (<s>, </s>, ...) never come out of the model's own encoding; as the
  // Hugging Face tokenizers built from this file do, they are matched in the text.
  std::vector<AddedToken> controls;
  std::int64_t control_bytes = 0;
  for (int id = 0; id < n; ++id)
    if (lib.is_control(m->sp, id)) {
      AddedToken t;
      t.id = id;
      t.content = piece(m->sp, id);
      t.special = true;
      control_bytes += static_cast<std::int64_t>(t.content.size());
      ST_USER_CHECK(control_bytes <= limits::kMaxAddedTokenBytes, "'", model_path, "': the control pieces exceed ",
                    limits::kMaxAddedTokenBytes, " bytes together (the limit for tokens matched in the text)");
      if (!t.content.empty()) controls.push_back(std::move(t));
    }
  m->controls = AddedTokens(std::move(controls), options.specials_in_text);
  m->bos = lib.bos(m->sp);
  m->eos = lib.eos(m->sp);
  bool add_bos = m->bos >= 0, add_eos = false;  // SentencePiece-based Llama/Mistral tokenizers add BOS
  if (!config_path.empty()) {
    std::string text = read_file(config_path, kMaxAuxFileBytes, "tokenizer_config.json");
    nlohmann::json cfg;
    try {
      check_json_depth(text, kMaxJsonDepth, "'" + config_path + "'");
      cfg = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw UserError("'" + config_path + "' is not valid JSON: " + e.what());
    }
    ST_USER_CHECK(cfg.is_object(), "'", config_path, "': expected a JSON object");
    for (const char* k : {"add_bos_token", "add_eos_token"})
      if (cfg.contains(k) && !cfg.at(k).is_null()) {
        ST_USER_CHECK(cfg.at(k).is_boolean(), "'", config_path, "': ", k, ": expected true or false");
        (std::string(k) == "add_bos_token" ? add_bos : add_eos) = cfg.at(k).get<bool>();
      }
    for (const char* k : {"bos_token", "eos_token"}) {
      if (!cfg.contains(k)) continue;
      const auto& v = cfg.at(k);
      std::string t = v.is_string() ? v.get<std::string>()
                      : v.is_object() && v.contains("content") && v.at("content").is_string() ? v.at("content").get<std::string>()
                                                                                            : "";
      if (t.empty()) continue;
      const int id = lib.piece_to_id(m->sp, t.data(), t.size());
      ST_USER_CHECK(id >= 0 && id < n && piece(m->sp, id) == t, "'", config_path, "': ", k, ": '", t,
                    "' is not a piece of '", model_path, "'");
      (std::string(k) == "bos_token" ? m->bos : m->eos) = id;
    }
  }
  ST_USER_CHECK(!add_bos || m->bos >= 0, "'", config_path, "': add_bos_token is true but the model has no BOS");
  ST_USER_CHECK(!add_eos || m->eos >= 0, "'", config_path, "': add_eos_token is true but the model has no EOS");
  if (add_bos) m->prefix.push_back(m->bos);
  if (add_eos) m->suffix.push_back(m->eos);
  m_ = std::move(m);
}

SpmTokenizer::~SpmTokenizer() = default;

std::unique_ptr<Tokenizer> SpmTokenizer::for_thread() const { return std::unique_ptr<Tokenizer>(new SpmTokenizer(m_)); }

std::int64_t SpmTokenizer::vocab_size() const { return shim().piece_size(m_->sp); }

std::int32_t SpmTokenizer::token_id(std::string_view token) const {
  const int id = shim().piece_to_id(m_->sp, token.data(), token.size());
  return id >= 0 && id < vocab_size() && piece(m_->sp, id) == token ? id : -1;
}

std::vector<std::int32_t> SpmTokenizer::encode(std::string_view text) {
  std::vector<std::int32_t> ids;
  encode_append(text, ids);
  return ids;
}

void SpmTokenizer::encode_append(std::string_view text, std::vector<std::int32_t>& out) {
  m_->controls.split(text, [&](std::string_view piece, std::size_t, std::int32_t id) {
    if (id >= 0) {
      out.push_back(id);
      return;
    }
    scratch_.clear();
    char err[512] = "";
    if (!shim().encode(m_->sp, piece.data(), piece.size(), &scratch_, err, sizeof err))
      throw Error("SentencePiece encode failed ('" + m_->path + "'): " + err);
    out.insert(out.end(), scratch_.begin(), scratch_.end());
  });
}

std::string SpmTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  const int n = shim().piece_size(m_->sp);
  std::vector<int> v(ids.begin(), ids.end());
  for (std::size_t i = 0; i < ids.size(); ++i)
    ST_USER_CHECK(ids[i] >= 0 && ids[i] < n, "'", m_->path, "': id ", ids[i], " at position ", i, " is outside [0, ", n, ")");
  std::string text;
  char err[512] = "";
  if (!shim().decode(m_->sp, v.data(), v.size(), &text, err, sizeof err))
    throw UserError("'" + m_->path + "': cannot decode: " + err);
  return text;
}

}  // namespace shardtrain::data
