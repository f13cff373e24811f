#!/usr/bin/env bash
# The installed library as a user sees it (CTest: "install: ..."):
#   1. `cmake --install` into a fresh prefix whose path has a space, then move the prefix (relocatable);
#   2. examples/consumer/ (a separate CMake project: find_package(kiln 0.2 REQUIRED CONFIG)) configures,
#      builds and runs against the moved prefix;
#   3. without fmt, find_package(kiln) fails naming the Debian package libfmt-dev;
#   4. the same train.cpp once more with the pkg-config line, and the `kiln` command from the prefix;
#   5. prints how long train.cpp takes to compile against the installed headers (no assertion).
# usage: consumer.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build=$1 src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
first="$work/first prefix" moved="$work/moved prefix"
cmake --install "$build" --prefix "$first" >/dev/null
mv "$first" "$moved"

echo "== CMake: find_package(kiln) from '$moved'"
cmake -S "$src/examples/consumer" -B "$work/consumer build" -DCMAKE_PREFIX_PATH="$moved" -DCMAKE_BUILD_TYPE=Release >/dev/null
start=$(date +%s.%N)
cmake --build "$work/consumer build" >/dev/null
end=$(date +%s.%N)
"$work/consumer build/train"

echo "== a missing dependency names its Debian package"
if cmake -S "$src/examples/consumer" -B "$work/no fmt" -DCMAKE_PREFIX_PATH="$moved" -DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON > "$work/no-fmt.log" 2>&1; then
  echo "configured without fmt"; exit 1
fi
grep -q "install the Debian package 'libfmt-dev'" "$work/no-fmt.log" || { cat "$work/no-fmt.log"; exit 1; }
grep -o "kiln needs the fmt library: install the Debian package 'libfmt-dev'" "$work/no-fmt.log"

echo "== pkg-config"
export PKG_CONFIG_PATH="$moved/lib/pkgconfig"
pkg-config --modversion kiln
# pkg-config escapes the spaces of the path with backslashes: eval reads them back, as make's shell does.
eval "g++ -std=c++20 -O2 \"$src/examples/consumer/train.cpp\" -o \"$work/train-pc\" $(pkg-config --cflags --libs kiln)"
"$work/train-pc"

echo "== the kiln command"
"$moved/bin/kiln" --version

awk -v s="$start" -v e="$end" 'BEGIN { printf "compile + link of examples/consumer/train.cpp with CMake: %.1f s\n", e - s }'
