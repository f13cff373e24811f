#!/usr/bin/env bash
# A failure can never read as a skip (tests/catch_main.cpp): CTest takes exit 77 for "skipped".
#   exit_status.sh TEST_RUNNER_EXIT     (tests/runner/exit_status.cpp)
set -u
exe="$1"
"$exe" "[runner-exit]" > /dev/null 2>&1
rc=$?
[ "$rc" -eq 1 ] || { echo "a run with 77 failed assertions exited $rc, want 1"; exit 1; }
# With KILN_REQUIRE_GPU=1 (scripts/gpu_run.sh) a CUDA test never skips: it passes on a GPU (0) or fails.
out="$(KILN_REQUIRE_GPU=1 "$exe" "[cuda]" 2>&1)"
rc=$?
[ "$rc" -ne 77 ] || { echo "KILN_REQUIRE_GPU=1 and the CUDA cases exited 77 (skipped): $out"; exit 1; }
if [ "$rc" -ne 0 ]; then
  [[ "$out" == *"KILN_REQUIRE_GPU=1 and no CUDA device"* ]] || { echo "KILN_REQUIRE_GPU=1 failed without saying why (rc $rc): $out"; exit 1; }
fi
# Without it, the CUDA case skips where no device is usable (77) or passes (0).
"$exe" "[cuda]" > /dev/null 2>&1
rc=$?
[ "$rc" -eq 77 ] || [ "$rc" -eq 0 ] || { echo "the CUDA cases without KILN_REQUIRE_GPU exited $rc, want 77 or 0"; exit 1; }
echo "runner exit status: ok"
