// save_snapshot: create every dataset collectively, write each rank's pieces, digest, commit.
#include <fcntl.h>
#include <hdf5.h>
#include <torch/version.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "plan.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/format.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"

namespace shardtrain::ckpt {
namespace {

// Everything non-tensor, as rank 0 has it, so that all ranks create identical metadata.
nlohmann::json rank0_metadata(const TrainState& st, const CheckpointInfo& info, MPI_Comm world) {
  int rank = 0;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  std::string text;
  if (rank == 0) {
    char created[64];
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    std::strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
    unsigned a, b, c;
    H5get_libversion(&a, &b, &c);
    char mpiver[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(mpiver, &len);
    std::string mpi(mpiver, len);
    mpi = mpi.substr(0, mpi.find_first_of(",\n"));
    nlohmann::json j;
    j["created"] = created;
    j["versions"] = std::string("shardtrain ") + SHARDTRAIN_VERSION + "; libtorch " + TORCH_VERSION + "; HDF5 " +
                    std::to_string(a) + "." + std::to_string(b) + "." + std::to_string(c) + "; " + mpi;
    j["step"] = st.step;
    j["tokens_seen"] = st.tokens_seen;
    j["lr_step"] = st.lr_step;
    j["data_cursor"] = st.data_cursor;
    j["rng_state"] = st.rng_state;
    j["extra_json"] = st.extra_json;
    j["deck_text"] = info.deck_text;
    j["model_spec_json"] = info.model_spec_json;
    j["strategy"] = info.strategy;
    j["shard_group_size"] = info.shard_group_size;
    j["replicate_size"] = info.replicate_size;
    j["run_id"] = info.run_id;
    j["save_seq"] = info.save_seq;
    text = j.dump();
  }
  int64_t n = static_cast<int64_t>(text.size());
  ST_MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT64_T, 0, world));
  text.resize(static_cast<size_t>(n));
  ST_MPI_CHECK(MPI_Bcast(text.data(), static_cast<int>(n), MPI_CHAR, 0, world));
  return nlohmann::json::parse(text);
}

H5Id create_dataset(hid_t file, const std::string& path, hid_t type, const std::vector<int64_t>& shape, hid_t lcpl,
                    hid_t dcpl) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5Id space(shape.empty() ? ST_H5_CHECK(H5Screate(H5S_SCALAR))
                           : ST_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)),
             H5Sclose);
  return H5Id(ST_H5_CHECK(H5Dcreate2(file, path.c_str(), type, space, lcpl, dcpl, H5P_DEFAULT)), H5Dclose);
}

// A small 1-D dataset written whole by rank 0 (the others select nothing).
template <typename T>
void write_small(hid_t file, const std::string& path, hid_t file_type, hid_t mem_type, const std::vector<T>& v,
                 int rank, hid_t lcpl, hid_t dcpl, hid_t dxpl) {
  H5Id d = create_dataset(file, path, file_type, {static_cast<int64_t>(v.size())}, lcpl, dcpl);
  H5Id fs(ST_H5_CHECK(H5Dget_space(d)), H5Sclose);
  Piece p{0, rank == 0 ? static_cast<int64_t>(v.size()) : 0, 0};
  select_piece(fs, {static_cast<int64_t>(v.size())}, p);
  H5Id ms(piece_mem_space(p), H5Sclose);
  if (!v.empty()) ST_H5_CHECK(H5Dwrite(d, mem_type, ms, fs, dxpl, v.data()));  // size known on all ranks
  Digest dg;  // every rank holds the same (broadcast) data
  dg.add(v.data(), static_cast<int64_t>(v.size()), sizeof(T), 0);
  write_attr_uint64s(d, kDigestAttr, dg.as_vector());
}

void fsync_path(const std::string& p, int flags) {
  int fd = ::open(p.c_str(), flags);
  if (fd < 0) throw Error("cannot open " + p + " to fsync it");
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error("fsync of " + p + " failed");
}

}  // namespace

