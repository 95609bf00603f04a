// save_snapshot: create every dataset collectively, write each rank's pieces, digest, commit.
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <nlohmann/json.hpp>

#include "plan.h"
#include "shardtrain/ckpt/attributes.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/format.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/preflight.h"
#include "shardtrain/ckpt/versions.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/blocking_region.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/runtime/runtime.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"
#include "write_guard.h"

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
    nlohmann::json j;
    j[attr::kCreated] = created;
    j[attr::kLibraryVersions] = software_versions();
    j[attr::kStep] = st.step;
    j[attr::kTokensSeen] = st.tokens_seen;
    j[attr::kLrStep] = st.lr_step;
    j["data_cursor"] = st.data_cursor;
    j["rng_state"] = st.rng_state;
    j[attr::kExtra] = st.extra_json;
    j[attr::kDeck] = info.deck_text;
    j[attr::kModelSpec] = info.model_spec_json;
    j[attr::kStrategy] = info.strategy;
    j[attr::kShardGroupSize] = info.shard_group_size;
    j[attr::kReplicateSize] = info.replicate_size;
    j[attr::kRunId] = info.run_id;
    j[attr::kSaveSeq] = info.save_seq;
    j[attr::kBase] = info.base_json;
    text = j.dump();
  }
  runtime::broadcast(world, text, 0, "save.metadata");
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

// A small 1-D dataset written whole by rank 0 (the others select nothing). The data write's
// errno is returned (0 = written), not thrown: see "failures while the file is open".
template <typename T>
int write_small(hid_t file, const std::string& path, hid_t file_type, hid_t mem_type, const std::vector<T>& v,
                int rank, hid_t lcpl, hid_t dcpl, hid_t dxpl) {
  H5Id d = create_dataset(file, path, file_type, {static_cast<int64_t>(v.size())}, lcpl, dcpl);
  H5Id fs(ST_H5_CHECK(H5Dget_space(d)), H5Sclose);
  Piece p{0, rank == 0 ? static_cast<int64_t>(v.size()) : 0, 0};
  select_piece(fs, {static_cast<int64_t>(v.size())}, p);
  H5Id ms(piece_mem_space(p), H5Sclose);
  int failed = 0;
  errno = 0;
  if (!v.empty() && H5Dwrite(d, mem_type, ms, fs, dxpl, v.data()) < 0) {  // size known on all ranks
    failed = errno ? errno : -1;
    H5Eclear2(H5E_DEFAULT);
  }
  Digest dg;  // every rank holds the same (broadcast) data
  dg.add(v.data(), static_cast<int64_t>(v.size()), sizeof(T), 0);
  write_attr_uint64s(d, kDigestAttr, dg.as_vector());
  return failed;
}

// ---- failures while the file is open ---------------------------------------------------
//
// A parallel HDF5 file must be closed by every rank together: H5Fclose flushes metadata
// collectively (barriers around the writes) and sets the file size (MPI_File_set_size).
// If one rank fails a write and unwinds through H5Fclose while the others go on to their
// next collective call, every rank waits forever (issue #18: one rank in MPI_File_set_size,
// the other in a barrier). So the save never lets a failure unwind through the file handle:
//  - storage failures are made impossible where they would hit a collective call: rank 0
//    reserves the file's estimated size before any data or metadata is written
//    (detail::reserve_space), so ENOSPC / EDQUOT appear where every rank can agree on them;
//  - failures that can still happen (an independent data write, the flush, the close) are
//    recorded, agreed across ranks at the next safe point (detail::agree_failure) and only
//    then does every rank clean up together (abandon(): a close that cannot fail, the .tmp
//    removed) and throw the same IoError;
//  - anything else raised inside the open file (a metadata call failing on some ranks only)
//    cannot be agreed: that rank prints the message and aborts the job right there
//    (fail_fast), instead of unwinding into a collective close that would hang.

constexpr double kCleanupSeconds = 60;  // an agreed clean-up is a few ms; this is the backstop

