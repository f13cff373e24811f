#!/bin/sh
# Mixed precision on the Cpu: bf16 vs f32 matmuls on the d_model 256 model's shapes (bench_amp), then
# whole `kiln train` steps with "precision": "f32" vs "bf16" (train_amp.py). BUILD: a build directory
# configured with -DKILN_BUILD_BENCH=ON (default build/).
set -e
BUILD="${BUILD:-build}"
here=$(dirname "$0")
export KILN_NUM_THREADS="${KILN_NUM_THREADS:-2}"
cmake --build "$BUILD" --target bench_amp kiln_cli -j2 >/dev/null
"$BUILD/bench_amp" 20
/usr/bin/python3 "$here/train_amp.py" --kiln "$BUILD/kiln" "$@"
