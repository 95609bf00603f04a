# Helpers of the I/O fault tests (sourced after lib.sh): small tmpfs mounts the test makes
# and removes on every exit path, and checks of a run that must end with a given exit code.
SKIP=77
MOUNTS=()
io_cleanup() {
  local m
  for m in "${MOUNTS[@]}"; do umount -l "$m" 2>/dev/null || true; done
  cleanup
}
trap io_cleanup EXIT

# tmpfs DIR SIZE: a fresh tmpfs of SIZE (mount's syntax, e.g. 900k) at DIR; skips the test
# (exit 77) with the reason when mounts are not allowed here (not root, no CAP_SYS_ADMIN).
tmpfs() {
  mkdir -p "$1"
  local why
  if ! why=$(mount -t tmpfs -o "size=$2,mode=0755" tmpfs "$1" 2>&1); then
    echo "SKIP: cannot mount a tmpfs at $1 ($why): this test needs root with CAP_SYS_ADMIN"
    exit $SKIP
  fi
  MOUNTS+=("$1")
}
# resize DIR SIZE: the tmpfs at DIR gets SIZE (its files stay).
resize() { mount -o "remount,size=$2" "$1" || fail "cannot resize the tmpfs at $1"; }
# fill DIR FREE_BYTES: a filler file that leaves about FREE_BYTES free on DIR's file system.
fill() {
  local avail
  avail=$(( $(stat -f -c '%a * %S' "$1") ))
  (( avail > $2 )) || return 0
  head -c $(( avail - $2 )) /dev/zero > "$1/filler" 2>/dev/null || true
}
free_bytes() { echo $(( $(stat -f -c '%a * %S' "$1") )); }

# train_limited NP OUT SECONDS [--set ...]: `train` under `timeout`, so a hang fails the test
# (RC 124) instead of stalling the suite; ELAPSED = seconds it took. The output is appended
# to $LOG if set (an out_dir whose own file system must not get it), else to OUT.log. Each
# rank's own exit code goes to $T/rcs ("rank code" lines): mpirun reports only one.
train_limited() {
  local np=$1 out=$2 limit=$3; shift 3
  local t0=$SECONDS log=${LOG:-$out.log}
  : > "$T/rcs"
  RANKS=$np
  set +e
  # orte_abort_on_non_zero_status=0: mpirun must not kill the other ranks when the first one
  # exits 5, so that each rank's own exit code can be seen (a hang is still ended by timeout).
  OMPI_MCA_orte_abort_on_non_zero_status=0 timeout -k 5 "$limit" "$MPIEXEC" "${MPIFLAGS[@]}" -np "$np" bash -c \
    '"$0" "$@"; rc=$?; echo "$OMPI_COMM_WORLD_RANK $rc" >> '"$T/rcs"'; exit $rc' \
    "$ST" train "$DECK" --set "data.dataset=$T/data" --set "run.out_dir=$out" "$@" >> "$log" 2>&1
  RC=$?
  set -e
  ELAPSED=$(( SECONDS - t0 ))
}
# expect_rc CODE LOGFILE WHAT: the last train_limited ended with CODE, on every rank.
expect_rc() {
  if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then tail -30 "$2"; fail "$3: killed by timeout after ${ELAPSED}s (a hang)"; fi
  # (with orte_abort_on_non_zero_status=0 mpirun itself may exit 0: the ranks' codes count)
  [ "$RC" = "$1" ] || [ "$RC" = 0 ] || { tail -30 "$2"; fail "$3: mpirun exit $RC, expected $1"; }
  local n
  n=$(awk -v c="$1" '$2 == c' "$T/rcs" | wc -l)
  [ "$n" = "$RANKS" ] || { tail -30 "$2"; cat "$T/rcs"; fail "$3: $n of $RANKS ranks exited $1"; }
}
# no_steps LOGFILE: the run ended before its first training step (no step line was printed).
no_steps() { ! grep -q '^step ' "$1" || { grep '^step ' "$1" | head -3; fail "$1: trained before failing"; }; }
