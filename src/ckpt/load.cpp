// load_checkpoint: validate everything, read this rank's shard slices collectively, check digests.
#include <algorithm>
#include <cstring>

#include "file_checks.h"
#include "plan.h"
#include "shardtrain/ckpt/attributes.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/format.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/blocking_region.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"

namespace shardtrain::ckpt {
namespace {

template <typename T>
std::vector<T> read_small(hid_t file, const std::string& path, const std::string& dpath, Elem elem, hid_t dxpl) {
  DatasetCheck c = check_dataset(file, path, dpath, elem, nullptr);
  if (c.shape.size() != 1 || c.numel > (int64_t{1} << 30))
    throw UserError(path + ": dataset /" + dpath + ": must be 1-D with at most 2^30 elements, is " + shape_str(c.shape));
  H5Id d(ST_H5_CHECK(H5Dopen2(file, dpath.c_str(), H5P_DEFAULT)), H5Dclose);
  H5Id fs(ST_H5_CHECK(H5Dget_space(d)), H5Sclose);
  std::vector<T> v(static_cast<size_t>(c.numel));
  Piece p{0, c.numel, 0};
  select_piece(fs, c.shape, p);
  H5Id ms(piece_mem_space(p), H5Sclose);
  if (!v.empty()) ST_H5_CHECK(H5Dread(d, elem_mem_type(elem), ms, fs, dxpl, v.data()));
  Digest dg;
  dg.add(v.data(), c.numel, sizeof(T), 0);
  if (dg != c.stored) throw UserError(path + ": dataset /" + dpath + ": checksum mismatch (the data is corrupt)");
  return v;
}

// Reads this rank's shard slices of dataset `dpath` into `base` (collective) and returns the
// digest of its own share (summed over the world, the dataset's).
Digest read_piece(hid_t file, const std::string& dpath, const ParamPlan& p, float* base, hid_t dxpl, MPI_Comm world) {
  runtime::BlockingRegion region(world, "load.read");
  H5Id d(ST_H5_CHECK(H5Dopen2(file, dpath.c_str(), H5P_DEFAULT)), H5Dclose);
  H5Id fs(ST_H5_CHECK(H5Dget_space(d)), H5Sclose);
  select_piece(fs, p.shape, p.shard);
  H5Id ms(piece_mem_space(p.shard), H5Sclose);
  if (shape_numel(p.shape) > 0) ST_H5_CHECK(H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, dxpl, base + p.shard.shard_offset));
  Digest dg;
  if (p.own.numel()) dg.add(base + p.own.shard_offset, p.own.numel(), 4, p.own.lo);
  return dg;
}

// /train: cursor, generator states and the loop attributes (checksums checked).
TrainState read_train_group(hid_t file, const std::string& path, hid_t dxpl) {
  TrainState state;
  const std::string tg = kTrainGroup;
  state.data_cursor = read_small<int64_t>(file, path, tg + "/data_cursor", Elem::I64, dxpl);
  state.rng_state = read_small<uint8_t>(file, path, tg + "/rng_state", Elem::U8, dxpl);
  H5Id g(ST_H5_CHECK(H5Gopen2(file, kTrainGroup, H5P_DEFAULT)), H5Gclose);
  const std::string what = path + ": group /train";
  state.step = read_attr_int64(g, attr::kStep, what);
  state.tokens_seen = read_attr_int64(g, attr::kTokensSeen, what);
  state.lr_step = read_attr_int64(g, attr::kLrStep, what);
  state.extra_json = read_attr_string(g, attr::kExtra, what);
  return state;
}

}  // namespace

TrainState read_train_state(const std::string& path) {
  TrainState st;
  file_errors_are_user_errors(path, [&] {
    H5Id file = open_checkpoint(path, MPI_COMM_NULL);
    st = read_train_group(file, path, H5P_DEFAULT);
  });
  return st;
}

