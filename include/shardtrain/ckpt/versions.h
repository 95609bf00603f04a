// The software a build is made of, as one line: what `shardtrain --version` and `info` print and
// what every checkpoint records (attribute library_versions, docs/checkpoint-format.md).
#pragma once
#include <string>

namespace shardtrain::ckpt {

// "shardtrain 0.1.0 (git e66817f); libtorch 1.13.0 (CPU); Open MPI v4.1.4; HDF5 1.10.8 (parallel)"
// and, when built with them, "; CUDA 12.4; NCCL 2.21.5". The MPI and HDF5 versions are those of
// the libraries loaded at run time; the others are fixed at build time.
std::string software_versions();

}  // namespace shardtrain::ckpt