IoStats save_snapshot(const std::string& path, const Snapshot& snap, const TrainState& state,
                      const CheckpointInfo& info, MPI_Comm world, const SaveOptions& opts) {
  detail::quiet_hdf5();
  Timer timer;
  int rank = 0, size = 1;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  ST_MPI_CHECK(MPI_Comm_size(world, &size));
  const std::string tmp = opts.atomic ? path + ".tmp" : path;
  std::vector<ParamPlan> plan = make_plan(snap, world, opts.split_replicas);
  nlohmann::json meta = rank0_metadata(state, info, world);

  {
    H5Id fapl(ST_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
    ST_H5_CHECK(H5Pset_fapl_mpio(fapl, world, MPI_INFO_NULL));
    ST_H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, true));
    ST_H5_CHECK(H5Pset_coll_metadata_write(fapl, true));
    ST_H5_CHECK(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST));
    H5Id fcpl(ST_H5_CHECK(H5Pcreate(H5P_FILE_CREATE)), H5Pclose);
    // Dense attribute storage on the root: the deck text may exceed the 64 KiB compact limit.
    ST_H5_CHECK(H5Pset_attr_phase_change(fcpl, 0, 0));
    H5Id file;
    runtime::run_agreed(world, [&] {
      hid_t f = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl, fapl);
      if (f < 0) throw UserError("cannot create checkpoint file " + tmp + " (does the directory exist and is it writable?)");
      file = H5Id(f, H5Fclose);
    });

    write_attr_string(file, "format", kFormatName);
    write_attr_int64(file, "version", kFormatVersion);
    write_attr_int64(file, "step", meta["step"].get<int64_t>());
    write_attr_int64(file, "tokens_seen", meta["tokens_seen"].get<int64_t>());
    write_attr_int64(file, "world_size", size);
    write_attr_int64(file, "shard_group_size", meta["shard_group_size"].get<int64_t>());
    write_attr_int64(file, "replicate_size", meta["replicate_size"].get<int64_t>());
    write_attr_string(file, "strategy", meta["strategy"].get<std::string>());
    write_attr_string(file, "created", meta["created"].get<std::string>());
    write_attr_string(file, "library_versions", meta["versions"].get<std::string>());
    write_attr_string(file, "model_spec", meta["model_spec_json"].get<std::string>());
    write_attr_string(file, "deck", meta["deck_text"].get<std::string>());
    if (!meta["run_id"].get<std::string>().empty()) {
      write_attr_string(file, "run_id", meta["run_id"].get<std::string>());
      write_attr_int64(file, "save_seq", meta["save_seq"].get<int64_t>());
    }

    H5Id lcpl(ST_H5_CHECK(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
    ST_H5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
    H5Id dcpl(ST_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
    ST_H5_CHECK(H5Pset_layout(dcpl, H5D_CONTIGUOUS));
    ST_H5_CHECK(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
    ST_H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));  // every element is written
    H5Id dxpl(ST_H5_CHECK(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
    ST_H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
    H5Id data_dxpl(ST_H5_CHECK(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
    ST_H5_CHECK(H5Pset_dxpl_mpio(data_dxpl, opts.collective_data ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT));

    // Groups first so that /model, /optim, /train exist even for an empty model.
    for (const char* g : {kModelGroup, kOptimGroup, kTrainGroup}) {
      H5Id grp(ST_H5_CHECK(H5Gcreate2(file, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
    }
    {
      H5Id og(ST_H5_CHECK(H5Gopen2(file, kOptimGroup, H5P_DEFAULT)), H5Gclose);
      write_attr_string(og, "name", snap.optimizer);
      write_attr_int64(og, "steps_taken", snap.optimizer_steps);
    }

    // One dataset per parameter and per state array: create, write own piece, digest.
    const size_t ns = snap.state_names.size();
    std::vector<uint64_t> local(plan.size() * (1 + ns) * 2, 0), total(local.size(), 0);
    std::vector<H5Id> datasets;
    datasets.reserve(plan.size() * (1 + ns));
    for (size_t i = 0; i < plan.size(); ++i) {
      const ParamPlan& p = plan[i];
      const FlatView& v = snap.flats[p.flat];
      for (size_t k = 0; k <= ns; ++k) {
        std::string dpath = k == 0 ? model_path(p.name) : optim_path(snap.state_names[k - 1], p.name);
        const float* base = k == 0 ? v.master : v.states[k - 1];
        H5Id d = create_dataset(file, dpath, H5T_IEEE_F32LE, p.shape, lcpl, dcpl);
        H5Id fs(ST_H5_CHECK(H5Dget_space(d)), H5Sclose);
        select_piece(fs, p.shape, p.own);
        H5Id ms(piece_mem_space(p.own), H5Sclose);
        const float* src = p.own.numel() ? base + p.own.shard_offset : base;
        // Collective: every rank takes part (empty parameters: no transfer at all, every rank
        // knows the shape). Independent: only ranks with a piece write.
        if (opts.collective_data ? shape_numel(p.shape) > 0 : p.own.numel() > 0)
          ST_H5_CHECK(H5Dwrite(d, H5T_NATIVE_FLOAT, ms, fs, data_dxpl, src));
        Digest dg;
        if (p.own.numel()) dg.add(src, p.own.numel(), 4, p.own.lo);
        size_t slot = (i * (1 + ns) + k) * 2;
        local[slot] = dg.sum;
        local[slot + 1] = dg.weighted;
        datasets.push_back(std::move(d));
      }
    }
    ST_MPI_CHECK(MPI_Allreduce(local.data(), total.data(), static_cast<int>(local.size()), MPI_UINT64_T, MPI_SUM, world));
    for (size_t j = 0; j < datasets.size(); ++j) {
      write_attr_uint64s(datasets[j], kDigestAttr, {total[2 * j], total[2 * j + 1]});
      datasets[j].close();
    }

    std::vector<int64_t> cursor = meta["data_cursor"].get<std::vector<int64_t>>();
    std::vector<uint8_t> rng = meta["rng_state"].get<std::vector<uint8_t>>();
    write_small(file, std::string(kTrainGroup) + "/data_cursor", H5T_STD_I64LE, H5T_NATIVE_INT64, cursor, rank, lcpl,
                dcpl, dxpl);
    write_small(file, std::string(kTrainGroup) + "/rng_state", H5T_STD_U8LE, H5T_NATIVE_UINT8, rng, rank, lcpl, dcpl,
                dxpl);
    {
      H5Id tg(ST_H5_CHECK(H5Gopen2(file, kTrainGroup, H5P_DEFAULT)), H5Gclose);
      write_attr_int64(tg, "step", meta["step"].get<int64_t>());
      write_attr_int64(tg, "tokens_seen", meta["tokens_seen"].get<int64_t>());
      write_attr_int64(tg, "lr_step", meta["lr_step"].get<int64_t>());
      write_attr_string(tg, "extra", meta["extra_json"].get<std::string>());
    }
    // Data on stable storage before the rename makes it visible (MPI_File_sync on every rank).
    ST_H5_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL));
    file.close();
  }
  if (opts.atomic) {
    runtime::run_agreed(world, [&] {
      if (rank != 0) return;
      if (std::rename(tmp.c_str(), path.c_str()) != 0) throw Error("cannot rename " + tmp + " to " + path);
      std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
      fsync_path(dir.empty() ? "/" : dir, O_RDONLY | O_DIRECTORY);
    });
  }
  ST_MPI_CHECK(MPI_Barrier(world));
  return IoStats{timer.seconds(), snapshot_file_bytes(snap)};
}

IoStats save_checkpoint(const std::string& path, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt,
                        const TrainState& state, const CheckpointInfo& info, MPI_Comm world, const SaveOptions& opts) {
  if (snapshot_in_host_memory(engine, opt)) return save_snapshot(path, view_snapshot(engine, opt), state, info, world, opts);
  std::vector<std::vector<float>> pool;  // shards in device memory: written from host copies
  return save_snapshot(path, staged_snapshot(engine, opt, pool), state, info, world, opts);
}

}  // namespace shardtrain::ckpt