IoStats load_checkpoint(const std::string& path, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt,
                        TrainState& state, MPI_Comm world, const LoadOptions& lo) {
  Timer timer;
  // Shards in device memory are read into host buffers and copied over once all is checked.
  const bool staged = lo.staged || !snapshot_in_host_memory(engine, opt);
  std::vector<std::vector<float>> pool;
  Snapshot snap = staged ? staged_snapshot(engine, opt, pool, /*copy=*/false) : view_snapshot(engine, opt, SnapshotAccess::Write);
  std::vector<ParamPlan> plan = make_plan(snap, world, /*split=*/true);
  const size_t ns = snap.state_names.size();
  H5Id file;
  std::vector<Digest> stored(plan.size() * (1 + ns));
  int64_t opt_steps = 0;
  // DiLoCo's states (from snap.optional_from on) may be missing: a checkpoint of an every_step
  // run, or of another replica count (its replicas' own states then do not fit).
  std::vector<bool> present(ns, true);

  // 1. Everything checked before a single value is read into the engine.
  runtime::run_agreed(world, [&] { file_errors_are_user_errors(path, [&] {
    runtime::BlockingRegion region(world, "load.open");  // MPI_File_open, collective metadata reads
    file = open_checkpoint(path, world);
    std::vector<std::string> want;
    for (size_t i = 0; i < plan.size(); ++i) {
      stored[i * (1 + ns)] = check_dataset(file, path, model_path(plan[i].name), Elem::F32, &plan[i].shape).stored;
      want.push_back(plan[i].name);
    }
    std::sort(want.begin(), want.end());
    for (const std::string& n : list_links(file, kModelGroup))
      if (!std::binary_search(want.begin(), want.end(), n))
        throw UserError(path + ": dataset /" + model_path(n) +
                        " is not a parameter of this model (a checkpoint of another model?)");
    if (!link_exists(file, kOptimGroup)) throw UserError(path + ": group /optim is missing");
    H5Id og(ST_H5_CHECK(H5Gopen2(file, kOptimGroup, H5P_DEFAULT)), H5Gclose);
    std::string name = read_attr_string(og, attr::kOptimizerName, path + ": group /optim");
    if (name != snap.optimizer)
      throw UserError(path + ": written with optimizer '" + name + "', this run uses '" + snap.optimizer + "'");
    opt_steps = read_attr_int64(og, attr::kStepsTaken, path + ": group /optim");
    if (opt_steps < 0) throw UserError(path + ": group /optim: negative steps_taken");
    // A trained parameter (a frozen one has no optimizer state) tells which states the file has.
    const auto trained = std::find_if(plan.begin(), plan.end(), [&](const ParamPlan& p) { return !snap.flats[p.flat].frozen; });
    if (snap.optional_from < ns && trained != plan.end()) {
      for (size_t k = snap.optional_from; k < ns; ++k)
        present[k] = link_exists(file, optim_path(snap.state_names[k], trained->name));
      // Written by more replicas than this run has: their own states do not fit either.
      // This run's replica count: its own names, fsdp::Engine::diloco_state_names.
      const size_t R = static_cast<size_t>(std::count_if(
          snap.state_names.begin() + static_cast<std::ptrdiff_t>(snap.optional_from), snap.state_names.end(),
          [](const std::string& n) { return n.rfind("diloco.local.r", 0) == 0; }));
      if (link_exists(file, optim_path("diloco.local.r" + std::to_string(R), trained->name)))
        for (size_t k = snap.optional_from + 1; k < ns; ++k) present[k] = false;
    }
    for (size_t i = 0; i < plan.size(); ++i)
      for (size_t k = 0; k < snap.flats[plan[i].flat].states.size(); ++k)
        if (present[k])
          stored[i * (1 + ns) + 1 + k] =
            check_dataset(file, path, optim_path(snap.state_names[k], plan[i].name), Elem::F32, &plan[i].shape).stored;
    for (auto [name, elem] : {std::pair<const char*, Elem>{"data_cursor", Elem::I64}, {"rng_state", Elem::U8}}) {
      const std::string dpath = std::string(kTrainGroup) + "/" + name;
      DatasetCheck c = check_dataset(file, path, dpath, elem, nullptr);
      if (c.shape.size() != 1 || c.numel > (int64_t{1} << 30))
        throw UserError(path + ": dataset /" + dpath + ": must be 1-D with at most 2^30 elements, is " + shape_str(c.shape));
    }
  }); });

  // 2. Collective reads of each rank's shard slices; digests over each rank's share.
  std::vector<uint64_t> local(2 * stored.size(), 0), total(local.size(), 0);
  runtime::run_agreed(world, [&] { file_errors_are_user_errors(path, [&] {
    H5Id dxpl(ST_H5_CHECK(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
    ST_H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
    for (size_t i = 0; i < plan.size(); ++i) {
      const ParamPlan& p = plan[i];
      const FlatView& v = snap.flats[p.flat];
      for (size_t k = 0; k <= v.states.size(); ++k) {
        if (k > 0 && !present[k - 1]) continue;
        const std::string dpath = k == 0 ? model_path(p.name) : optim_path(snap.state_names[k - 1], p.name);
        const Digest dg = read_piece(file, dpath, p, k == 0 ? v.master : v.states[k - 1], dxpl, world);
        size_t j = i * (1 + ns) + k;
        local[2 * j] = dg.sum;
        local[2 * j + 1] = dg.weighted;
      }
    }
    runtime::BlockingRegion region(world, "load.train_state");
    state = read_train_group(file, path, dxpl);
  }); });
  total = local;
  runtime::sum(world, total, "load.digests");
  runtime::run_agreed(world, [&] {
    for (size_t i = 0; i < plan.size(); ++i)
      for (size_t k = 0; k <= snap.flats[plan[i].flat].states.size(); ++k) {
        if (k > 0 && !present[k - 1]) continue;
        size_t j = i * (1 + ns) + k;
        if (total[2 * j] != stored[j].sum || total[2 * j + 1] != stored[j].weighted)
          throw UserError(path + ": dataset /" +
                          (k == 0 ? model_path(plan[i].name) : optim_path(snap.state_names[k - 1], plan[i].name)) +
                          ": checksum mismatch (the data is corrupt)");
      }
  });
  {
    runtime::BlockingRegion region(world, "load.close");
    file.close();
  }

  // Padding past the last parameter is not in the file: zero, as the engine initialises it.
  for (FlatView& v : snap.flats) {
    int64_t first_pad = std::clamp<int64_t>(v.numel - v.shard_begin, 0, v.shard_numel);
    int64_t n = v.shard_numel - first_pad;
    if (n <= 0) continue;
    std::memset(v.master + first_pad, 0, static_cast<size_t>(n) * 4);
    for (float* s : v.states) std::memset(s + first_pad, 0, static_cast<size_t>(n) * 4);
  }
  if (staged) restore_staged(snap, engine, opt);
  engine.load_residuals();  // the engine's states (fsdp.quantize_grads), read into its host copies
  if (snap.optional_from < ns) {
    // DiLoCo: the outer copy from the model just loaded, the replicas' own states if they fit.
    const size_t opt_states = opt.state_names().size();
    engine.load_diloco([&opt](size_t f, size_t k) { return opt.state_tensor(f, k); }, opt_states,
                       std::vector<bool>(present.begin() + static_cast<std::ptrdiff_t>(snap.optional_from), present.end()));
  }
  opt.set_steps_taken(opt_steps);
  return IoStats{timer.seconds(), snapshot_file_bytes(snap)};
}

void load_model_parameters(const std::string& path, fsdp::Engine& engine, MPI_Comm world,
                           const std::function<bool(const std::string&)>& wanted) {
  // The flats holding a wanted parameter, as fp32 host copies whose wanted slots the file fills.
  Snapshot snap;
  std::vector<at::Tensor> copies;
  const std::vector<fsdp::FlatParam*> flats = engine.flat_params();
  for (size_t i = 0; i < flats.size(); ++i) {
    FlatView v = flat_view(*flats[i], i);
    v.frozen = true;  // parameters only
    v.slots.erase(std::remove_if(v.slots.begin(), v.slots.end(), [&](const SlotView& s) { return !wanted(s.name); }),
                  v.slots.end());
    if (v.slots.empty()) continue;
    const fsdp::FlatParam& fp = *flats[i];
    copies.push_back(fp.master().to(at::kCPU, at::kFloat).clone());
    v.master = copies.back().data_ptr<float>();
    snap.flats.push_back(std::move(v));
  }
  const std::vector<ParamPlan> plan = make_plan(snap, world, /*split=*/true);
  std::vector<Digest> stored(plan.size());
  std::vector<uint64_t> sums(2 * plan.size(), 0);
  runtime::run_agreed(world, [&] { file_errors_are_user_errors(path, [&] {
    H5Id file;
    {
      runtime::BlockingRegion region(world, "load.open");
      file = open_checkpoint(path, world);
      for (size_t i = 0; i < plan.size(); ++i)
        stored[i] = check_dataset(file, path, model_path(plan[i].name), Elem::F32, &plan[i].shape).stored;
    }
    H5Id dxpl(ST_H5_CHECK(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
    ST_H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
    for (size_t i = 0; i < plan.size(); ++i) {
      const ParamPlan& p = plan[i];
      const Digest dg = read_piece(file, model_path(p.name), p, snap.flats[p.flat].master, dxpl, world);
      sums[2 * i] = dg.sum;
      sums[2 * i + 1] = dg.weighted;
    }
    runtime::BlockingRegion region(world, "load.close");
    file.close();
  }); });
  runtime::sum(world, sums, "load.digests");
  runtime::run_agreed(world, [&] {
    for (size_t i = 0; i < plan.size(); ++i)
      if (sums[2 * i] != stored[i].sum || sums[2 * i + 1] != stored[i].weighted)
        throw UserError(path + ": dataset /" + model_path(plan[i].name) + ": checksum mismatch (the data is corrupt)");
  });
  for (size_t k = 0; k < snap.flats.size(); ++k) flats[snap.flats[k].flat]->write_master().copy_(copies[k]);
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  H5Id file = open_checkpoint(path, MPI_COMM_NULL);
  const std::string what = "checkpoint " + path;
  CheckpointMeta m;
  m.version = read_attr_int64(file, attr::kVersion, what);
  m.step = read_attr_int64(file, attr::kStep, what);
  m.tokens_seen = read_attr_int64(file, attr::kTokensSeen, what);
  m.world_size = read_attr_int64(file, attr::kWorldSize, what);
  m.shard_group_size = read_attr_int64(file, attr::kShardGroupSize, what);
  m.replicate_size = read_attr_int64(file, attr::kReplicateSize, what);
  m.strategy = read_attr_string(file, attr::kStrategy, what);
  m.created = read_attr_string(file, attr::kCreated, what);
  m.library_versions = read_attr_string(file, attr::kLibraryVersions, what);
  m.model_spec_json = read_attr_string(file, attr::kModelSpec, what);
  m.deck_text = read_attr_string(file, attr::kDeck, what);
  if (has_attr(file, attr::kRunId)) m.run_id = read_attr_string(file, attr::kRunId, what);
  if (has_attr(file, attr::kSaveSeq)) m.save_seq = read_attr_int64(file, attr::kSaveSeq, what);
  if (has_attr(file, attr::kBase)) m.base_json = read_attr_string(file, attr::kBase, what);
  if (link_exists(file, kOptimGroup)) {
    H5Id og(ST_H5_CHECK(H5Gopen2(file, kOptimGroup, H5P_DEFAULT)), H5Gclose);
    m.optimizer = read_attr_string(og, attr::kOptimizerName, what + ": group /optim");
    m.optimizer_steps = read_attr_int64(og, attr::kStepsTaken, what + ": group /optim");
  }
  return m;
}

}  // namespace shardtrain::ckpt
