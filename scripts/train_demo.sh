#!/usr/bin/env bash
# The README's main job: train a small character-level GPT on the fortune cookie corpus of Debian's
# `fortunes` package, with a progress bar, draw its training curves (out/char_gpt/curves.png), then
# sample from it.
#   scripts/train_demo.sh                  full run (2,600 steps, or those that fit in train.json's 280 s)
#   STEPS=50 scripts/train_demo.sh         shorter
#   DEVICE=cuda scripts/train_demo.sh      on the GPU (kiln built with the CUDA backend, a GPU visible)
#   KILN_DEMO_BUILD=DIR KILN_DEMO_OUT=DIR   other build and output folders (the suite's lean-build test)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --main  # the build set only; scripts/test.sh's setup adds the test tools
dpkg-query -W -f='${Status}' fortunes 2>/dev/null | grep -q "install ok installed" || {
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q fortunes
}
# Only what the job runs: the `kiln` command line. On the CPU, without the CUDA backend (compiling its
# kernels for GPUs the machine may not have took most of a fresh clone's wait), in a build directory
# of its own so that scripts/test.sh's full build (CUDA and the emulated device included) stays
# incremental; DEVICE=cuda uses the full build.
if [ "${DEVICE:-cpu}" = "cuda" ]; then
  build=build
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
else
  build="${KILN_DEMO_BUILD:-build-cpu}"
  # The lean build (CMakeLists.txt): the Cpu backend alone, the library outside the kernels in unity
  # batches at -O1 (the kernels keep -O3; same results), 0.45 of the default build's CPU time
  # (bench/RESULTS.md, "Compile time of the main job").
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_CUDA=OFF -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_EXAMPLES=OFF \
    -DKILN_BUILD_BENCH=OFF -DKILN_WITH_REFERENCE=OFF -DKILN_UNITY_BUILD=ON -DKILN_COLD_OPT=-O1 >/dev/null
fi
cmake --build "$build" -j"$(nproc)" --target kiln_cli

out="${KILN_DEMO_OUT:-out/char_gpt}"
mkdir -p "$out"
# The plain-text fortune files (not the .dat indexes), '%' separators turned into blank lines.
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 | sort -z |
  xargs -0 cat | sed 's/^%$//' | LC_ALL=C tr -cd '\11\12\40-\176' > "$out/corpus.txt"
"$build/kiln" tokenize --text "$out/corpus.txt" --chars --out "$out/train.safetensors" \
  --eval-out "$out/eval.safetensors" --eval-fraction 0.05

train_json="examples/char_gpt/train.json"
if [ -n "${STEPS:-}" ]; then
  # A shorter (or longer) run keeps the schedule's shape: the same fraction of it warms up.
  steps=$(grep -o '"steps": [0-9]*' "$train_json" | grep -o '[0-9]*$')
  warmup=$(grep -o '"warmup_steps": [0-9]*' "$train_json" | grep -o '[0-9]*$')
  warmup=$(( STEPS * warmup / steps > 0 ? STEPS * warmup / steps : 1 ))
  sed "s/\"steps\": [0-9]*/\"steps\": $STEPS/; s/\"warmup_steps\": [0-9]*/\"warmup_steps\": $warmup/" "$train_json" > "$out/train.json"
  train_json="$out/train.json"
fi
export KILN_NUM_THREADS="${KILN_NUM_THREADS:-$(nproc)}"
# The training's own cost, printed after it: wall time and CPU time (user + sys, all threads). On a
# shared machine the wall time grows with the load; the CPU time much less.
TIMEFORMAT="training took %R s wall, %U s user + %S s sys CPU"
time "$build/kiln" train --model examples/char_gpt/model.json --train "$train_json" \
  --data "$out/train.safetensors" --eval-data "$out/eval.safetensors" \
  --checkpoint "$out/checkpoint.safetensors" --log "$out/log.jsonl" --progress on --device "${DEVICE:-cpu}"
"$build/kiln" plot --log "$out/log.jsonl" --label "char_gpt (diff + attnres_block)" --out "$out/curves.png" \
  --title "kiln train: examples/char_gpt on Debian's fortunes"
last_eval=$(grep -o '"eval_loss":[0-9.]*' "$out/log.jsonl" | tail -n 1 | cut -d: -f2 || true)
steps_done=$(grep -c '"step"' "$out/log.jsonl")
[ -n "$last_eval" ] && LC_ALL=C printf 'held-out loss after %s steps: %.4f nats/char\n' "$steps_done" "$last_eval"
echo "curves: $out/curves.png (data: $out/log.jsonl), checkpoint: $out/checkpoint.safetensors"
echo
echo "--- sample (temperature 0.7, top-k 20) ---"
"$build/kiln" sample --checkpoint "$out/checkpoint.safetensors" --prompt "The " --tokens 400 --temperature 0.7 --top-k 20 \
  --device "${DEVICE:-cpu}"
