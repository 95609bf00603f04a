# scripts/pack-gpu-deps makes the dependency pack for GPU machines without a package registry and
# checks it with the system copies hidden (mount namespace: needs root and unshare; skipped, exit
# 77, where either is missing or the Debian packages are not installed). About 1.5 minutes on a
# busy 2-core machine.
add_test(NAME e2e_gpu_deps_pack
  COMMAND bash -c "command -v unshare >/dev/null && [ $(id -u) = 0 ] && unshare -m true 2>/dev/null || { echo 'SKIP: needs root and unshare'; exit 77; }; \
    t=$(mktemp -d); trap 'rm -rf $t' EXIT; ${PROJECT_SOURCE_DIR}/scripts/pack-gpu-deps $t/gpu-deps.tar.gz --check; rc=$?; \
    [ $rc = 2 ] && { echo 'SKIP: Debian packages missing'; exit 77; }; exit $rc")
set_tests_properties(e2e_gpu_deps_pack PROPERTIES TIMEOUT 1200 LABELS "e2e;pack" SKIP_RETURN_CODE 77
  PASS_REGULAR_EXPRESSION "check: OK")
