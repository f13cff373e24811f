#!/usr/bin/env bash
# The attention study (docs/attention_study.md): MHA, Diff and Diff V2 attention × standard and Block
# AttnRes residuals at equal parameters and equal training FLOPs, over seeds: char-level LM on fortunes
# (loss vs FLOPs, compute advantage, activation outliers, generation time), the same LM on a BPE
# tokenization kiln trains (task bpe), the lm bases trained to several budgets (task budgets: the
# compute advantage from several budgets), multi-query associative recall and needle in context.
# One driver for every table and figure:
#   scripts/attention_study.sh                           the full study (default scale, seeds 0,1,2;
#                                                        under an hour on 2 idle cores)
#   scripts/attention_study.sh --scale reduced           the reduced scale (about a sixth of the FLOPs; the committed run is the full one)
#   scripts/attention_study.sh --seeds 0,1,2,3,4 ...     more seeds; every other flag goes to
#                                                        example_attention_study (--help lists them)
#   OUT=dir PNG=prefix scripts/attention_study.sh        results folder (default examples/attention_study/results)
#                                                        and figure prefix (default docs/attention_study)
# The run is niced (NICE=0 to not), KILN_NUM_THREADS defaults to 2.
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
[ -f build/CMakeCache.txt ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"${JOBS:-2}" --target example_attention_study

out="${OUT:-examples/attention_study/results}"
mkdir -p "$out"
export KILN_NUM_THREADS="${KILN_NUM_THREADS:-2}" GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-1000}"
start=$(date +%s)
nice -n "${NICE:-10}" build/examples/example_attention_study --out "$out" "$@" 2>&1 | tee "$out/log.txt"
echo "study wall time (script): $(( $(date +%s) - start )) s" | tee -a "$out/log.txt"
# The Debian python3-matplotlib belongs to the system interpreter (a pyenv python3 may shadow it).
py=/usr/bin/python3; [ -x "$py" ] || py=python3
"$py" examples/attention_study/table.py "$out" > "$out/tables.md"
"$py" examples/attention_study/plot.py "$out" "${PNG:-docs/attention_study}"
