// Austen novels: each janeaustenr data variable is a character vector, one element per line.
#include "shardtrain/data/austen.h"

#include "shardtrain/data/paths.h"
#include "shardtrain/data/r_lazyload.h"
#include "shardtrain/util/error.h"

namespace shardtrain::data {

std::vector<TextDocument> read_austen(const std::string& rdx_path) {
  ST_USER_CHECK(file_exists(rdx_path), "'", rdx_path,
                "' not found: install the Debian package r-cran-janeaustenr (scripts/fetch-data does)");
  RLazyLoadDb db(rdx_path);
  std::vector<TextDocument> docs;
  for (const std::string& name : db.names()) {
    RValue v = db.fetch(name);
    if (v.type != RValue::Type::String) continue;  // only the novels are character vectors
    TextDocument d{name, {}};
    for (std::size_t i = 0; i < v.strings.size(); ++i) {
      if (i) d.text.push_back('\n');
      if (v.strings[i]) d.text += *v.strings[i];
    }
    d.text.push_back('\n');
    docs.push_back(std::move(d));
  }
  ST_USER_CHECK(!docs.empty(), "'", rdx_path, "' holds no character vectors");
  return docs;
}

std::vector<TextDocument> extract_austen(const std::string& rdx_path, const std::string& out_dir) {
  auto docs = read_austen(rdx_path);
  make_dirs(out_dir);
  for (auto& d : docs) write_file(out_dir + "/" + d.name + ".txt", d.text.data(), d.text.size());
  return docs;
}

}  // namespace shardtrain::data
