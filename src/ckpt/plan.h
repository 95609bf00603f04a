// Plan: which flat elements of each dataset this rank writes, reads and digests.
#pragma once
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/ckpt/flat_boxes.h"
#include "shardtrain/ckpt/snapshot.h"

namespace shardtrain::ckpt {

// A piece of one parameter: elements [lo, hi) of the flattened parameter (slot-relative),
// found at `shard_offset` in this rank's shard buffer.
struct Piece {
  int64_t lo = 0, hi = 0, shard_offset = 0;
  int64_t numel() const { return hi - lo; }
};

// One parameter's dataset and the pieces this rank handles.
struct ParamPlan {
  size_t flat = 0, slot = 0;
  std::string name;
  std::vector<int64_t> shape;
  Piece own;     // this rank's share among replicas (written on save, digested on load)
  Piece shard;   // everything this rank's shard covers (read on load)
};

// Collective over world. Checks that every rank has the same flat layout (names, shapes,
// offsets) and computes, per flat, this rank's share among the ranks that hold the same
// shard: with split, replica k of R takes the k-th R-th of the shard; otherwise the first
// replica takes it all. Padding is never part of a piece.
std::vector<ParamPlan> make_plan(const Snapshot& snap, MPI_Comm world, bool split);

// File-side selection of `p` (boxes OR'ed) on a dataset of `shape`; none when empty.
void select_piece(hid_t file_space, const std::vector<int64_t>& shape, const Piece& p);
// A memory space of p.numel() floats (all selected; or one element, none selected).
hid_t piece_mem_space(const Piece& p);

std::string model_path(const std::string& name);
std::string optim_path(const std::string& state, const std::string& name);

}  // namespace shardtrain::ckpt
