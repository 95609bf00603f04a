// Probe: a few real training steps with a fresh model, engine and optimizer, measured by the
// counting allocator (train/alloc_tracker.h). What `plan --measure` and `maxbatch` run.
#pragma once
#include <mpi.h>

#include <cstdint>

#include "shardtrain/deck/deck.h"
#include "shardtrain/fsdp/options.h"
#include "shardtrain/model/model.h"

namespace shardtrain::probe {

struct ProbeOptions {
  model::ModelSpec spec;            // resolved; usually train::model_spec_from_deck(d)
  fsdp::Strategy strategy = fsdp::Strategy::FullShard;
  int64_t micro_batch = 1;
  int64_t grad_accum = 1;
  int steps = 2;                    // optimizer steps; step_s is the median of those after the first
  int ranks_per_host = 0;           // simulated hosts (0: parallel.simulate_ranks_per_host)
  int64_t memory_limit = 0;         // per rank, tensor bytes + optimizer state; 0 = none
  // Rows apart (plan::Windows::attention_span): each window filled with rows of this many tokens
  // (the last one shorter), the windows the plan's score bound describes; 0 = one sequence per
  // window.
  int64_t attention_span = 0;
};

struct ProbeResult {
  bool fits = true;                 // no rank went above memory_limit
  int64_t peak_bytes = 0;           // max over ranks: peak tensor bytes + optimizer state
  int64_t optim_bytes = 0;          // the optimizer state part (Kokkos / std::vector memory)
  double step_s = 0;                // the median of the steps after the first (the last of 2), each its slowest rank's
  double loss = 0;                  // the last step's mean loss
};

// Collective over world. Builds the mesh, the strategy's communicators, the model on meta,
// the engine (sharded init) and the deck's optimizer, then runs o.steps steps on synthetic
// batches of the model's input shape (token ids, or images and labels), deterministic per
// rank. Memory is measured from before the engine is built, so initialisation counts. The
// memory limit is soft (train/alloc_tracker.h): every rank completes the step and all ranks
// agree on the verdict, so an over-limit probe never leaves a collective half-done. Needs the
// counting allocator installed and Kokkos running (optim::KokkosScope).
ProbeResult run_probe(MPI_Comm world, const deck::Deck& d, const ProbeOptions& o);

// Intra-op threads for probes: run.threads, else cores / ranks on this (real) host. Collective.
int probe_threads(MPI_Comm world, const deck::Deck& d);

}  // namespace shardtrain::probe
