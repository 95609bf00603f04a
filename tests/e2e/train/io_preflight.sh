# Start-up checks (ckpt::preflight): a read-only checkpoint directory, a `latest` that is a
# directory, and a file system too small for one checkpoint each end the job with exit 2,
# naming the directory and the reason, before the first training step.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/io_lib.sh"
NP=2
LIMIT=60
make_dataset

note "read-only checkpoint directory (a read-only remount: chmod does not stop root)"
tmpfs "$T/ro" 4m
mount -o remount,ro "$T/ro" || fail "cannot remount $T/ro read-only"
train_limited $NP "$T/R" $LIMIT --set checkpoint.dir="$T/ro"
expect_rc 2 "$T/R.log" "read-only checkpoint.dir"
no_steps "$T/R.log"
# (the run-directory lock, created first, or the preflight's probe names it)
grep -Eq "^error: .*(checkpoint.dir $T/ro is not writable|$T/ro/shardtrain.lock of checkpoint.dir): Read-only file system" "$T/R.log" ||
  { grep error "$T/R.log"; fail "the message does not name the read-only directory and the reason"; }

note "read-only run.out_dir"
mkdir -p "$T/ok.ck"
LOG=$T/W.log train_limited $NP "$T/ro/out2" $LIMIT --set checkpoint.dir="$T/ok.ck"
expect_rc 2 "$T/W.log" "read-only run.out_dir"
no_steps "$T/W.log"
grep -q "$T/ro/out2" "$T/W.log" || { grep error "$T/W.log"; fail "the message does not name run.out_dir"; }

note "checkpoint.dir/latest is a directory"
mkdir -p "$T/L.ck/latest"
train_limited $NP "$T/L" $LIMIT --set checkpoint.dir="$T/L.ck"
expect_rc 2 "$T/L.log" "latest a directory"
no_steps "$T/L.log"
grep -q "^error: .*$T/L.ck/latest is a directory" "$T/L.log" || { grep error "$T/L.log"; fail "the message does not name latest"; }

note "too little free space for one checkpoint"
tmpfs "$T/small" 64k
train_limited $NP "$T/S" $LIMIT --set checkpoint.dir="$T/small"
expect_rc 2 "$T/S.log" "tiny checkpoint.dir"
no_steps "$T/S.log"
grep -q "^error: .*checkpoint.dir $T/small has too little free space for one checkpoint: [0-9]* bytes needed .*, [0-9]* available" "$T/S.log" ||
  { grep error "$T/S.log"; fail "the message does not give the directory, the bytes needed and available"; }
note "OK: read-only directories, a directory named latest and a too small file system end the job before step 1"
