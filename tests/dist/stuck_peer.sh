#!/usr/bin/env bash
# A peer stuck without dying: every blocking collective gives up after KILN_DIST_TIMEOUT seconds with a
# message naming the op and the rank, and the job ends (non-zero) long before the peer would wake.
#   stuck_peer.sh MPIRUN STUCK_PEER_BINARY WORK_DIR
set -u
mpirun=$1 prog=$2 dir=$3
mkdir -p "$dir"
fail=0
for run in "all_reduce on" "broadcast off" "all_gather off" "reduce_scatter off" "barrier on" "scalars off"; do
  set -- $run
  out="$dir/$1-$2.txt"
  start=$(date +%s%N)
  KILN_DIST_TIMEOUT=2 timeout 100 "$mpirun" -np 2 --oversubscribe --bind-to none "$prog" "$1" "$2" > "$out" 2>&1
  rc=$?
  elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "== $1, consistency check $2: mpirun exited with $rc after $elapsed_ms ms"
  cat "$out"
  want="${1/scalars/all_reduce}: not complete after 2 s on rank 0 of 2: a peer is stuck or gone"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "FAIL: $1: expected a non-zero exit before the 100 s limit, got $rc"; fail=1; }
  [ "$elapsed_ms" -lt 30000 ] || { echo "FAIL: $1: the job took $elapsed_ms ms (limit 2 s, the peer sleeps 60 s)"; fail=1; }
  grep -q "$want" "$out" || { echo "FAIL: $1: no '$want' in the output"; fail=1; }
done
exit $fail
