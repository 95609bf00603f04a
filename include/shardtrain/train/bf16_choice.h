// The bf16 GEMM path chosen at start-up (model/bf16_gemm.h) from fsdp.bf16_gemm: "bf16" or
// "fp32" as set, or "auto": the faster at one reference layer's three products, measured once
// per CPU model (and libtorch version) and cached, the same choice on every rank; libtorch's
// bf16 kernel only where it accumulates in fp32 (checked at every start).
#pragma once
#include <mpi.h>

#include <string>

#include "shardtrain/model/bf16_gemm.h"

namespace shardtrain::train {

struct Bf16GemmChoice {
  model::Bf16Gemm path = model::Bf16Gemm::Native;
  std::string how;                           // "fsdp.bf16_gemm", "measured", "cached in FILE"
  double native_gflops = 0, fp32_gflops = 0;  // the measurement (0 when set by the deck)
  // auto: whether libtorch's bf16 matmul accumulates in fp32 on every rank's CPU
  // (model::bf16_native_accumulates_in_fp32); where it does not, auto takes the fp32 path.
  bool native_exact = true;
  std::string line() const;                   // "# bf16 GEMM: ..." for the log
};

// The fp32 path must beat libtorch's bf16 by this factor to be chosen (a choice that flipped on
// noise would change a run's bits from one start to the next).
inline constexpr double kBf16Fp32Margin = 1.2;

// Collective over `world`; sets model::set_bf16_gemm() and returns the choice. `setting` is
// fsdp.bf16_gemm (auto | bf16 | fp32). Cache: $SHARDTRAIN_CACHE_DIR, else $XDG_CACHE_HOME/shardtrain,
// else $HOME/.cache/shardtrain; file bf16-gemm.tsv (one line per CPU model). A cache that cannot
// be read or written is measured around, with a note.
Bf16GemmChoice choose_bf16_gemm(MPI_Comm world, const std::string& setting);

// The cache key of this process's CPU model and libtorch (tests).
std::string bf16_gemm_cache_key();
std::string bf16_gemm_cache_file();  // "" when no cache folder is known

}  // namespace shardtrain::train
