// LoRA targets, adapters and frozen parameters on a built model (see lora.h).
#include "shardtrain/model/lora.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "shardtrain/util/error.h"
#include "shardtrain/util/names.h"

namespace shardtrain::model {

double LoraSpec::scale() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// PEFT's rule for a target module name: the whole path, or a dotted suffix of it; a glob here
// matches the whole path (PEFT takes a regular expression for the same purpose).
bool target_matches(const std::string& target, const LinearSite& s) {
  if (target == "all-linear") return s.in_block;
  if (is_glob(target)) return fnmatch(target.c_str(), s.path.c_str(), 0) == 0;
  return s.path == target || ends_with(s.path, "." + target);
}

std::string local_name(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

// A few names of a list, for an error message.
std::string some(const std::vector<std::string>& names, size_t n) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < n; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > n) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

}  // namespace

std::vector<LinearSite> linear_sites(Model& m) {
  std::set<std::string> block_types;
  for (const std::string& t : m.block_types()) block_types.insert(t);
  std::vector<std::string> block_paths;
  std::vector<LinearSite> sites;
  for (const auto& item : m.named_modules("", /*include_self=*/false)) {
    const std::string& path = item.key();
    if (block_types.count(item.value()->name())) block_paths.push_back(path);
    auto* layer = dynamic_cast<LinearLayer*>(item.value().get());
    if (!layer) continue;
    LinearSite s;
    s.path = path;
    s.layer = layer;
    s.in_block = std::any_of(block_paths.begin(), block_paths.end(),
                             [&](const std::string& b) { return path.compare(0, b.size() + 1, b + ".") == 0; });
    sites.push_back(s);
  }
  return sites;
}

std::string linear_names(const std::vector<LinearSite>& sites) {
  std::vector<std::string> names;
  for (const bool in_block : {true, false})
    for (const LinearSite& s : sites) {
      const std::string n = in_block ? local_name(s.path) : s.path;
      if (s.in_block == in_block && std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
  return some(names, 64);
}

std::vector<std::string> nf4_base_params(Model& m) {
  std::vector<std::string> names;
  for (const LinearSite& s : linear_sites(m)) {
    if (!s.in_block) continue;
    for (const auto& p : s.layer->named_parameters(/*recurse=*/false))
      if (p.key() == "weight" && !p.value().requires_grad()) names.push_back(s.path + ".weight");
  }
  return names;
}

bool valid_nf4_block(int64_t block) { return block >= 32 && block <= 4096 && (block & (block - 1)) == 0; }

bool is_lora_param(const std::string& name) {
  return ends_with(name, ".lora_A.weight") || ends_with(name, ".lora_B.weight");
}

void apply_finetune(Model& m, const Finetune& f) {
  const LoraSpec& lora = f.lora;
  if (lora.on()) {
    const std::vector<LinearSite> sites = linear_sites(m);
    const std::vector<std::string> targets = lora.targets.empty() ? m.default_lora_targets() : lora.targets;
    std::vector<bool> chosen(sites.size(), false);
    for (const std::string& t : targets) {
      bool any = false;
      for (size_t i = 0; i < sites.size(); ++i)
        if (target_matches(t, sites[i])) chosen[i] = any = true;
      ST_USER_CHECK(any, "lora.targets: \"", t, "\" matches no linear layer of this ", m.spec().arch,
                    " model; its linear layers: ", linear_names(sites), ", or \"all-linear\" (those of the blocks)");
    }
    for (size_t i = 0; i < sites.size(); ++i) {
      if (!chosen[i]) continue;
      LinearLayer& l = *sites[i].layer;
      const int64_t most = std::min(l.in_features(), l.out_features());
      ST_USER_CHECK(lora.rank <= most, "lora.rank = ", lora.rank, " is above min(in, out) = ", most, " of ",
                    sites[i].path, " (", l.out_features(), " x ", l.in_features(), "): a rank that high is no "
                    "low-rank adapter; lower lora.rank or leave this layer out of lora.targets");
      l.add_lora(lora.rank, lora.scale(), lora.dropout);
    }
  }
  ST_USER_CHECK(f.train_also.empty() || lora.on(),
                "lora.train_also names parameters trained beside LoRA's adapters, but lora.rank = 0 (LoRA off); "
                "for a partial fine-tune without LoRA, freeze what should not train with train.freeze");
  std::vector<std::string> names;
  for (const auto& item : m.named_parameters()) names.push_back(item.key());
  auto check_matches = [&](const char* key, const std::vector<std::string>& patterns) {
    for (const std::string& p : patterns) {
      const bool any = std::any_of(names.begin(), names.end(), [&](const std::string& n) { return matches_any(n, {p}); });
      ST_USER_CHECK(any, key, ": \"", p, "\" matches no parameter of this ", m.spec().arch, " model (its parameters: ",
                    some(names, 8), "; a pattern with *, ? or [ matches whole names as a glob, any other where it "
                    "occurs in a name)");
    }
  };
  check_matches("train.freeze", f.freeze);
  check_matches("lora.train_also", f.train_also);
  if (!f.any()) return;
  int64_t trainable = 0;
  for (auto& item : m.named_parameters()) {
    const std::string& n = item.key();
    bool trains = lora.on() ? is_lora_param(n) || matches_any(n, f.train_also) : true;
    if (matches_any(n, f.freeze)) trains = false;
    item.value().requires_grad_(trains);
    trainable += trains;
  }
  ST_USER_CHECK(trainable > 0, "train.freeze freezes every parameter of the model: nothing would train");
}

int64_t trainable_parameter_count(Model& m) {
  int64_t n = 0;
  for (const auto& item : m.named_parameters())
    if (item.value().requires_grad()) n += item.value().numel();
  return n;
}

int64_t total_parameter_count(Model& m) {
  int64_t n = 0;
  for (const auto& item : m.named_parameters()) n += item.value().numel();
  return n;
}

}  // namespace shardtrain::model
