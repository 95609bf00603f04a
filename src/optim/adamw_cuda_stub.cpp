// adamw_step_cuda for builds without a CUDA compiler: a clear error (callers check
// adamw_cuda_built() first and fall back to libtorch operations).
#include "shardtrain/optim/adamw_cuda.h"
#include "shardtrain/util/error.h"

namespace shardtrain::optim {

bool adamw_cuda_built() { return false; }

void adamw_step_cuda(float*, const float*, float*, float*, int64_t, const int64_t*, int64_t, const AdamWScalars&,
                     void*) {
  ST_CHECK(false, "adamw_step_cuda: this shardtrain was built without a CUDA compiler "
                  "(SHARDTRAIN_HAVE_CUDA_KERNELS is off)");
}

}  // namespace shardtrain::optim
