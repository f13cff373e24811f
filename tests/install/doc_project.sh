#!/usr/bin/env bash
# A docs page as a project outside the tree (docs/tutorial.md): its ```cmake block becomes CMakeLists.txt
# and its ```cpp blocks, in order, train.cpp of an empty folder, built against an installed kiln and
# run with each of the given argument lists (";"-separated, e.g. "cpu;reference").
# usage: doc_project.sh PAGE.md PREFIX WORK_DIR RUNS
set -euo pipefail
page=$1 prefix=$2 work=$3 runs=$4
rm -rf "$work" && mkdir -p "$work"
awk -v dir="$work" '
  /^```cmake$/ { out = dir "/CMakeLists.txt"; n_cmake++; next }
  /^```cpp$/   { out = dir "/train.cpp"; next }
  /^```/       { out = ""; next }
  out != ""    { print > out }
  END { if (n_cmake != 1) { print "expected one ```cmake block, found " n_cmake > "/dev/stderr"; exit 1 } }
' "$page"
[ -s "$work/train.cpp" ] || { echo "no C++ in $page"; exit 1; }
cmake -S "$work" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" >/dev/null
IFS=';' read -ra list <<< "$runs"
for args in "${list[@]}"; do
  echo "== build/train $args"
  # shellcheck disable=SC2086
  "$work/build/train" $args
done
