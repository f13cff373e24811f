#!/usr/bin/env bash
# No macro without the KILN_ prefix leaks out of kiln's public headers: the macros defined by a file
# that includes every installed header, less those its external includes (std, fmt, nlohmann) define.
# usage: macros.sh PREFIX WORK_DIR
set -euo pipefail
prefix=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
inc="$prefix/include"
find "$inc/kiln" -name '*.hpp' | sort > "$work/headers"
[ "$(wc -l < "$work/headers")" -ge 40 ] || { echo "too few headers under $inc/kiln"; exit 1; }
# External includes of the public headers (and of the generated ones).
xargs cat < "$work/headers" | sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\([^>]*\)>.*/\1/p' | grep -v '^kiln/' | sort -u |
  sed 's/.*/#include <&>/' > "$work/base.cpp"
{ cat "$work/base.cpp"; sed "s|^$inc/||; s/.*/#include <&>/" "$work/headers"; } > "$work/all.cpp"
flags=(-std=c++20 -I"$inc" -dM -E)
g++ "${flags[@]}" "$work/base.cpp" | awk '{print $2}' | sed 's/(.*//' | sort -u > "$work/base.macros"
g++ "${flags[@]}" "$work/all.cpp" | awk '{print $2}' | sed 's/(.*//' | sort -u > "$work/all.macros"
leaks=$(comm -13 "$work/base.macros" "$work/all.macros" | grep -v '^KILN_' || true)
kiln=$(comm -13 "$work/base.macros" "$work/all.macros" | grep -c '^KILN_' || true)
echo "$(wc -l < "$work/headers") headers define $kiln KILN_ macros"
if [ -n "$leaks" ]; then
  echo "macros without the KILN_ prefix:"; echo "$leaks"; exit 1
fi
