// path_escape_reason / path_inside / plain_name_reason: see path_inside.h.
#include "shardtrain/util/path_inside.h"

#include "shardtrain/util/error.h"

namespace shardtrain {
namespace {
std::string control_reason(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f)
      return c == 0 ? "it contains a NUL character" : "it contains a control character (byte " + std::to_string(c) + ")";
  return "";
}
}  // namespace

std::string path_escape_reason(const std::string& rel) {
  if (rel.empty()) return "it is empty";
  if (std::string why = control_reason(rel); !why.empty()) return why;
  if (rel[0] == '/') return "it is an absolute path";
  // Depth below the base after each component; ".." may only climb back what was descended.
  int depth = 0;
  for (size_t pos = 0; pos <= rel.size();) {
    size_t slash = rel.find('/', pos);
    if (slash == std::string::npos) slash = rel.size();
    const std::string part = rel.substr(pos, slash - pos);
    if (part == "..") {
      if (--depth < 0) return "its \"..\" leaves the directory";
    } else if (!part.empty() && part != ".") {
      ++depth;
    }
    pos = slash + 1;
  }
  if (depth == 0) return "it names the directory itself, not something inside it";
  return "";
}

std::string path_inside(const std::string& base, const std::string& rel, const std::string& key,
                        const std::string& base_doc) {
  const std::string why = path_escape_reason(rel);
  if (!why.empty())
    throw UserError(key + " = \"" + rel + "\": " + why + "; it must be a relative path that stays inside " +
                    base_doc + " (docs/security.md)");
  return base.empty() ? rel : base + "/" + rel;
}

std::string plain_name_reason(const std::string& name) {
  if (name.empty()) return "it is empty";
  if (std::string why = control_reason(name); !why.empty()) return why;
  if (name.find('/') != std::string::npos) return "it contains '/' (a path, not a file name in this directory)";
  if (name == "." || name == "..") return "it is \"" + name + "\", not a file name";
  return "";
}

}  // namespace shardtrain
