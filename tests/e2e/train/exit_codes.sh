#!/usr/bin/env bash
# Exit codes, command by command, against the one table in docs/troubleshooting.md ("Exit
# codes"): every command that reads input gets bad input (2); every command that writes an
# output gets one in a directory that does not exist and one in a directory it may not write
# (2, before any work, naming the directory, nothing left); a write the storage refuses once the
# work runs (a full file system) is 5. Singleton processes (no mpirun); each under `timeout`.
# Usage: exit_codes.sh SHARDTRAIN MPIEXEC [mpirun flags...]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/io_lib.sh"
TMO=60
CASES=0

# code CODE TEXT CMD...: the command exits CODE within $TMO s with TEXT on stderr (one
# "error:" line for 2 and 5).
code() {
  local want_rc=$1 want=$2; shift 2
  CASES=$((CASES + 1))
  set +e
  timeout -k 5 "$TMO" "$@" > "$T/case.out" 2> "$T/case.err" < /dev/null
  local rc=$?
  set -e
  [ "$rc" != 124 ] && [ "$rc" != 137 ] || fail "did not end within $TMO s: $*"
  [ "$rc" = "$want_rc" ] || { tail -5 "$T/case.out"; cat "$T/case.err"; fail "exit $rc, expected $want_rc: $*"; }
  if [ "$want_rc" != 0 ]; then
    grep -q '^error: ' "$T/case.err" && [ "$(grep -c '^error: ' "$T/case.err")" = 1 ] ||
      { cat "$T/case.err"; fail "not one 'error:' line: $*"; }
  fi
  grep -qF -- "$want" "$T/case.err" || { cat "$T/case.err"; fail "stderr lacks '$want': $*"; }
  note "exit $rc: $*"
}
absent() { for p in "$@"; do [ ! -e "$p" ] || fail "a refused command left $p"; done; }

make_dataset
"$ST" train "$DECK" --set "data.dataset=$T/data" --set "run.out_dir=$T/run" --set train.max_steps=2 \
  --set lr.decay_steps=2 --set lr.warmup_steps=1 > "$T/run.log" 2>&1 || { tail -20 "$T/run.log"; fail "training"; }
CK=$(ls "$T"/run/checkpoints/step_*.h5 | tail -n 1)
"$ST" ckpt export "$CK" "$T/model.safetensors" > /dev/null
printf 'hello\n' > "$T/in.txt"

note "bad input: 2, every command"
code 2 "model.n_layers" "$ST" deck check "$DECK" --set model.n_layers=0
code 2 "model.n_layers" "$ST" deck show "$DECK" --set model.n_layers=0
code 2 "model.n_layers" "$ST" train "$DECK" --set model.n_layers=0 --set "run.out_dir=$T/r0"
code 2 "model.n_layers" "$ST" eval "$DECK" --set model.n_layers=0 --set "checkpoint.resume=$CK"
code 2 "model.n_layers" "$ST" plan "$DECK" --set model.n_layers=0 --ranks 2
code 2 "model.n_layers" "$ST" maxbatch "$DECK" --set model.n_layers=0
code 2 "$T/nope.h5" "$ST" generate "$T/nope.h5" --prompt x
code 2 "$T/nope.h5" "$ST" ckpt inspect "$T/nope.h5"
code 2 "$T/nope.h5" "$ST" ckpt verify "$T/nope.h5"
code 2 "$T/nope.h5" "$ST" ckpt consolidate "$T/nope.h5" "$T/c.h5"
code 2 "$T/nope.h5" "$ST" ckpt export "$T/nope.h5" "$T/e.safetensors"
code 2 "$T/nope.safetensors" "$ST" ckpt import "$T/nope.safetensors" "$T/i.h5" --deck "$DECK"
code 2 "$T/nope.txt" "$ST" data prepare --tokenizer byte --source "$T/nope.txt" --out "$T/ds"
code 2 "$T/nope.txt" "$ST" data encode --tokenizer byte "$T/nope.txt" "$T/enc.bin"
code 2 "$T/nope" "$ST" data info "$T/nope"
code 2 "$T/nope" "$ST" report "$T/nope"
absent "$T/r0" "$T/c.h5" "$T/e.safetensors" "$T/i.h5" "$T/ds" "$T/enc.bin"

note "an output in a directory that does not exist: 2 before any work, naming it, whichever command"
M=$T/missing/dir
code 2 "its directory $M does not exist" "$ST" ckpt import "$T/model.safetensors" "$M/i.h5" --deck "$DECK"
code 2 "its directory $M does not exist" "$ST" ckpt consolidate "$CK" "$M/c.h5"
code 2 "its directory $M does not exist" "$ST" ckpt export "$CK" "$M/e.safetensors"
code 2 "its directory $M does not exist" "$ST" ckpt export --format hf "$CK" "$M/hf"
code 2 "its directory $M does not exist" "$ST" deck reference --output "$M/ref.md"
code 2 "its directory $M does not exist" "$ST" data encode --tokenizer byte "$T/in.txt" "$M/enc.bin"
absent "$T/missing"

note "an output where this process may not write (a read-only file system): 2 before any work"
tmpfs "$T/ro" 1m
mount -o remount,ro "$T/ro" || fail "cannot remount $T/ro read-only"
code 2 "its directory $T/ro is not writable: Read-only file system" "$ST" ckpt import "$T/model.safetensors" "$T/ro/i.h5" --deck "$DECK"
code 2 "its directory $T/ro is not writable: Read-only file system" "$ST" ckpt consolidate "$CK" "$T/ro/c.h5"
code 2 "its directory $T/ro is not writable: Read-only file system" "$ST" ckpt export "$CK" "$T/ro/e.safetensors"
code 2 "its directory $T/ro is not writable: Read-only file system" "$ST" ckpt export --format hf "$CK" "$T/ro/hf"
code 2 "its directory $T/ro is not writable: Read-only file system" "$ST" data encode --tokenizer byte "$T/in.txt" "$T/ro/enc.bin"

note "a write the storage refuses once the work runs (a full file system): 5, nothing left behind"
tmpfs "$T/full" 64k
code 5 "No space left on device" "$ST" ckpt consolidate "$CK" "$T/full/c.h5"
code 5 "No space left on device" "$ST" ckpt export "$CK" "$T/full/e.safetensors"
code 5 "No space left on device" "$ST" ckpt import "$T/model.safetensors" "$T/full/i.h5" --deck "$DECK"
[ -z "$(ls -A "$T/full")" ] || { ls -la "$T/full"; fail "a failed write left files behind"; }

note "$CASES commands: exit codes as docs/troubleshooting.md's table says"
