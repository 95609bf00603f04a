// Validator: every train.val_every steps (and at the last step) the mean loss and, for
// classifiers, the accuracy over train.val_batches global batches of the validation split.
#pragma once
#include <c10/core/Device.h>
#include <mpi.h>

#include <cstdint>
#include <optional>

#include "data_source.h"
#include "shardtrain/model/model.h"
#include "shardtrain/train/metrics.h"

namespace shardtrain::train {

// A batch on the compute device (the data sources build them in host memory).
Batch on_device(Batch b, const c10::Device& device);

class Validator {
 public:
  Validator(model::Model& net, const DataSource& data, MetricsLog& log, int64_t every, int64_t batches,
            int micro_batches, int64_t max_steps, c10::Device device, MPI_Comm world)
      : net_(net), data_(data), log_(log), every_(every), batches_(batches), micro_batches_(micro_batches),
        max_steps_(max_steps), device_(device), world_(world) {}
  // Collective when it validates (the decision is the same on every rank).
  void after_step(int64_t step);
  std::optional<double> last_loss() const { return loss_; }
  std::optional<double> last_accuracy() const { return acc_; }

 private:
  model::Model& net_;
  const DataSource& data_;
  MetricsLog& log_;
  int64_t every_, batches_;
  int micro_batches_;
  int64_t max_steps_;
  c10::Device device_;
  MPI_Comm world_;
  std::optional<double> loss_, acc_;
};

}  // namespace shardtrain::train
