// StepAgreement: a step's two exchanges (step_agreement.h).
#include "step_agreement.h"

#include <cmath>
#include <csignal>
#include <vector>

#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/train/signals.h"
#include "shardtrain/util/error.h"

namespace shardtrain::train {

StepAgreement::StepAgreement(MPI_Comm world, const SaveSchedule& schedule) : world_(world), schedule_(schedule) {}

void StepAgreement::read(const std::function<void()>& read) const { runtime::run_agreed(world_, read, "step.data"); }

double StepAgreement::leaf_loss_sum(const std::vector<double>& mine, const LeafPlan& leaves) const {
  return sum_over_leaves(mine, leaves, world_);
}

StepAgreed StepAgreement::after_backward(double local_loss, double grad_norm) const {
  // The stop signals a rank can hold (install_stop_signal_handlers): counted per signal, so the
  // highest one over the ranks is known from a sum.
  const int sig = stop_signal();
  ST_CHECK(sig == 0 || sig == SIGUSR1 || sig == SIGTERM, "unexpected stop signal ", sig);
  std::vector<double> v = {local_loss, std::isfinite(local_loss) && std::isfinite(grad_norm) ? 0.0 : 1.0,
                           sig == SIGUSR1 ? 1.0 : 0.0, sig == SIGTERM ? 1.0 : 0.0, schedule_.clock_due() ? 1.0 : 0.0};
  runtime::sum(world_, v, "step.agree");
  StepAgreed a;
  a.loss_sum = v[0];
  a.finite = v[1] == 0;
  a.signal = v[3] > 0 ? SIGTERM : v[2] > 0 ? SIGUSR1 : 0;
  a.clock_due = v[4] > 0;
  return a;
}

}  // namespace shardtrain::train
