#!/usr/bin/env bash
# KILN_PROFILE=1 under mpirun: each rank writes its own Chrome trace, <path>.rank<r> (the scheme of
# `kiln train --profile`), whose events all have "pid" = the rank; no rank writes <path> itself.
#   profile_ranks.sh MPIRUN TEST_DIST_BINARY WORK_DIR
set -u
mpirun=$1 prog=$(readlink -f "$2") dir=$3
python=${KILN_PYTHON:-/usr/bin/python3}
[ -x "$python" ] || { echo "SKIP: no $python to read the traces"; exit 77; }
rm -rf "$dir" && mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
fail=0
# Each trace: valid JSON; every event's pid is the rank; the process is named after it; ops recorded.
check() {  # check TRACE RANK
  "$python" - "$1" "$2" <<'PY' || fail=1
import json, sys
path, rank = sys.argv[1], int(sys.argv[2])
ev = json.load(open(path))["traceEvents"]
pids = sorted({e["pid"] for e in ev})
names = [e["args"]["name"] for e in ev if e.get("name") == "process_name"]
ops = sum(1 for e in ev if e.get("cat") == "op")
print(f"{path}: {len(ev)} events, pids {pids}, process {names}, {ops} ops")
ok = pids == [rank] and names == [f"kiln rank {rank}"] and ops > 0
if not ok:
    print(f"FAIL: {path}: expected every pid = {rank}, the process named 'kiln rank {rank}' and some ops")
sys.exit(0 if ok else 1)
PY
}
# run DIR TRACE [VAR=VALUE...]: the [async] cases on 2 ranks in DIR with KILN_PROFILE=1; then
# TRACE.rank0 and TRACE.rank1 must be there and checked, and TRACE itself absent.
run() {
  local wd=$1 trace=$2 rc
  shift 2
  mkdir -p "$wd"
  (cd "$wd" && env KILN_PROFILE=1 "$@" timeout 100 "$mpirun" -np 2 --oversubscribe --bind-to none "$prog" --use-colour no "[async]~*Cuda*") \
    > "$dir/out.txt" 2>&1
  rc=$?
  [ $rc -eq 0 ] || { cat "$dir/out.txt"; echo "FAIL: mpirun exited with $rc"; fail=1; }
  for r in 0 1; do
    if [ -f "$wd/$trace.rank$r" ]; then check "$wd/$trace.rank$r" $r; else echo "FAIL: no $wd/$trace.rank$r"; fail=1; fi
    grep -q "Chrome trace written to .*$trace.rank$r" "$dir/out.txt" || { echo "FAIL: rank $r does not say where its trace went"; fail=1; }
  done
  [ ! -e "$wd/$trace" ] || { echo "FAIL: $wd/$trace was written (one file for every rank)"; fail=1; }
}
run "$dir/out" trace.json KILN_PROFILE_OUT="$dir/out/trace.json"  # KILN_PROFILE_OUT given
run "$dir/cwd" kiln-profile.json                                    # the default name, in the working directory
exit $fail
