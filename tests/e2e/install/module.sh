# e2e_install_module: `cmake --install` into a temporary prefix (then moved elsewhere), the Lmod
# module loaded in a login shell with a clean environment, and from another directory: the
# installed binary trains a tiny deck and writes a checkpoint, the installed jobscripts run it,
# the data files come from the prefix, and a C++ program built with find_package(shardtrain)
# against the prefix reads that checkpoint's metadata (the same versions line as --version).
#   bash module.sh BUILD_DIR SOURCE_DIR VERSION MPIEXEC [mpirun flags...]
# Exit 77 (skipped) without Lmod (Debian lmod: scripts/setup --for test installs it).
set -euo pipefail
BUILD=$1 SRC=$2 VERSION=$3 MPIEXEC=$4
shift 4
MPIFLAGS="$*"
LMOD_INIT=/usr/share/lmod/lmod/init/bash
[ -f "$LMOD_INIT" ] || { echo "SKIP: no Lmod ($LMOD_INIT; apt-get install lmod)"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/shardtrain-install-XXXXXX")
cleanup() { if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
note() { echo "== $*"; }

note "install into $T/stage, then move the prefix to $T/prefix (nothing may point back)"
cmake --install "$BUILD" --prefix "$T/stage" > "$T/install.log" 2>&1 || { cat "$T/install.log"; fail "cmake --install"; }
mv "$T/stage" "$T/prefix"
P=$T/prefix
for f in bin/shardtrain lib/shardtrain/shardtrain_spm_shim.so share/shardtrain/jobscripts/run-training.sh \
         share/shardtrain/jobscripts/local.sh share/shardtrain/inputs/quickstart.toml share/doc/shardtrain/README.md \
         share/doc/shardtrain/getting-started.md lib/cmake/shardtrain/shardtrainConfig.cmake \
         lib/cmake/shardtrain/shardtrainTargets.cmake include/shardtrain/ckpt/checkpoint.h lib/libshardtrain_ckpt.a \
         "share/modulefiles/shardtrain/$VERSION.lua"; do
  [ -e "$P/$f" ] || fail "not installed: $f"
done
[ -x "$P/share/shardtrain/jobscripts/run-training.sh" ] || fail "run-training.sh installed without its execute bit"
have_gpt2=0
[ -f "$P/share/shardtrain/data/gpt2/encoder.json" ] && have_gpt2=1

mkdir -p "$T/work" "$T/home"
cp "$SRC/tests/e2e/install/tiny.toml" "$T/work/deck.toml"
awk 'BEGIN { srand(5); split("the of and to a in that it was her she not be his as had with for he you", w, " ");
             for (l = 0; l < 400; ++l) { s = ""; for (i = 0; i < 9; ++i) s = s w[int(rand() * 20) + 1] " "; print s "." } }' \
  > "$T/work/text.txt"

# What the login shell runs: nothing of this build on PATH, no SHARDTRAIN_* variables but the module's.
cat > "$T/inner.sh" <<EOF
set -eo pipefail
fail() { echo "FAIL: \$*" >&2; exit 1; }
note() { echo "== \$*"; }
source $LMOD_INIT
module use $P/share/modulefiles
module load shardtrain
module list 2>&1 | grep -q "shardtrain/$VERSION" || fail "module list does not show shardtrain/$VERSION"
module help shardtrain 2>&1 | grep -q "fully sharded data-parallel training" || fail "module help"
module whatis shardtrain 2>&1 | grep -q "Version: $VERSION" || fail "module whatis"
[ "\$(command -v shardtrain)" = "$P/bin/shardtrain" ] || fail "shardtrain on PATH is '\$(command -v shardtrain)'"
[ "\$SHARDTRAIN_BIN" = "$P/bin/shardtrain" ] || fail "SHARDTRAIN_BIN='\$SHARDTRAIN_BIN'"
[ -f "\$SHARDTRAIN_HOME/jobscripts/run-training.sh" ] || fail "SHARDTRAIN_HOME='\$SHARDTRAIN_HOME' has no jobscripts/"
[ "\$OMPI_MCA_oob_tcp_keepalive_time" = 630 ] && [ "\$OMPI_MCA_oob_tcp_keepalive_probes" = 3 ] ||
  fail "the module sets no Open MPI OOB keepalive (time '\${OMPI_MCA_oob_tcp_keepalive_time:-}')"
cd $T/work

note "shardtrain --version"
shardtrain --version | tee version.txt
grep -Eq "^shardtrain $VERSION \\(git [^)]+\\); libtorch .*; HDF5 [0-9.]+ \\(parallel\\)" version.txt || fail "--version: \$(cat version.txt)"

note "data prepare and train from $T/work with the installed binary"
shardtrain data prepare --source text.txt --tokenizer byte --out data > prepare.log 2>&1 || { cat prepare.log; fail "data prepare"; }
$MPIEXEC $MPIFLAGS -np 2 shardtrain train deck.toml --set run.out_dir=run > train.log 2>&1 || { tail -30 train.log; fail "train"; }
[ -f run/checkpoints/step_00000004.h5 ] || { ls -R run; fail "no checkpoint run/checkpoints/step_00000004.h5"; }

note "the installed jobscripts (local.sh -> run-training.sh, SHARDTRAIN_BIN from the module)"
\$SHARDTRAIN_HOME/jobscripts/local.sh -np 2 deck.toml run.out_dir=run2 train.max_steps=2 > local.log 2>&1 ||
  { tail -30 local.log; fail "jobscripts/local.sh"; }
[ -f run2/checkpoints/step_00000002.h5 ] || fail "local.sh: no checkpoint at step 2"

if [ $have_gpt2 = 1 ]; then
  note "the GPT-2 tokenizer files come from the prefix"
  head -c 20000 text.txt > small.txt
  shardtrain data prepare --source small.txt --tokenizer gpt2 --out data-gpt2 > gpt2.log 2>&1 || { cat gpt2.log; fail "gpt2 prepare"; }
  mv $P/share/shardtrain/data/gpt2 $T/gpt2-aside
  if shardtrain data prepare --source small.txt --tokenizer gpt2 --out data-gpt2b > gpt2b.log 2>&1; then
    fail "data prepare with the prefix's gpt2/ moved aside succeeded: it read another data directory"
  fi
  grep -q "$P/share/shardtrain/data/gpt2" gpt2b.log || { cat gpt2b.log; fail "the error does not name the prefix's data directory"; }
  mv $T/gpt2-aside $P/share/shardtrain/data/gpt2
fi

note "a C++ program built with find_package(shardtrain) reads the checkpoint's metadata"
cmake -S $SRC/tests/e2e/install/consumer -B consumer -G Ninja -DCMAKE_BUILD_TYPE=Release > consumer-cmake.log 2>&1 ||
  { cat consumer-cmake.log; fail "configuring the consumer"; }
cmake --build consumer > consumer-build.log 2>&1 || { tail -40 consumer-build.log; fail "building the consumer"; }
./consumer/ckpt_meta run/checkpoints/step_00000004.h5 | tee meta.txt
grep -qx "step 4" meta.txt || fail "ckpt_meta: step"
grep -qx "strategy full_shard" meta.txt || fail "ckpt_meta: strategy"
grep -qxF "versions \$(cat version.txt)" meta.txt || fail "the checkpoint's versions differ from --version"
note "OK"
EOF
env -i HOME="$T/home" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb LANG=C.UTF-8 \
  OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  bash -l "$T/inner.sh"
echo "OK: installed, moved, loaded as a module; trained from another directory; find_package(shardtrain) read the checkpoint"
