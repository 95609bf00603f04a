// write_stall: an LD_PRELOAD shim for the fault tests that stalls one rank inside a
// checkpoint write, so the test can kill it while the file is half written.
//
// SHARDTRAIN_TEST_STALL_FILE=<substring of the HDF5 file name> and
// SHARDTRAIN_TEST_STALL_RANK=<MPI rank>: on that rank, the 3rd H5Dwrite into a matching file
// (some datasets written, the others not) writes its pid to SHARDTRAIN_TEST_STALL_MARKER and
// sleeps until killed. Its peers wait at the next collective HDF5 call (dataset creation). Symbols are looked
// up at run time: the shim links against nothing (the process has parallel HDF5 loaded).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
using hid_t = int64_t;  // HDF5 >= 1.10
using herr_t = int;
using H5DwriteFn = herr_t (*)(hid_t, hid_t, hid_t, hid_t, hid_t, const void*);
using H5FgetNameFn = long (*)(hid_t, char*, size_t);

herr_t H5Dwrite(hid_t dset, hid_t mem_type, hid_t mem_space, hid_t file_space, hid_t xfer, const void* buf) {
  static auto real = reinterpret_cast<H5DwriteFn>(dlsym(RTLD_NEXT, "H5Dwrite"));
  static auto get_name = reinterpret_cast<H5FgetNameFn>(dlsym(RTLD_DEFAULT, "H5Fget_name"));
  static int matched = 0;
  const char* want = std::getenv("SHARDTRAIN_TEST_STALL_FILE");
  const char* want_rank = std::getenv("SHARDTRAIN_TEST_STALL_RANK");
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (want && want_rank && rank && std::strcmp(want_rank, rank) == 0 && get_name) {
    char name[4096] = {0};
    if (get_name(dset, name, sizeof name) > 0 && std::strstr(name, want) && ++matched == 3) {
      std::fprintf(stderr, "[rank %s] write_stall: stalling inside the write of %s\n", rank, name);
      if (const char* marker = std::getenv("SHARDTRAIN_TEST_STALL_MARKER")) {
        if (FILE* f = std::fopen(marker, "w")) {
          std::fprintf(f, "%d\n", static_cast<int>(getpid()));
          std::fclose(f);
        }
      }
      for (int i = 0; i < 600; ++i) sleep(1);
    }
  }
  return real(dset, mem_type, mem_space, file_space, xfer, buf);
}
}