[[noreturn]] void fail_fast(const std::string& tmp, const char* what, int code, int64_t need) {
  // A metadata write refused for lack of space surfaces as a failed HDF5 call: still a full
  // disk (exit 5, the last good checkpoint stays), not a bug.
  const int64_t avail = io::available_bytes(io::parent_dir(tmp));
  const bool full = avail >= 0 && avail < need;
  if (full) code = kExitIo;
  log::error(std::string("checkpoint ") + tmp + ": " +
             (full ? "write failed: " + io::errno_text(ENOSPC) + " (" + std::to_string(need) + " bytes needed for the file, " +
                         std::to_string(avail) + " available now): "
                   : std::string()) +
             what + " (raised on this rank inside a collective HDF5 write, where the others cannot be told: aborting the job)");
  ::unlink(tmp.c_str());  // best effort; a .tmp left behind is never read and the next save deletes it
  runtime::Runtime::abort(code == kExitOk ? kExitInternal : code);
}

// Every rank, after an agreed failure: close collectively in a way that cannot fail, then
// remove the .tmp. The close still writes HDF5's dirty metadata and sets the file size;
// measured on a full tmpfs, a close that writes to the real file fails on some ranks (even
// after freeing the partial file's own space, when other files fill the disk) and then
// hangs in its barriers, or leaves the file open for HDF5's atexit handler to close after
// MPI_Finalize (the segfault of issue #18). So each rank first redirects its descriptors of
// the file to a memory file (detail::redirect_to_memory) and the close writes there. Where
// that is impossible (no memfd or /proc), rank 0 truncates the file to free its space.
// Return codes are deliberately ignored here: the failure being reported is already agreed,
// and a second error could only be reported by some ranks. The deadline ends a close that
// hangs anyway.
[[noreturn]] void abandon(const Error& failure, H5Id& file, std::vector<H5Id>& datasets, const std::string& tmp,
                          int rank, MPI_Comm world) {
  detail::Deadline deadline(kCleanupSeconds, std::string(failure.what()) + "; the clean-up did not finish",
                            failure.exit_code(), tmp);
  const int redirected = detail::redirect_to_memory(tmp);
  const int everywhere = runtime::cleanup_min(world, redirected);  // also: all redirected before the unlink
  if (rank == 0) {
    if (everywhere == 0) (void)::truncate(tmp.c_str(), 0);
    (void)::unlink(tmp.c_str());
  }
  runtime::cleanup_barrier(world);
  for (H5Id& d : datasets) d.reset();
  file.reset();
  H5Eclear2(H5E_DEFAULT);
  runtime::cleanup_barrier(world);  // nobody reports the failure before every rank has closed
  throw failure;
}

