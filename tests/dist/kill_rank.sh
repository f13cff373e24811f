#!/usr/bin/env bash
# A rank killed mid-step ends the job within seconds, non-zero, naming it; the last checkpoint is intact.
#   kill_rank.sh MPIRUN KILL_RANK_BINARY WORK_DIR
set -u
mpirun=$1 prog=$2 dir=$3
mkdir -p "$dir" && rm -f "$dir/ck.safetensors"
start=$(date +%s%N)
timeout 120 "$mpirun" -np 2 --oversubscribe --bind-to none "$prog" "$dir/ck.safetensors" > "$dir/out.txt" 2>&1
rc=$?
end_ms=$(( $(date +%s%N) / 1000000 ))
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
cat "$dir/out.txt"
kill_ms=$(sed -n 's/.*kills itself.* at \([0-9]*\) ms.*/\1/p' "$dir/out.txt" | head -1)
echo "kill_rank.sh: mpirun exited with $rc after ${elapsed_ms} ms, $(( end_ms - ${kill_ms:-0} )) ms after the kill"
fail=0
[ "$rc" -ne 0 ] || { echo "FAIL: the job exited 0"; fail=1; }
[ "$rc" -ne 124 ] || { echo "FAIL: the job hung (killed by timeout after 120 s)"; fail=1; }
[ -n "${kill_ms:-}" ] || { echo "FAIL: rank 1 did not reach its kill"; fail=1; }
[ -z "${kill_ms:-}" ] || [ $(( end_ms - kill_ms )) -lt 10000 ] || { echo "FAIL: the job ended $(( end_ms - kill_ms )) ms after the kill (limit 10 s)"; fail=1; }
grep -Eq "process rank 1 .*(signal 9|Killed)|rank 1 .*(signal 9|Killed)" "$dir/out.txt" || { echo "FAIL: no message names rank 1"; fail=1; }
grep -q "checkpoint of step 2" "$dir/out.txt" || { echo "FAIL: rank 0 did not checkpoint steps 1 and 2 before the kill"; fail=1; }
"$prog" --verify "$dir/ck.safetensors" || { echo "FAIL: the last checkpoint is not intact"; fail=1; }
exit $fail
