// OuterSync: DiLoCo's outer state and outer step (outer_sync.h).
#include "outer_sync.h"

#include "collectives.h"
#include "shardtrain/optim/outer_sgd.h"
#include "shardtrain/util/error.h"

namespace shardtrain::fsdp {

OuterSync::OuterSync(const ReplicaSync& rs, const std::vector<std::vector<FlatParam*>>& flats_by_unit,
                     comm::Comm* replicate, const c10::Device& comm_device, bool tree)
    : rs_(rs), replicate_(replicate), comm_device_(comm_device), tree_(tree) {
  ST_CHECK(rs.inner_steps >= 1 && rs.fragments >= 1, "diloco: inner_steps and fragments must be >= 1");
  const int units = static_cast<int>(flats_by_unit.size());
  for (int u = 0; u < units; ++u)
    for (FlatParam* fp : flats_by_unit[u]) {
      PerFlat p;
      p.fp = fp;
      p.fragment = fragment_of(u, units, rs.fragments);
      // Every replica starts from the same masters (the init is the same at any world size).
      p.outer = fp->master().clone();
      p.momentum = at::zeros_like(fp->master());
      flats_.push_back(std::move(p));
    }
}

int OuterSync::fragment_of(int unit, int units, int fragments) {
  return static_cast<int>(static_cast<int64_t>(unit) * fragments / units);
}

int64_t OuterSync::offset(int f) const { return static_cast<int64_t>(f) * rs_.inner_steps / rs_.fragments; }

bool OuterSync::due(int f, int64_t step) const { return step >= 1 && (step - offset(f)) % rs_.inner_steps == 0; }

std::vector<int> OuterSync::step(int64_t step, const std::function<void(comm::Work&)>& wait) {
  std::vector<int> synced;
  for (int f = 0; f < rs_.fragments; ++f) {
    if (!due(f, step)) continue;
    outer_step(f, wait);
    synced.push_back(f);
  }
  last_step_ = step;
  return synced;
}

int64_t OuterSync::fragment_syncs() const {
  int64_t n = 0;
  for (int f = 0; f < rs_.fragments; ++f) {
    // Fragment f syncs at offset_f, offset_f + H, ... (fragment 0 first at H).
    const int64_t first = offset(f) > 0 ? offset(f) : rs_.inner_steps;
    if (last_step_ >= first) n += (last_step_ - first) / rs_.inner_steps + 1;
  }
  return n;
}

void OuterSync::outer_step(int f, const std::function<void(comm::Work&)>& wait) {
  std::vector<PerFlat*> mine;
  std::vector<at::Tensor> grads;
  for (PerFlat& p : flats_) {
    if (p.fragment != f) continue;
    mine.push_back(&p);
    // The outer gradient: how far this replica moved away from the outer copy.
    at::Tensor g = at::sub(p.outer, p.fp->master());
    grads.push_back(g.device() == comm_device_ ? g : g.to(comm_device_));
  }
  if (replicate_ && replicate_->size() > 1) {
    const at::ScalarType wire = rs_.outer_dtype == OuterDtype::Bf16 ? at::kBFloat16 : at::kFloat;
    OuterAverage avg = average_outer_gradients(*replicate_, grads, wire, tree_);
    for (auto& w : avg.works) wait(*w);
    avg.finish();
  }
  const optim::OuterSGDConfig cfg{static_cast<float>(rs_.outer_lr), static_cast<float>(rs_.outer_momentum),
                                  rs_.nesterov};
  for (size_t i = 0; i < mine.size(); ++i) {
    PerFlat& p = *mine[i];
    at::Tensor g = grads[i].device() == p.outer.device() ? grads[i] : grads[i].to(p.outer.device());
    at::Tensor& master = p.fp->write_master();  // the next forward re-gathers
    if (p.outer.device().is_cpu()) {
      optim::outer_sgd_step(p.outer.data_ptr<float>(), p.momentum.data_ptr<float>(), g.contiguous().data_ptr<float>(),
                            master.data_ptr<float>(), p.outer.numel(), cfg);
      continue;
    }
    // Device masters: libtorch operations in the kernel's order.
    p.momentum.mul_(cfg.momentum).add_(g);
    const at::Tensor u = cfg.nesterov ? at::add(g, p.momentum, cfg.momentum) : p.momentum;
    p.outer.add_(u, -cfg.lr);
    master.copy_(p.outer);
  }
}

}  // namespace shardtrain::fsdp