// Creates path.tmp on rank 0 with POSIX calls first: the reason a directory refuses the file
// (read-only, permissions, no space for even a reservation) comes back as errno, before any
// HDF5 call. The name is created exclusively (io::create_temp: a planted link or device there
// is refused, a stale temporary removed) and removed again: H5Fcreate then creates it with
// H5F_ACC_EXCL, so HDF5 never opens a name someone else put there. Returns the failure
// message ("" = ok); UserError for a planted name.
std::string rank0_prepare(const std::string& tmp, int64_t need, int64_t free_before) {
  ::close(io::create_temp(tmp, "checkpoint"));
  // A reservation now: a disk that is already full, or a quota already used up, then fails
  // before HDF5 ever opens the file.
  std::string why = detail::reserve_space(tmp, need, free_before);
  ::unlink(tmp.c_str());
  return why;
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
  const std::string dir = io::parent_dir(tmp);
  std::vector<ParamPlan> plan = make_plan(snap, world, opts.split_replicas);
  nlohmann::json meta = rank0_metadata(state, info, world);
  const int64_t need = estimated_file_bytes(
      snapshot_file_bytes(snap) + 8 * static_cast<int64_t>(state.data_cursor.size()) +
          static_cast<int64_t>(state.rng_state.size()),
      static_cast<int64_t>(plan.size() * (1 + snap.state_names.size()) + 2),
      static_cast<int64_t>(info.deck_text.size() + info.model_spec_json.size() + info.base_json.size()));
  const int64_t free_before = rank == 0 ? io::available_bytes(dir) : -1;  // for messages
  const std::string where = "checkpoint " + tmp + ": ";
  // SHARDTRAIN_TEST_STUCK_SECONDS: test-only, so the tests can see a deadline fire in seconds.
  const char* stuck_env = std::getenv("SHARDTRAIN_TEST_STUCK_SECONDS");
  const double stuck_seconds = stuck_env ? std::atof(stuck_env) : opts.stuck_seconds;

  runtime::run_agreed(world, [&] {
    if (rank != 0) return;
    if (opts.atomic) io::check_output_path(path, "checkpoint");
    std::string why = rank0_prepare(tmp, need, free_before);
    if (!why.empty()) throw IoError(where + why);
  });

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
    std::vector<H5Id> datasets;
    {
      std::string failure;
      // EXCL: rank 0 creates the file with O_EXCL (MPI_MODE_EXCL), which follows no link.
      hid_t f;
      {
        runtime::BlockingRegion region(world, "save.create");  // MPI_File_open and HDF5's broadcasts
        f = H5Fcreate(tmp.c_str(), H5F_ACC_EXCL, fcpl, fapl);
      }
      if (f < 0) {
        failure = where + "cannot create the file with MPI-IO: " + detail::h5_innermost_message();
      } else {
        file = H5Id(f, H5Fclose);
      }
      if (auto e = detail::agree_failure(world, failure)) {
        // Opened here but not everywhere: its close is collective over ranks that have no file.
        if (file.valid()) fail_fast(tmp, e->what(), e->exit_code(), need);
        throw *e;
      }
    }

    // From here on, see "failures while the file is open" above.
    try {
      // H5Fcreate truncated the file: reserve again, now for good.
      int reserved = 0;
      bool held = false;
      std::string failure = rank == 0 ? detail::reserve_space(tmp, need, free_before, &held) : std::string();
      if (!failure.empty()) failure = where + failure;
      if (auto f = detail::agree_failure(world, failure)) abandon(*f, file, datasets, tmp, rank, world);
      reserved = held;
      runtime::broadcast(world, reserved, 0, "save.reserve");
      // Without a reservation (no fallocate on this file system) a metadata write may still
      // fail on some ranks inside HDF5's barriers and hang there: then the whole write gets a
      // deadline, at least stuck_seconds and ample for 50 MB/s.
      std::optional<detail::Deadline> unreserved;
      if (!reserved)
        unreserved.emplace(std::max(stuck_seconds, static_cast<double>(need) / 50e6),
                           where + "write failed: the write did not complete (no space reservation on this file system)",
                           kExitIo, tmp);

      std::optional<runtime::BlockingRegion> attributes(std::in_place, world, "save.attributes");
      write_attr_string(file, attr::kFormat, kFormatName);
      write_attr_int64(file, attr::kVersion, kFormatVersion);
      write_attr_int64(file, attr::kStep, meta[attr::kStep].get<int64_t>());
      write_attr_int64(file, attr::kTokensSeen, meta[attr::kTokensSeen].get<int64_t>());
      write_attr_int64(file, attr::kWorldSize, size);
      write_attr_int64(file, attr::kShardGroupSize, meta[attr::kShardGroupSize].get<int64_t>());
      write_attr_int64(file, attr::kReplicateSize, meta[attr::kReplicateSize].get<int64_t>());
      write_attr_string(file, attr::kStrategy, meta[attr::kStrategy].get<std::string>());
      write_attr_string(file, attr::kCreated, meta[attr::kCreated].get<std::string>());
      write_attr_string(file, attr::kLibraryVersions, meta[attr::kLibraryVersions].get<std::string>());
      write_attr_string(file, attr::kModelSpec, meta[attr::kModelSpec].get<std::string>());
      write_attr_string(file, attr::kDeck, meta[attr::kDeck].get<std::string>());
      if (!meta[attr::kRunId].get<std::string>().empty()) {
        write_attr_string(file, attr::kRunId, meta[attr::kRunId].get<std::string>());
        write_attr_int64(file, attr::kSaveSeq, meta[attr::kSaveSeq].get<int64_t>());
      }
      if (!meta[attr::kBase].get<std::string>().empty())
        write_attr_string(file, attr::kBase, meta[attr::kBase].get<std::string>());

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
        write_attr_string(og, attr::kOptimizerName, snap.optimizer);
        write_attr_int64(og, attr::kStepsTaken, snap.optimizer_steps);
      }
      attributes.reset();

      // One dataset per parameter and per state array: create, write own piece, digest.
      // A failed data write is recorded, not thrown: this rank keeps taking part in the
      // collective dataset creations (and, with collective_data, in every collective
      // H5Dwrite), and all ranks agree on the outcome after the loop.
      const size_t ns = snap.state_names.size();
      std::vector<uint64_t> local(plan.size() * (1 + ns) * 2, 0), total(local.size(), 0);
      std::vector<size_t> slot_of;  // datasets[j]'s digest in local / total
      datasets.reserve(plan.size() * (1 + ns));
      for (size_t i = 0; i < plan.size(); ++i) {
        const ParamPlan& p = plan[i];
        const FlatView& v = snap.flats[p.flat];
        for (size_t k = 0; k <= v.states.size(); ++k) {  // a frozen parameter: /model only
          std::string dpath = k == 0 ? model_path(p.name) : optim_path(snap.state_names[k - 1], p.name);
          const float* base = k == 0 ? v.master : v.states[k - 1];
          H5Id d;
          {
            runtime::BlockingRegion region(world, "save.create_dataset");  // collective metadata
            d = create_dataset(file, dpath, H5T_IEEE_F32LE, p.shape, lcpl, dcpl);
          }
          H5Id fs(ST_H5_CHECK(H5Dget_space(d)), H5Sclose);
          select_piece(fs, p.shape, p.own);
          H5Id ms(piece_mem_space(p.own), H5Sclose);
          const float* src = p.own.numel() ? base + p.own.shard_offset : base;
          // Collective: every rank takes part (empty parameters: no transfer at all, every rank
          // knows the shape). Independent: only ranks with a piece write (and a rank whose
          // earlier write failed stops writing).
          const bool write = opts.collective_data ? shape_numel(p.shape) > 0 : p.own.numel() > 0 && failure.empty();
          if (write) {
            // Collective transfers wait for every rank: a region. Independent ones wait only
            // for the storage (bounded by the flush's deadline, not by comm.timeout_s).
            std::optional<runtime::BlockingRegion> region;
            if (opts.collective_data) region.emplace(world, "save.write_data");
            errno = 0;
            if (H5Dwrite(d, H5T_NATIVE_FLOAT, ms, fs, data_dxpl, src) < 0 && failure.empty()) {
              const int e = errno;  // MPI-IO's pwrite errno, before anything else can change it
              const std::string h5 = detail::h5_innermost_message();
              log::debug(log::fmt("checkpoint ", tmp, ": H5Dwrite of ", dpath, " failed: ", h5, " (errno ", e, ")"));
              failure = where + "write failed: " + detail::write_failure_reason(e, dir, need);
            }
          }
          Digest dg;
          if (p.own.numel()) dg.add(src, p.own.numel(), 4, p.own.lo);
          size_t slot = (i * (1 + ns) + k) * 2;
          local[slot] = dg.sum;
          local[slot + 1] = dg.weighted;
          slot_of.push_back(slot);
          datasets.push_back(std::move(d));
        }
      }
      if (auto f = detail::agree_failure(world, failure)) abandon(*f, file, datasets, tmp, rank, world);
      total = local;
      runtime::sum(world, total, "save.digests");
      {
        runtime::BlockingRegion region(world, "save.digests");  // HDF5's collective attribute writes
        for (size_t j = 0; j < datasets.size(); ++j) {
          write_attr_uint64s(datasets[j], kDigestAttr, {total[slot_of[j]], total[slot_of[j] + 1]});
          datasets[j].close();
        }
        datasets.clear();
      }

      std::optional<runtime::BlockingRegion> train_state(std::in_place, world, "save.train_state");
      std::vector<int64_t> cursor = meta["data_cursor"].get<std::vector<int64_t>>();
      std::vector<uint8_t> rng = meta["rng_state"].get<std::vector<uint8_t>>();
      for (int e : {write_small(file, std::string(kTrainGroup) + "/data_cursor", H5T_STD_I64LE, H5T_NATIVE_INT64,
                                cursor, rank, lcpl, dcpl, dxpl),
                    write_small(file, std::string(kTrainGroup) + "/rng_state", H5T_STD_U8LE, H5T_NATIVE_UINT8, rng,
                                rank, lcpl, dcpl, dxpl)})
        if (e != 0 && failure.empty())
          failure = where + "write failed: " + detail::write_failure_reason(e < 0 ? 0 : e, dir, need);
      {
        H5Id tg(ST_H5_CHECK(H5Gopen2(file, kTrainGroup, H5P_DEFAULT)), H5Gclose);
        write_attr_int64(tg, attr::kStep, meta[attr::kStep].get<int64_t>());
        write_attr_int64(tg, attr::kTokensSeen, meta[attr::kTokensSeen].get<int64_t>());
        write_attr_int64(tg, attr::kLrStep, meta[attr::kLrStep].get<int64_t>());
        write_attr_string(tg, attr::kExtra, meta[attr::kExtra].get<std::string>());
      }
      train_state.reset();
      // The flush writes metadata collectively: it must not start after a failed write.
      if (auto f = detail::agree_failure(world, failure)) abandon(*f, file, datasets, tmp, rank, world);
      // Data on stable storage before the rename makes it visible (MPI_File_sync on every
      // rank). Where the file system defers write errors (NFS, quotas), they surface here, on
      // some ranks: agreed before the close. A flush that hangs (a metadata write failing on
      // some ranks inside HDF5's barriers: possible only where the space could not be
      // reserved) ends the job after SaveOptions::stuck_seconds.
      detail::Deadline flush_deadline(stuck_seconds, where + "write failed: the flush did not complete", kExitIo, tmp);
      errno = 0;
      if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0) {
        const int e = errno;
        log::debug(log::fmt("checkpoint ", tmp, ": H5Fflush failed: ", detail::h5_innermost_message(), " (errno ", e, ")"));
        failure = where + "write failed (flush): " + detail::write_failure_reason(e, dir, need);
      }
      if (auto f = detail::agree_failure(world, failure)) abandon(*f, file, datasets, tmp, rank, world);
      // Nothing is dirty any more: the close only sets the size (to HDF5's end of allocation,
      // which also gives back what the reservation overshot) and closes.
      errno = 0;
      int closed;
      {
        runtime::BlockingRegion region(world, "save.close");  // MPI_File_set_size, MPI_File_close
        closed = H5Fclose(file.release());
      }
      if (closed < 0) {
        const int e = errno;
        log::debug(log::fmt("checkpoint ", tmp, ": H5Fclose failed: ", detail::h5_innermost_message(), " (errno ", e, ")"));
        failure = where + "write failed (close): " + detail::write_failure_reason(e, dir, need);
      }
      if (auto f = detail::agree_failure(world, failure)) {
        if (rank == 0) (void)::unlink(tmp.c_str());
        throw *f;
      }
    } catch (const Error& e) {
      if (e.agreed()) throw;  // every rank throws it; the file is closed and removed
      fail_fast(tmp, e.what(), e.exit_code(), need);
    } catch (const std::exception& e) {
      fail_fast(tmp, e.what(), kExitInternal, need);
    }
  }
  if (opts.atomic) {
    runtime::run_agreed(world, [&] {
      if (rank != 0) return;
      io::commit_temp(tmp, path, "checkpoint");
    });
  }
  runtime::barrier(world, "save.done");
  return IoStats{timer.seconds(), snapshot_file_bytes(snap)};
}

IoStats save_checkpoint(const std::string& path, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt,
                        const TrainState& state, const CheckpointInfo& info, MPI_Comm world, const SaveOptions& opts) {
  if (snapshot_in_host_memory(engine, opt)) return save_snapshot(path, view_snapshot(engine, opt), state, info, world, opts);
  std::vector<std::vector<float>> pool;  // shards in device memory: written from host copies
  return save_snapshot(path, staged_snapshot(engine, opt, pool), state, info, world, opts);
}

}  // namespace shardtrain::ckpt
