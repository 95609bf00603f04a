// R unserialize() for the XDR format, enough for data packages. Layout of each item: an int of
// flags (type in the low byte; bit 8 object, bit 9 attributes, bit 10 tag; levels above bit 12),
// then type-specific content (see R's src/main/serialize.c).
#include "shardtrain/data/r_serialize.h"

#include <cstring>

#include "shardtrain/util/error.h"

namespace shardtrain::data {
namespace {

enum : int {
  NILSXP = 0, SYMSXP = 1, LISTSXP = 2, CLOSXP = 3, ENVSXP = 4, PROMSXP = 5, LANGSXP = 6,
  CHARSXP = 9, LGLSXP = 10, INTSXP = 13, REALSXP = 14, CPLXSXP = 15, STRSXP = 16, DOTSXP = 17,
  VECSXP = 19, EXPRSXP = 20, BCODESXP = 21, EXTPTRSXP = 22, WEAKREFSXP = 23, RAWSXP = 24, S4SXP = 25,
  ALTREP_SXP = 238, EMPTYENV_SXP = 242, BASEENV_SXP = 241, REFSXP = 255, NILVALUE_SXP = 254,
  GLOBALENV_SXP = 253, UNBOUNDVALUE_SXP = 252, MISSINGARG_SXP = 251, BASENAMESPACE_SXP = 250,
};
constexpr int kIsObject = 1 << 8, kHasAttr = 1 << 9, kHasTag = 1 << 10;
constexpr int kLatin1Mask = 1 << 2;

class Reader {
 public:
  Reader(std::string_view d, const std::string& where) : d_(d), where_(where) {}

  RValue parse() {
    need(2);
    fail_unless(d_.substr(0, 2) == "X\n", "not an R XDR serialization (expected 'X\\n' header)");
    pos_ = 2;
    int version = read_int();
    read_int();  // writer R version
    read_int();  // minimal reader version
    fail_unless(version == 2 || version == 3, "unsupported serialization version ", version);
    if (version == 3) {
      int n = read_int();
      fail_unless(n >= 0 && n < 256, "bad native-encoding length ", n);
      need(n);
      pos_ += n;
    }
    return read_item();
  }

 private:
  template <typename... Args>
  void fail_unless(bool ok, Args&&... args) {
    if (!ok)
      throw UserError(detail::concat(where_, ": R serialization byte ", pos_, ": ", std::forward<Args>(args)...));
  }
  void need(std::size_t n) {
    fail_unless(pos_ + n <= d_.size(), "truncated (needs ", n, " more bytes, ", d_.size() - pos_, " left)");
  }
  std::uint32_t read_u32() {
    need(4);
    const auto* p = reinterpret_cast<const unsigned char*>(d_.data() + pos_);
    pos_ += 4;
    return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) | p[3];
  }
  int read_int() { return static_cast<std::int32_t>(read_u32()); }
  double read_double() {
    std::uint64_t hi = read_u32(), lo = read_u32();
    std::uint64_t bits = (hi << 32) | lo;
    double v;
    std::memcpy(&v, &bits, 8);
    return v;
  }
  std::size_t read_length() {
    int n = read_int();
    if (n == -1) {  // long vector: two more ints
      std::uint64_t hi = read_u32(), lo = read_u32();
      std::uint64_t len = (hi << 32) | lo;
      fail_unless(len <= d_.size(), "implausible long-vector length ", len);
      return static_cast<std::size_t>(len);
    }
    fail_unless(n >= 0, "negative vector length ", n);
    return static_cast<std::size_t>(n);
  }

  // CHARSXP content after the flags; nullopt for NA_STRING.
  std::optional<std::string> read_charsxp(int flags) {
    int n = read_int();
    if (n == -1) return std::nullopt;
    fail_unless(n >= 0, "bad string length ", n);
    need(static_cast<std::size_t>(n));
    std::string s(d_.substr(pos_, n));
    pos_ += n;
    if ((flags >> 12) & kLatin1Mask) {  // convert Latin-1 to UTF-8
      std::string u;
      for (unsigned char c : s) {
        if (c < 0x80) u.push_back(static_cast<char>(c));
        else { u.push_back(static_cast<char>(0xC0 | (c >> 6))); u.push_back(static_cast<char>(0x80 | (c & 0x3F))); }
      }
      s.swap(u);
    }
    return s;
  }

