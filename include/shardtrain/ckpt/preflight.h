// Start-up checks of the directories a run writes to, before any training (docs/checkpoints.md).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>

#include "shardtrain/ckpt/checkpoint.h"

namespace shardtrain::ckpt {

// Upper estimate of a checkpoint file's size: the datasets' bytes plus HDF5's own
// metadata (object headers, digest attributes, links, the root's attributes with
// `text_bytes` of deck / model spec). What a save reserves and what the preflight asks for.
int64_t estimated_file_bytes(int64_t data_bytes, int64_t datasets, int64_t text_bytes);
// The same for the engine's layout and the checkpoint's descriptive metadata.
int64_t estimated_checkpoint_bytes(fsdp::Engine& engine, fsdp::ShardedOptimizer& opt, const CheckpointInfo& info);

// UserError (exit 2) unless this process can create, write and remove a file in `dir`
// (a probe file; permission bits say nothing for root or on read-only mounts). `what`
// names the setting in the message, e.g. "checkpoint.dir".
void check_writable_dir(const std::string& dir, const std::string& what);

// Collective over world, before the first training step. UserError (exit 2) on every rank
// naming the directory and the reason when
//  - checkpoint_dir is not writable (probed once per host: each node mounts it itself),
//  - checkpoint_dir/latest (or latest.tmp) exists and is not a regular file,
//  - the file system reports less free space than one checkpoint (estimated_checkpoint_bytes)
//    plus a margin of 10% + 64 KiB (skipped where statvfs reports no size).
void preflight(const std::string& checkpoint_dir, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt,
               const CheckpointInfo& info, MPI_Comm world);

}  // namespace shardtrain::ckpt
