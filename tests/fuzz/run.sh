#!/usr/bin/env bash
# Runs one fuzzer for a while on a scratch copy of its seed corpus and prints the figures (executions,
# corpus, coverage) or the crash. Exits with the fuzzer's status: 0 when nothing was found.
# usage: run.sh FUZZER SECONDS SEED_DIR WORK_DIR ARTIFACT_PREFIX [libFuzzer flags...]
set -uo pipefail
fuzzer=$1 seconds=$2 seeds=$3 work=$4 artifacts=$5
shift 5
rm -rf "$work" && mkdir -p "$work" "$(dirname "$artifacts")"
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$artifacts" "$@" "$work" "$seeds" > "$work.log" 2>&1
status=$?
if [ $status -eq 0 ]; then
  grep -E '^Done [0-9]+ runs|stat::number_of_executed_units|stat::new_units_added|cov:' "$work.log" | tail -4
else
  grep -E -B2 -A30 'ERROR|runtime error|fuzz property|terminate called' "$work.log" | head -60
  echo "the input is in ${artifacts}crash-* (see $work.log)"
fi
exit $status
