#!/usr/bin/env bash
# The attention study (docs/attention_study.md): MHA vs Diff attention × standard vs Block AttnRes
# residuals at equal parameter count, on char-level LM (fortunes) and multi-query associative recall.
#   scripts/attention_study.sh                       the committed study (~15 min on 2 shared cores)
#   scripts/attention_study.sh --lm-steps 100 ...    extra flags go to example_attention_study (--help)
#   OUT=dir scripts/attention_study.sh               results folder (default examples/attention_study/results)
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
need=()
for p in fortunes python3-matplotlib; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${need[@]}"
fi
cmake -S . -B build -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"${JOBS:-2}" --target example_attention_study

out="${OUT:-examples/attention_study/results}"
mkdir -p "$out"
export KILN_NUM_THREADS="${KILN_NUM_THREADS:-2}" GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-1000}"
start=$(date +%s)
build/examples/example_attention_study --out "$out" "$@" 2>&1 | tee "$out/log.txt"
echo "study wall time (script): $(( $(date +%s) - start )) s" | tee -a "$out/log.txt"
# The Debian python3-matplotlib belongs to the system interpreter (a pyenv python3 may shadow it).
py=/usr/bin/python3; [ -x "$py" ] || py=python3
"$py" examples/attention_study/plot.py "$out" "${PNG:-docs/attention_study.png}"
