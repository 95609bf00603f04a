// The planner's text: the per-strategy table `shardtrain plan` prints, the sharding diagrams and
// the step estimate's assumptions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/plan/settings.h"
#include "shardtrain/plan/strategy_plan.h"

namespace shardtrain::plan {

// One line: what the step estimate assumed (rate and its source, bandwidth, latency, cores).
std::string describe_step_assumptions(const PlanSettings& s);
// The report `shardtrain plan` prints.
std::string format_plan(const PlanSettings& s, const std::vector<StrategyPlan>& plans, int64_t device_bytes);
// One line per alternative (strategy_plan.h's alternatives): what changes, the strategy and peak
// that fit, and with cpu_offload the host memory per rank and per host.
std::string describe_alternatives(const PlanSettings& s, const std::vector<Alternative>& alts, int64_t device_bytes);
// ASCII diagram: which rank holds which slice of which unit (blocks with one layout folded).
std::string sharding_diagram(const PlanSettings& s, const StrategyPlan& p, int width = 48);

}  // namespace shardtrain::plan
