# scripts/pack-gpu-deps makes the dependency pack for GPU machines without a package registry and
# checks it with the system copies hidden (mount namespace: needs root and unshare; skipped, exit
# 77, where either is missing or the Debian packages are not installed). About 1.5 minutes on a
# busy 2-core machine.
add_test(NAME e2e_gpu_deps_pack
  COMMAND bash -c "command -v unshare >/dev/null && [ $(id -u) = 0 ] && unshare -m true 2>/dev/null || { echo 'SKIP: needs root and unshare'; exit 77; }; \
    t=$(mktemp -d); trap 'rm -rf $t' EXIT; ${PROJECT_SOURCE_DIR}/scripts/pack-gpu-deps $t/gpu-deps.tar.gz --check; rc=$?; \
    [ $rc = 2 ] && { echo 'SKIP: Debian packages missing'; exit 77; }; exit $rc")
set_tests_properties(e2e_gpu_deps_pack PROPERTIES TIMEOUT 1200 LABELS "e2e;pack" SKIP_RETURN_CODE 77 RESOURCE_LOCK gpu_deps_pack
  PASS_REGULAR_EXPRESSION "check: OK")

# scripts/gpu-check --dry-run: everything of the GPU machine's check that can be checked without a
# GPU (docs/gpu.md, "The device plan"): the plan against the device's limits, and stages A and B
# themselves in a mount namespace that looks like the GPU machine (pack unpacked fresh, NCCL as
# the wheel's libnccl.so.2 only, the loader check, an NCCL binary on 2 ranks under the pack's
# mpirun, the files left in $OUT). Needs root and unshare (skipped, exit 77, otherwise). Its build
# (build/gpu-dry) is kept between runs: the first run compiles the optim and comm layers (about
# 5 minutes on 2 cores), later ones about 1.5 minutes (the pack is made once, in .gpu-deps/).
add_test(NAME e2e_gpu_check_dry_run
  COMMAND env GPU_DRY_DIR=${CMAKE_BINARY_DIR}/gpu-dry ${PROJECT_SOURCE_DIR}/scripts/gpu-check --dry-run)
set_tests_properties(e2e_gpu_check_dry_run PROPERTIES TIMEOUT 1500 LABELS "e2e;pack" SKIP_RETURN_CODE 77
  PASS_REGULAR_EXPRESSION "gpu-check --dry-run: OK" PROCESSORS 2 RESOURCE_LOCK gpu_deps_pack)
