#!/usr/bin/env bash
# CPU time of the main job's build (issue 26, item 5): configure a fresh build folder as
# scripts/train_demo.sh does (its cmake options by default; others given as arguments replace them),
# build the `kiln` command line with ccache off, and time every compiler call through a launcher.
# Prints the CPU seconds (user + sys) of the whole build, the wall time, and the TOP (default 10) slowest
# translation units. CPU time barely moves with other work on the machine; the wall time does.
#   bench/compile_time.sh                          the lean build train_demo.sh runs
#   bench/compile_time.sh -DKILN_WITH_REFERENCE=ON -DKILN_UNITY_BUILD=OFF -DKILN_COLD_OPT=   before
# The build folder is a temporary one, removed at the end. Figures in bench/RESULTS.md.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d /tmp/kiln-compile-time.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cat >"$work/launch.sh" <<LAUNCH
#!/usr/bin/env bash
out=""; prev=""
for a in "\$@"; do [ "\$prev" = "-o" ] && out="\$a"; prev="\$a"; done
exec /usr/bin/time -a -o "$work/calls.log" -f "%U %S %e \$out" "\$@"
LAUNCH
chmod +x "$work/launch.sh"
[ -x /usr/bin/time ] || { echo "compile_time.sh: needs /usr/bin/time (Debian package time)" >&2; exit 2; }
opts=(-DKILN_WITH_REFERENCE=OFF -DKILN_UNITY_BUILD=ON -DKILN_COLD_OPT=-O1)
[ $# -gt 0 ] && opts=("$@")
export CCACHE_DISABLE=1
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_CUDA=OFF -DKILN_BUILD_TESTS=OFF \
  -DKILN_BUILD_EXAMPLES=OFF -DKILN_BUILD_BENCH=OFF "${opts[@]}" -DCMAKE_CXX_COMPILER_LAUNCHER="$work/launch.sh" >/dev/null
start=$(date +%s%N)
cmake --build "$work/build" -j"$(nproc)" --target kiln_cli >/dev/null
wall_ms=$((($(date +%s%N) - start) / 1000000))
awk -v wall="$wall_ms" -v cores="$(nproc)" '{ cpu += $1 + $2 } END {
  printf "compiler calls: %d, CPU time %.1f s (user + sys), wall %.1f s on %d cores\n", NR, cpu, wall / 1000, cores }' "$work/calls.log"
echo "slowest translation units (CPU s):"
awk '{ printf "  %6.2f  %s\n", $1 + $2, $4 }' "$work/calls.log" | sed 's|CMakeFiles/[a-z_]*\.dir/||' | sort -rn | head -${TOP:-10}
