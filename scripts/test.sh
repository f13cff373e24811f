#!/usr/bin/env bash
# The README's test command: install what is missing, configure, build, run the whole suite.
#   scripts/test.sh                 default suite (what CI runs)
#   KILN_SANITIZE=ON scripts/test.sh   the same suite under ASan+UBSan (build-asan/)
#   scripts/test.sh -L slow         ctest arguments replace the default `-LE 'slow|fuzz-long|sanitize'` (here: only slow tests)
# The sanitized suite is not part of the default run (about 90 min to build, 55 to run on 2 shared cores): the
# label sanitize holds one test that runs `KILN_SANITIZE=ON scripts/test.sh` (tests/sanitize), run
# periodically with `scripts/test.sh -L sanitize`. Under KILN_SANITIZE=ON this script points ASan, UBSan
# and LeakSanitizer at tests/sanitize/ (options and the suppressions of third-party leaks); options
# of your own in ASAN_OPTIONS / UBSAN_OPTIONS / LSAN_OPTIONS come after them and win.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --python --data  # PyTorch for the parity tests, Fashion-MNIST for the examples' tests
san="${KILN_SANITIZE:-OFF}"
dir=build
[ "$san" = "ON" ] && dir=build-asan
jobs="$(nproc)"
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKILN_SANITIZE="$san" -DKILN_BUILD_TESTS=ON -DKILN_BUILD_EXAMPLES=ON -DKILN_BUILD_BENCH=OFF
cmake --build "$dir" -j"$jobs"
export KILN_NUM_THREADS="${KILN_NUM_THREADS:-2}"
# ctest -j runs several test programs at once, each with KILN_NUM_THREADS threads: more threads than
# cores. libgomp's default barrier spin then costs ~10x; a short spin keeps the suite fast.
[ -z "${OMP_WAIT_POLICY:-}" ] && export GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-1000}"
# Sanitized: LeakSanitizer on, with the suppressions of tests/sanitize/lsan.supp (Open MPI's own leaks;
# they match its libraries up the stack, which takes the full unwinder: fast_unwind_on_malloc=0); a
# UBSan finding stops the program with its stack (the build has -fno-sanitize-recover=undefined).
if [ "$san" = "ON" ]; then
  supp="$PWD/tests/sanitize"
  export ASAN_OPTIONS="detect_leaks=1:fast_unwind_on_malloc=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
fi
# Default: everything but the labels slow (Fashion-MNIST, the portable build, add_subdirectory),
# fuzz-long (10-minute fuzzer runs) and sanitize (this suite again under ASan+UBSan); pass ctest
# arguments to choose (e.g. -L slow, -L fuzz-long, -L sanitize).
[ $# -eq 0 ] && set -- -LE 'slow|fuzz-long|sanitize'
ctest --test-dir "$dir" --output-on-failure -j"$jobs" "$@"