  std::string read_symbol_name() {
    int flags = read_int();
    fail_unless((flags & 0xFF) == CHARSXP, "a symbol's name is not a CHARSXP (type ", flags & 0xFF, ")");
    auto s = read_charsxp(flags);
    fail_unless(s.has_value(), "a symbol's name is NA");
    return *s;
  }

  void read_attributes(RValue& v) {
    RValue attrs = read_item();
    fail_unless(attrs.type == RValue::Type::Pairlist, "attributes are not a pairlist but ", attrs.type_name());
    for (std::size_t i = 0; i < attrs.elements.size(); ++i)
      v.attributes.emplace_back(attrs.tags[i], std::move(attrs.elements[i]));
  }

  // LISTSXP chain, iteratively along the CDR; `flags` are those of the first node.
  RValue read_pairlist(int flags) {
    RValue v;
    v.type = RValue::Type::Pairlist;
    RValue node_attrs;
    for (;;) {
      if (flags & kHasAttr) read_attributes(node_attrs);  // node attributes: not kept
      std::string tag;
      if (flags & kHasTag) {
        RValue t = read_item();
        fail_unless(t.type == RValue::Type::Symbol, "pairlist tag is not a symbol");
        tag = t.symbol;
      }
      v.tags.push_back(tag);
      v.elements.push_back(read_item());
      flags = read_int();
      int type = flags & 0xFF;
      if (type == NILVALUE_SXP) break;
      fail_unless(type == LISTSXP, "pairlist tail of type ", type, " is not supported");
    }
    return v;
  }

  RValue read_altrep() {
    RValue info = read_item();
    fail_unless(info.type == RValue::Type::Pairlist && !info.elements.empty() &&
                    info.elements[0].type == RValue::Type::Symbol,
                "ALTREP class information is malformed");
    std::string cls = info.elements[0].symbol;
    RValue state = read_item();
    RValue attr = read_item();
    RValue v;
    if ((cls == "compact_intseq" || cls == "compact_realseq") && state.type == RValue::Type::Real &&
        state.reals.size() == 3) {
      // state = (length, first, step)
      auto n = static_cast<std::size_t>(state.reals[0]);
      fail_unless(n <= d_.size() * 64 + 1'000'000, "implausible compact sequence length ", n);
      if (cls == "compact_intseq") {
        v.type = RValue::Type::Integer;
        for (std::size_t i = 0; i < n; ++i) v.ints.push_back(static_cast<std::int32_t>(state.reals[1] + i * state.reals[2]));
      } else {
        v.type = RValue::Type::Real;
        for (std::size_t i = 0; i < n; ++i) v.reals.push_back(state.reals[1] + i * state.reals[2]);
      }
    } else if (cls.rfind("wrap_", 0) == 0 && state.type == RValue::Type::List && !state.elements.empty()) {
      v = std::move(state.elements[0]);  // wrapper: (payload, metadata)
    } else {
      fail_unless(false, "ALTREP class '", cls, "' is not supported");
    }
    if (attr.type == RValue::Type::Pairlist)
      for (std::size_t i = 0; i < attr.elements.size(); ++i) v.attributes.emplace_back(attr.tags[i], attr.elements[i]);
    return v;
  }

