// A C interface to libsentencepiece, built as its own loadable module (shardtrain_spm_shim.so)
// and opened by spm_tokenizer.cpp with RTLD_LOCAL | RTLD_DEEPBIND. Why: Debian's
// libsentencepiece embeds a copy of protobuf-lite and exports its symbols; linked into the
// binary next to libtorch's libprotobuf, the two copies interpose and the process crashes
// while loading. Opened privately, each library keeps its own protobuf.
#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace {
void set_error(char* err, std::size_t cap, const std::string& msg) {
  if (cap == 0) return;
  std::size_t n = std::min(cap - 1, msg.size());
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}
using Spp = sentencepiece::SentencePieceProcessor;
}  // namespace

extern "C" {
__attribute__((visibility("default"))) void* st_spm_load(const char* bytes, std::size_t n, char* err, std::size_t cap) {
  auto* sp = new Spp();
  auto st = sp->LoadFromSerializedProto(std::string_view(bytes, n));
  if (!st.ok()) {
    set_error(err, cap, st.ToString());
    delete sp;
    return nullptr;
  }
  return sp;
}
__attribute__((visibility("default"))) void st_spm_free(void* sp) { delete static_cast<Spp*>(sp); }
__attribute__((visibility("default"))) int st_spm_piece_size(const void* sp) { return static_cast<const Spp*>(sp)->GetPieceSize(); }
__attribute__((visibility("default"))) int st_spm_bos(const void* sp) { return static_cast<const Spp*>(sp)->bos_id(); }
__attribute__((visibility("default"))) int st_spm_eos(const void* sp) { return static_cast<const Spp*>(sp)->eos_id(); }
__attribute__((visibility("default"))) int st_spm_is_control(const void* sp, int id) { return static_cast<const Spp*>(sp)->IsControl(id); }
__attribute__((visibility("default"))) const char* st_spm_piece(const void* sp, int id, std::size_t* len) {
  const std::string& p = static_cast<const Spp*>(sp)->IdToPiece(id);
  *len = p.size();
  return p.data();
}
__attribute__((visibility("default"))) int st_spm_piece_to_id(const void* sp, const char* s, std::size_t n) {
  return static_cast<const Spp*>(sp)->PieceToId(std::string_view(s, n));
}
// Encodes text, appending the ids to *out (a std::vector<int>; one C++ runtime in the process).
__attribute__((visibility("default"))) int st_spm_encode(const void* sp, const char* text, std::size_t n, void* out,
                                                          char* err, std::size_t cap) {
  std::vector<int> ids;
  auto st = static_cast<const Spp*>(sp)->Encode(std::string_view(text, n), &ids);
  if (!st.ok()) {
    set_error(err, cap, st.ToString());
    return 0;
  }
  auto* v = static_cast<std::vector<int>*>(out);
  v->insert(v->end(), ids.begin(), ids.end());
  return 1;
}
// Decodes ids into *out (a std::string).
__attribute__((visibility("default"))) int st_spm_decode(const void* sp, const int* ids, std::size_t n, void* out,
                                                          char* err, std::size_t cap) {
  auto st = static_cast<const Spp*>(sp)->Decode(std::vector<int>(ids, ids + n), static_cast<std::string*>(out));
  if (!st.ok()) {
    set_error(err, cap, st.ToString());
    return 0;
  }
  return 1;
}
}
