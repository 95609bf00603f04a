// Jane Austen's six novels from the Debian package r-cran-janeaustenr, read without R.
#pragma once
#include <string>
#include <vector>

namespace shardtrain::data {

struct TextDocument {
  std::string name;  // e.g. "emma"
  std::string text;  // UTF-8
};

// Reads every character-vector variable of the janeaustenr data index (Rdata.rdx) and joins
// each novel's lines with '\n' (NA lines, if any, become empty lines).
std::vector<TextDocument> read_austen(const std::string& rdx_path);

// Writes <out_dir>/<name>.txt for each novel; returns the documents written.
std::vector<TextDocument> extract_austen(const std::string& rdx_path, const std::string& out_dir);

}  // namespace shardtrain::data