  RValue read_item() {
    fail_unless(++depth_ < 10000, "nesting too deep");
    struct Leave { int& d; ~Leave() { --d; } } leave{depth_};
    int flags = read_int();
    int type = flags & 0xFF;
    RValue v;
    switch (type) {
      case NILVALUE_SXP:
      case NILSXP:
        return v;
      case REFSXP: {
        int idx = flags >> 8;
        if (idx == 0) idx = read_int();
        fail_unless(idx >= 1 && static_cast<std::size_t>(idx) <= refs_.size(), "reference ", idx,
                    " to an object not yet read (", refs_.size(), " known)");
        return refs_[idx - 1];
      }
      case SYMSXP:
        v.type = RValue::Type::Symbol;
        v.symbol = read_symbol_name();
        refs_.push_back(v);
        return v;
      case LISTSXP:
        return read_pairlist(flags);
      case ALTREP_SXP:
        return read_altrep();
      case LGLSXP:
      case INTSXP: {
        v.type = type == LGLSXP ? RValue::Type::Logical : RValue::Type::Integer;
        std::size_t n = read_length();
        need(4 * n);
        v.ints.resize(n);
        for (auto& x : v.ints) x = read_int();
        break;
      }
      case REALSXP: {
        v.type = RValue::Type::Real;
        std::size_t n = read_length();
        need(8 * n);
        v.reals.resize(n);
        for (auto& x : v.reals) x = read_double();
        break;
      }
      case STRSXP: {
        v.type = RValue::Type::String;
        std::size_t n = read_length();
        need(8 * n);  // at least flags + length per element
        v.strings.reserve(n);
        for (std::size_t i = 0; i < n; ++i) {
          int f = read_int();
          fail_unless((f & 0xFF) == CHARSXP, "element ", i, " of a character vector has type ", f & 0xFF);
          v.strings.push_back(read_charsxp(f));
        }
        break;
      }
      case VECSXP:
      case EXPRSXP: {
        v.type = RValue::Type::List;
        std::size_t n = read_length();
        need(4 * n);
        v.elements.reserve(n);
        for (std::size_t i = 0; i < n; ++i) v.elements.push_back(read_item());
        break;
      }
      case RAWSXP: {
        v.type = RValue::Type::Raw;
        std::size_t n = read_length();
        need(n);
        v.bytes.emplace_back(d_.substr(pos_, n));
        pos_ += n;
        break;
      }
      case CHARSXP: {
        // A bare CHARSXP (only inside symbols and strings normally): read as a 1-string vector.
        v.type = RValue::Type::String;
        v.strings.push_back(read_charsxp(flags));
        return v;
      }
      case GLOBALENV_SXP: case EMPTYENV_SXP: case BASEENV_SXP: case UNBOUNDVALUE_SXP:
      case MISSINGARG_SXP: case BASENAMESPACE_SXP:
        fail_unless(false, "environment or special value (type ", type, ") is not data");
        break;
      default:
        fail_unless(false, "R object type ", type,
                    " (closure, environment, language, bytecode or other non-data) is not supported");
    }
    (void)kIsObject;
    if (flags & kHasAttr) read_attributes(v);
    return v;
  }

  std::string_view d_;
  const std::string& where_;
  std::size_t pos_ = 0;
  int depth_ = 0;
  std::vector<RValue> refs_;
};
}  // namespace

const RValue* RValue::attribute(const std::string& name) const {
  for (auto& [k, v] : attributes)
    if (k == name) return &v;
  return nullptr;
}

const RValue* RValue::element(const std::string& name) const {
  const RValue* names = attribute("names");
  if (!names || names->type != Type::String) return nullptr;
  for (std::size_t i = 0; i < names->strings.size() && i < elements.size(); ++i)
    if (names->strings[i] && *names->strings[i] == name) return &elements[i];
  return nullptr;
}

std::size_t RValue::length() const {
  switch (type) {
    case Type::Null: return 0;
    case Type::Symbol: return 1;
    case Type::Logical: case Type::Integer: return ints.size();
    case Type::Real: return reals.size();
    case Type::String: return strings.size();
    case Type::Raw: return bytes.empty() ? 0 : bytes[0].size();
    case Type::List: case Type::Pairlist: return elements.size();
  }
  return 0;
}

const char* RValue::type_name() const {
  switch (type) {
    case Type::Null: return "NULL";
    case Type::Symbol: return "symbol";
    case Type::Pairlist: return "pairlist";
    case Type::Logical: return "logical";
    case Type::Integer: return "integer";
    case Type::Real: return "double";
    case Type::String: return "character";
    case Type::List: return "list";
    case Type::Raw: return "raw";
  }
  return "?";
}

RValue parse_r_serialized(std::string_view data, const std::string& where) {
  return Reader(data, where).parse();
}

}  // namespace shardtrain::data
