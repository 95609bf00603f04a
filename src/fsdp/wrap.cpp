// Wrap policy and flat layout (see wrap.h): the one place that decides units, flats, padding,
// aliasing and the ignored group.
#include "shardtrain/fsdp/wrap.h"

#include <algorithm>
#include <set>
#include <unordered_map>

#include "shardtrain/fsdp/forward_hook.h"
#include "shardtrain/util/names.h"

namespace shardtrain::fsdp {

int64_t padded_numel(int64_t numel, int S) { return std::max<int64_t>(S, (numel + S - 1) / S * S); }

bool aliases_master(int shard_size, at::ScalarType dtype, bool offloaded, bool frozen, bool nf4) {
  return !nf4 && shard_size == 1 && (dtype == at::kFloat || frozen) && !offloaded;
}

int64_t UnitPlan::numel() const {
  int64_t n = 0;
  for (const auto& f : flats) n += f.numel;
  return n;
}

int UnitPlan::num_params() const {
  int n = 0;
  for (const auto& f : flats) n += static_cast<int>(f.params.size());
  return n;
}

int UnitPlan::num_trainable_params() const {
  int n = 0;
  for (const auto& f : flats)
    if (!f.frozen) n += static_cast<int>(f.params.size());
  return n;
}

bool UnitPlan::has_frozen() const {
  return std::any_of(flats.begin(), flats.end(), [](const FlatPlan& f) { return f.frozen; });
}

ModuleTree module_tree(torch::nn::Module& root) {
  ModuleTree t;
  // named_modules() of a module returns shared_ptrs; the root itself is held by address.
  t.modules.emplace_back("", &root);
  for (auto& item : root.named_modules("", /*include_self=*/false)) t.modules.emplace_back(item.key(), item.value().get());
  // A module's parent is the module its path without the last ".name" names (names hold no dot).
  std::unordered_map<std::string, int> by_path;
  t.parent.assign(t.modules.size(), 0);
  t.parent[0] = -1;
  for (size_t mi = 0; mi < t.modules.size(); ++mi) {
    const std::string& path = t.modules[mi].first;
    by_path.emplace(path, static_cast<int>(mi));
    if (mi == 0) continue;
    const size_t dot = path.rfind('.');
    const auto it = by_path.find(dot == std::string::npos ? std::string() : path.substr(0, dot));
    if (it != by_path.end()) t.parent[mi] = it->second;
  }
  std::unordered_map<const void*, size_t> index;
  for (size_t mi = 0; mi < t.modules.size(); ++mi) {
    const auto& [prefix, mod] = t.modules[mi];
    for (auto& item : mod->named_parameters(/*recurse=*/false)) {
      const void* key = item.value().unsafeGetTensorImpl();
      auto it = index.find(key);
      if (it == index.end()) {
        it = index.emplace(key, t.params.size()).first;
        t.params.push_back({prefix.empty() ? item.key() : prefix + "." + item.key(), item.value(), {}, static_cast<int>(mi)});
      }
      t.params[it->second].owners.emplace_back(mod, item.key());
    }
  }
  return t;
}

namespace {

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// nf4: an NF4 flat (frozen) in the given format; nullptr otherwise.
FlatPlan make_flat(const ModuleTree& tree, const std::vector<int>& members, at::ScalarType dtype, int S,
                   bool offload, bool frozen, const nf4::Format* nf4 = nullptr) {
  FlatPlan f;
  f.dtype = dtype;
  f.shard_size = S;
  f.frozen = frozen;
  f.nf4 = nf4 != nullptr;
  if (nf4) f.nf4_format = *nf4;
  const int64_t align = nf4 ? nf4->align() : 1;
  for (int pi : members) {
    const at::Tensor& t = tree.params[pi].tensor;
    ParamPlan p;
    p.name = tree.params[pi].name;
    p.shape = t.sizes().vec();
    p.numel = t.numel();
    p.offset = round_up(f.numel, align);
    p.index = pi;
    f.numel = p.offset + p.numel;
    f.params.push_back(std::move(p));
  }
  f.padded = nf4 ? std::max<int64_t>(round_up(f.numel, S * align), S * align) : padded_numel(f.numel, S);
  f.shard_numel = f.padded / S;
  f.aliases_master = aliases_master(S, dtype, offload, frozen, f.nf4);
  return f;
}

bool is_frozen(const ModuleTree& tree, int pi) { return !tree.params[pi].tensor.requires_grad(); }

}  // namespace

std::vector<UnitPlan> plan_units(const ModuleTree& tree, const EngineOptions& opts, int shard_size) {
  const auto& modules = tree.modules;
  const auto& params = tree.params;
  const int S = std::max(1, shard_size);

  // Units: hookable modules picked by type or by size, bottom-up (reverse pre-order visits
  // children before parents), then listed in pre-order after the root. A module's unclaimed
  // elements are its own parameters' plus those of its children that did not become units
  // (a unit claims its whole subtree): one pass over the tree, linear in its size (a scan of
  // every parameter for every module made 10,000 layers take minutes).
  std::vector<int> unit_module{0};  // the root
  if (!opts.wrap_types.empty() || opts.min_num_params > 0) {
    std::vector<int64_t> unclaimed(modules.size(), 0);
    for (const auto& p : params)
      if (!matches_any(p.name, opts.ignored)) unclaimed[p.module] += p.tensor.numel();
    std::vector<bool> is_unit(modules.size(), false);
    for (size_t mi = modules.size(); mi-- > 1;) {
      auto* mod = modules[mi].second;
      if (dynamic_cast<Hookable*>(mod) && unclaimed[mi] > 0) {
        const bool by_type = std::find(opts.wrap_types.begin(), opts.wrap_types.end(), mod->name()) != opts.wrap_types.end();
        const bool by_size = opts.min_num_params > 0 && unclaimed[mi] >= opts.min_num_params;
        is_unit[mi] = by_type || by_size;
      }
      if (!is_unit[mi]) unclaimed[tree.parent[mi]] += unclaimed[mi];
    }
    for (size_t mi = 1; mi < modules.size(); ++mi)
      if (is_unit[mi]) unit_module.push_back(static_cast<int>(mi));
  }

  // Each parameter to the innermost unit that contains it (its owner's nearest unit ancestor),
  // else the root; ignored ones apart.
  std::vector<int> unit_of(modules.size(), -1);
  for (size_t ui = 0; ui < unit_module.size(); ++ui) unit_of[unit_module[ui]] = static_cast<int>(ui);
  std::vector<std::vector<int>> members(unit_module.size());
  std::vector<int> ignored;
  for (size_t pi = 0; pi < params.size(); ++pi) {
    if (matches_any(params[pi].name, opts.ignored)) {
      ignored.push_back(static_cast<int>(pi));
      continue;
    }
    int m = params[pi].module;
    while (unit_of[m] < 0) m = tree.parent[m];
    members[unit_of[m]].push_back(static_cast<int>(pi));
  }

  // QLoRA: the frozen parameters stored as NF4 (not in the ignored group: kept whole, it is not
  // gathered).
  std::set<std::string> nf4_names(opts.nf4.params.begin(), opts.nf4.params.end());
  nf4::Format nf4_format;
  nf4_format.block = opts.nf4.block;
  nf4_format.double_quant = opts.nf4.double_quant;
  auto is_nf4 = [&](int pi) { return opts.nf4.on() && nf4_names.count(params[pi].name) > 0; };

  std::vector<UnitPlan> units;
  for (size_t ui = 0; ui < unit_module.size(); ++ui) {
    UnitPlan u;
    u.kind = ui == 0 ? UnitKind::Root : UnitKind::Block;
    u.module = unit_module[ui];
    u.name = u.is_root() ? "<root>" : modules[u.module].first;
    // Split by training (frozen apart) and by dtype: keep_fp32 parameters stay fp32 under mixed
    // precision.
    std::vector<int> nf4;
    for (const bool frozen : {false, true}) {
      std::vector<int> compute, fp32;
      for (int pi : members[ui]) {
        if (is_frozen(tree, pi) != frozen) continue;
        if (frozen && is_nf4(pi)) {
          nf4.push_back(pi);
          continue;
        }
        const bool keep = opts.mp.param_dtype != at::kFloat && matches_any(params[pi].name, opts.mp.keep_fp32);
        (keep ? fp32 : compute).push_back(pi);
      }
      if (!compute.empty())
        u.flats.push_back(make_flat(tree, compute, opts.mp.param_dtype, S, opts.cpu_offload, frozen));
      if (!fp32.empty()) u.flats.push_back(make_flat(tree, fp32, at::kFloat, S, opts.cpu_offload, frozen));
    }
    if (!nf4.empty())
      u.flats.push_back(make_flat(tree, nf4, opts.mp.param_dtype, S, opts.cpu_offload, true, &nf4_format));
    units.push_back(std::move(u));
  }
  if (!ignored.empty()) {
    UnitPlan u;
    u.name = "<ignored>";
    u.kind = UnitKind::Ignored;
    // Kept whole on every rank (group size 1), in fp32, its gradient averaged like DDP.
    for (const bool frozen : {false, true}) {
      std::vector<int> some;
      for (int pi : ignored)
        if (is_frozen(tree, pi) == frozen) some.push_back(pi);
      if (!some.empty()) u.flats.push_back(make_flat(tree, some, at::kFloat, 1, opts.cpu_offload, frozen));
    }
    units.push_back(std::move(u));
  }
  return units;
}

std::vector<UnitPlan> plan_units(torch::nn::Module& root, const EngineOptions& opts, int shard_size) {
  return plan_units(module_tree(root), opts, shard_size);
}

}  // namespace shardtrain::fsdp
