// TextSampler: every train.sample_every steps (and at the last step) a text sample from the
// model being trained, printed to the log and appended to <run.out_dir>/samples.jsonl.
#pragma once
#include <c10/core/Device.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loop_settings.h"
#include "shardtrain/data/tokenizer.h"
#include "shardtrain/model/model.h"
#include "shardtrain/util/file_io.h"

namespace shardtrain::train {

class TextSampler {
 public:
  // Builds the tokenizer (data.tokenizer) when sampling is on: UserError when it is missing or
  // the model is not a language model. resumed_step >= 0 keeps the earlier records up to it.
  TextSampler(const TrainerSettings& s, model::Model& net, c10::Device device, int64_t resumed_step, MPI_Comm world);
  // Collective when it samples (the decision is the same on every rank).
  void after_step(int64_t step);

 private:
  const TrainerSettings& s_;
  model::Model& net_;
  c10::Device device_;
  MPI_Comm world_;
  int rank_ = 0;
  std::unique_ptr<data::Tokenizer> tok_;
  std::vector<int32_t> prompt_ids_;
  io::AppendFile out_;
};

}  // namespace shardtrain::train
