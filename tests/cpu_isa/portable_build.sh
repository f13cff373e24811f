#!/usr/bin/env bash
# The portable build (KILN_NATIVE=OFF), configured and built beside a native one, then its portable
# tests (label portable: AVX only in the AVX2 / AVX-512 variants; those agree; kiln train on an emulated
# CPU without AVX).
#   portable_build.sh SOURCE_DIR BUILD_DIR CXX_COMPILER BUILD_TYPE
set -euo pipefail
src=$1
dir=$2
cxx=$3
type=${4:-Release}
command -v qemu-x86_64 > /dev/null || { echo "SKIP: qemu-x86_64 not found (apt-get install qemu-user)"; exit 77; }
cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE="$type" -DCMAKE_CXX_COMPILER="$cxx" -DKILN_NATIVE=OFF -DKILN_WITH_CUDA=OFF \
  -DKILN_BUILD_TESTS=ON -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_EXAMPLES=OFF -DKILN_INSTALL=OFF > "$dir.configure.log" 2>&1 ||
  { cat "$dir.configure.log"; exit 1; }
cmake --build "$dir" -j"$(nproc)" --target kiln_cli test_cpu_isa
ctest --test-dir "$dir" -L portable --output-on-failure --no-tests=error
ctest --test-dir "$dir" -R "cpu_isa: (the )?AVX-512" --output-on-failure --no-tests=error
