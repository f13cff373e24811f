#!/usr/bin/env bash
# The README's test command: install what is missing, configure, build, run the whole suite.
#   scripts/test.sh                 default suite (what CI runs)
#   KILN_SANITIZE=ON scripts/test.sh   the same suite under ASan+UBSan (build-asan/)
#   scripts/test.sh -L slow         ctest arguments replace the default `-LE 'slow|fuzz-long'` (here: only slow tests)
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
# Default: everything but the labels slow (Fashion-MNIST, the portable build, add_subdirectory) and
# fuzz-long (10-minute fuzzer runs); pass ctest arguments to choose (e.g. -L slow, -L fuzz-long).
[ $# -eq 0 ] && set -- -LE 'slow|fuzz-long'
ctest --test-dir "$dir" --output-on-failure -j"$jobs" "$@"
