#!/usr/bin/env bash
# kiln's CUDA checks on a GPU machine whose image has nvcc, CMake, g++ and PyTorch but none of kiln's
# Debian libraries: they come from .gpukit/deps.tar.xz (scripts/gpu_kit.sh, run beforehand where the
# packages are installed). Every phase writes its log under $OUT (the device tool brings $OUT back).
#
#   bash scripts/gpu_run.sh [phase ...]      phases, in order: info build test sanitize bench (default: all)
#
#   info      GPU, driver, compilers, Python/torch
#   build     configure build-gpu (sm_90 only, oneDNN off, CPU benchmarks off) and build it
#   test      every Cuda/[cuda] test of the suite through CTest (conformance, gradchecks, layers, torch
#             parity, `kiln train --device cuda` parity)
#   sanitize  compute-sanitizer memcheck over the Cuda conformance and attention tests (caching allocator
#             off: KILN_CUDA_NO_CACHE=1), racecheck over the attention and reduction tests
#   bench     bench/cuda: GEMM vs raw cuBLAS, flash attention, GPT-2-small step vs PyTorch (mha, diff)
#   rest      the test programs that had not run on a GPU before 2026-11-26's second lease (conv,
#             amp, train, profile, hf, loss, lora, cuda, torch, text) and nn, autograd (new cases since): a short
#             lease runs these first
#   racecheck compute-sanitizer racecheck over test_attention's Cuda cases, to its end
#   lease3    what had never run on a GPU before the third lease (2026-11-26): test_attention's Cuda cases
#             (diff_attention_norm, new) and memcheck over diff_attention_norm; the GPT-2-small step in
#             f32, bf16 and f16 (autocast, loss scaling) against PyTorch's autocast; KILN_PROFILE=1's exit
#             report on Cuda; test_nn's Cuda cases (DifferentialAttention now goes through
#             diff_attention_norm)
#   lease4    the tensor-core flash attention kernels (new at the fourth lease, 2026-11-26): test_attention's
#             Cuda cases (tensor-core and FMA kernels), the attention benchmarks (bench_cuda attention,
#             gpu_vs_torch.py --only attention), the GPT-2-small step in f32 and bf16 against PyTorch eager,
#             memcheck over the tile cases and racecheck over three small cases (targets kiln_cli
#             test_attention bench_cuda)
#   lease4b   the same kernels with float4 tile loads, each at 64 and at 32 columns per step
#             (KILN_CUDA_ATTENTION_COLS): test_attention's Cuda cases, bench_cuda attention, the GPT-2-small
#             f32 step (mha, diff) against PyTorch eager
#   lease5    bf16/f16 attention on the tensor-core kernels without the redundant products (fifth lease,
#             2026-11-26): test_attention's Cuda cases, memcheck and racecheck over the half-input cases
#             (which run every tensor-core kernel, f32 and half, and the FMA kernels), the attention
#             benchmarks in f32 and bf16, the GPT-2-small step in bf16 and f32 against PyTorch eager
#             (targets kiln_cli test_attention bench_cuda)
#   lease5b   mixed precision beyond 12 steps: the GPT-2-small model trained 400 steps in f16 (dynamic loss
#             scaling) and in bf16 from the same initialisation and tokens; the loss curves side by side,
#             the f16 run's overflows and loss scales (target kiln_cli)
#   lease6    the half-precision attention forward (attn_fwd_h, bf16/f16 m16n8k16 products; written after the
#             fifth lease, first run at the sixth): test_attention's Cuda cases, the attention benchmarks in
#             bf16 and f32, memcheck and racecheck over its bounded test (targets kiln_cli test_attention
#             bench_cuda)
#   lease7    the same for the half-precision attention backward (attn_bwd_dkdv_h, attn_bwd_dq_h; written after
#             the sixth lease's first call, run in its second)
#   lease8    the same for both half-precision kernels with ldmatrix fragment reads and cp.async loads ahead of
#             the products, every tensor-core kernel's whole-tile scores and the half forward at 128 query rows
#             per block (all written after the sixth lease, run at the seventh): every Cuda attention case, the benchmarks, bench_cuda attention and the bf16 GPT step
#             again at KILN_CUDA_ATTENTION_ROWS=128, then both bound tests under memcheck and racecheck
#   lease9    what the seventh lease (2026-11-27) left: test_hf's Cuda cases (Qwen3's q/k norms, the sliding-window
#             masks and YaRN's tables on a GPU, written after it), racecheck over test_attention's Cuda cases after
#             the 10th (the first 8 and both bf16/f16 bound tests ran under it then), then lease5b (targets kiln_cli
#             test_attention test_hf)
#   lease10   what the eighth lease (2026-11-28) had to run: test_hf's Cuda cases (the Hugging Face decoders'
#             pieces written since the seventh lease), activation checkpointing's memory on a GPU, then racecheck
#             over test_attention's Cuda cases after the 10th (targets kiln_cli test_attention test_hf)
#   lease11   what the ninth lease (2026-11-28) had to run: the cross-entropy on bf16/f16 logits (loss.cu, written
#             after the eighth lease) through test_nn's fused-loss cases, the memory it saves on the bf16
#             GPT-2-small step (checkpoint_memory bf16), that step against PyTorch's autocast, then racecheck
#             over test_attention's Cuda cases from the 25th (targets kiln_cli test_attention test_nn)
#   lease12   racecheck over test_attention's Cuda cases from the 29th (KILN_RACECHECK_FROM=N: from the Nth)
#             (target test_attention)
#   lease13   the LM head and its loss in chunks (nn::linear_cross_entropy, written after the ninth lease) on a
#             GPU: test_nn's fused-loss and linear cross-entropy cases, then the GPT-2-small step's peak memory
#             and time with train.json loss_chunk_rows -1 (the logits made whole) and 0 (fused), in f32 and
#             bf16 (targets kiln_cli test_nn)
#   profile   test_profile's Cuda cases and KILN_PROFILE=1's exit report on Cuda (targets kiln_cli test_profile)
#
# KILN_GPU_TARGETS="t1 t2 ...": build only these targets (default: all), to save a short lease's minutes.
#
# KILN_GPU_DEADLINE_S=N: every phase runs under `timeout` so that the whole script ends N seconds after it
# began (a phase cut short is reported as such); a device call's own limit then never loses the logs.
#
# On this machine a CUDA test that finds no usable device fails instead of reporting itself skipped
# (KILN_REQUIRE_GPU=1, tests/catch_main.cpp): a GPU run where every test skipped is a broken run, not a
# green one. KILN_REQUIRE_GPU=0 bash scripts/gpu_run.sh ... restores the skips (e.g. to try the script on
# a machine without a GPU).
#
# A device call may run 10 minutes; split the phases over calls (the build folder stays on a warm
# machine): e.g. `info build`, then `test`, then `sanitize bench`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
[ $# -eq 0 ] && set -- info build test sanitize bench
arch="$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
deps=/tmp/kiln-deps
if [ ! -d "$deps/usr" ]; then
  [ -f .gpukit/deps.tar.xz ] || { echo "gpu_run: .gpukit/deps.tar.xz missing: run scripts/gpu_kit.sh here and carry .gpukit" >&2; exit 2; }
  mkdir -p "$deps" && tar -C "$deps" --strip-components=1 -xJf .gpukit/deps.tar.xz
fi
export LD_LIBRARY_PATH="$deps/usr/lib/$arch:$deps/usr/lib/$arch/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KILN_PYTHON="${KILN_PYTHON:-$(command -v python3)}"
export KILN_NUM_THREADS="${KILN_NUM_THREADS:-8}"
export KILN_REQUIRE_GPU="${KILN_REQUIRE_GPU:-1}"
gen=()
# Unix Makefiles: CMake's Ninja generator rejects the tests' catch_discover_tests outputs ("defined as an
# output multiple times"; seen on an H200 machine, 2026-11-26).
jobs="$(nproc)"
export deps jobs
status=0

phase_info() {
  nvidia-smi || true
  nvcc --version | tail -2
  g++ --version | head -1
  cmake --version | head -1
  "$KILN_PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
}

phase_build() {
  cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DKILN_DEPS_ROOT="$deps" -DKILN_WITH_CUDA=ON -DKILN_WITH_ONEDNN=OFF \
    -DKILN_BUILD_TESTS=ON -DKILN_BUILD_EXAMPLES=OFF -DKILN_BUILD_BENCH=ON -DKILN_BUILD_BENCH_CPU=OFF -DKILN_BUILD_CUDA_EMU=OFF -DCMAKE_CUDA_ARCHITECTURES=90 &&
    cmake --build build-gpu -j"$jobs" ${KILN_GPU_TARGETS:+--target $KILN_GPU_TARGETS}
}

phase_test() {
  # the Cuda/[cuda] tests and the allocator's host tests; not the emulator (that is the CPU's job)
  ctest --test-dir build-gpu -R "Cuda|cuda" -LE "slow|cuda-emu" --output-on-failure -j4 --timeout 900
}

phase_sanitize() {
  local rc=0
  export KILN_CUDA_NO_CACHE=1
  compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/test_core "*Cuda*" || rc=1
  compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/test_attention "*Cuda*" || rc=1
  compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/test_nn "*Cuda*" || rc=1
  compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/tests/test_attention "*Cuda*" || rc=1
  compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/tests/test_core "conformance: reductions*Cuda*" || rc=1
  unset KILN_CUDA_NO_CACHE
  return $rc
}

phase_rest() {
  ctest --test-dir build-gpu -R "Cuda|cuda" -L "^(conv|amp|train|profile|hf|loss|lora|cuda|torch|text|nn|autograd)$" -LE "slow|cuda-emu" \
    --output-on-failure -j4 --timeout 900
}

phase_lease3() {
  local rc=0 t0=$SECONDS
  build-gpu/tests/test_attention "*Cuda*" || rc=1
  echo "--- test_attention Cuda: $((SECONDS - t0)) s"
  KILN_CUDA_NO_CACHE=1 compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/test_attention "diff_attention_norm*" ||
    rc=1
  echo "--- memcheck: $((SECONDS - t0)) s"
  PYTHONUNBUFFERED=1 "$KILN_PYTHON" bench/cuda/gpu_vs_torch.py --kiln build-gpu/kiln --only gpt --precisions f32,bf16,f16 --steps 12 ||
    rc=1
  echo "--- gpt steps: $((SECONDS - t0)) s"
  phase_profile_exit || rc=1
  echo "--- profile: $((SECONDS - t0)) s"
  build-gpu/tests/test_nn "*Cuda*" || rc=1
  echo "--- test_nn Cuda: $((SECONDS - t0)) s"
  return $rc
}

# The attention benchmarks (bench_cuda attention, gpu_vs_torch.py --only attention), then the GPT-2-small
# step against PyTorch eager in the precisions $1, 12 steps each.
attention_benchmarks() {
  local rc=0 t0=$SECONDS
  build-gpu/bench/bench_cuda attention || rc=1
  PYTHONUNBUFFERED=1 "$KILN_PYTHON" bench/cuda/gpu_vs_torch.py --only attention || rc=1
  echo "--- attention benchmarks: $((SECONDS - t0)) s"
  PYTHONUNBUFFERED=1 "$KILN_PYTHON" bench/cuda/gpu_vs_torch.py --kiln build-gpu/kiln --only gpt --precisions "$1" --steps 12 || rc=1
  echo "--- gpt steps: $((SECONDS - t0)) s"
  return $rc
}

phase_lease4() {
  local rc=0 t0=$SECONDS
  build-gpu/tests/test_attention "*Cuda*" || rc=1
  echo "--- test_attention Cuda: $((SECONDS - t0)) s"
  attention_benchmarks f32,bf16 || rc=1
  KILN_CUDA_NO_CACHE=1 compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/test_attention "attention: Cuda's f32 tile*" ||
    rc=1
  echo "--- memcheck: $((SECONDS - t0)) s"
  compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/tests/test_attention \
    "attention: f32 fused equals the f32 decomposed path within the same bound*" || rc=1
  echo "--- racecheck: $((SECONDS - t0)) s"
  return $rc
}

phase_lease4b() {
  local rc=0 t0=$SECONDS cols
  for cols in 64 32; do
    export KILN_CUDA_ATTENTION_COLS=$cols
    build-gpu/tests/test_attention "*Cuda*" || rc=1
    echo "--- cols $cols: test_attention Cuda: $((SECONDS - t0)) s"
    build-gpu/bench/bench_cuda attention || rc=1
    echo "--- cols $cols: bench_cuda attention: $((SECONDS - t0)) s"
  done
  for cols in 64 32; do
    export KILN_CUDA_ATTENTION_COLS=$cols
    PYTHONUNBUFFERED=1 "$KILN_PYTHON" bench/cuda/gpu_vs_torch.py --kiln build-gpu/kiln --only gpt --precisions f32 --steps 12 || rc=1
    echo "--- cols $cols: gpt steps: $((SECONDS - t0)) s"
  done
  unset KILN_CUDA_ATTENTION_COLS
  return $rc
}

# test_attention's Cuda cases, the attention benchmarks in bf16 and f32, then memcheck and racecheck over
# the cases named by $1 (lease5, lease6; the sanitizers last, so that a deadline cuts them and not the
# timings).
half_attention_checks() {
  local rc=0 t0=$SECONDS half="$1"
  build-gpu/tests/test_attention "*Cuda*" || rc=1
  echo "--- test_attention Cuda: $((SECONDS - t0)) s"
  attention_benchmarks bf16,f32 || rc=1
  if [ "${2:-}" = rows128 ]; then  # the half forward at 128 query rows per block against the default 64 above
    KILN_CUDA_ATTENTION_ROWS=128 build-gpu/bench/bench_cuda attention || rc=1
    KILN_CUDA_ATTENTION_ROWS=128 PYTHONUNBUFFERED=1 "$KILN_PYTHON" bench/cuda/gpu_vs_torch.py --kiln build-gpu/kiln --only gpt \
      --precisions bf16 --steps 12 || rc=1
    echo "--- 128 query rows: $((SECONDS - t0)) s"
  fi
  KILN_CUDA_NO_CACHE=1 timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/test_attention "$half" || rc=1
  echo "--- memcheck: $((SECONDS - t0)) s"
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/tests/test_attention "$half" || rc=1
  echo "--- racecheck: $((SECONDS - t0)) s"
  return $rc
}

phase_lease5() { half_attention_checks "attention: bf16 and f16 equal the f32 path*"; }
phase_lease6() { half_attention_checks "attention: the bf16/f16 forward is within its bound*"; }
phase_lease7() { half_attention_checks "attention: the bf16/f16 backward is within its bound*"; }
phase_lease8() {
  half_attention_checks "attention: the bf16/f16 forward is within its bound*,attention: the bf16/f16 backward is within its bound*" rows128
}

phase_lease5b() {
  local d rc=0 p
  d="$(mktemp -d)" || return 1
  gpt2_small_json > "$d/m.json"
  "$KILN_PYTHON" tests/reference/kiln_ref.py tokens --vocab 50304 --n 1700000 --out "$d/tok.safetensors" || rc=1
  for p in f16 bf16; do
    echo "{\"batch_size\": 4, \"seq_len\": 1024, \"steps\": 400, \"precision\": \"$p\", \"optimizer\": {\"name\": \"adamw\", \"lr\": 6e-4, \"weight_decay\": 0.1}}" > "$d/t_$p.json"
    build-gpu/kiln train --model "$d/m.json" --train "$d/t_$p.json" --data "$d/tok.safetensors" --device cuda --log "$d/$p.jsonl" \
      --progress off || rc=1
    cp "$d/$p.jsonl" "$OUT/lease5b_$p.jsonl"
  done
  "$KILN_PYTHON" - "$d" <<'PY' || rc=1
import json, os, statistics, sys
runs = {}
for p in ("f16", "bf16"):
    rows = [json.loads(l) for l in open(os.path.join(sys.argv[1], p + ".jsonl")) if l.strip() and '"loss"' in l]
    runs[p] = rows
    over = [r["step"] for r in rows if r.get("overflow")]
    scales = [r["loss_scale"] for r in rows if "loss_scale" in r]
    print(json.dumps({"precision": p, "steps": len(rows), "overflow_steps": over, "skipped": sum(1 for r in rows if r.get("skipped")),
                      "loss_scale_first_min_last": [scales[0], min(scales), scales[-1]] if scales else None,
                      "median_ms": statistics.median(r["ms"] for r in rows[3:])}))
for a in range(0, 400, 50):
    print(json.dumps({"steps": [a, a + 49], **{p: statistics.mean(r["loss"] for r in runs[p][a:a + 50]) for p in runs}}))
PY
  rm -rf "$d"
  return $rc
}

# compute-sanitizer racecheck over test_attention's Cuda cases from the $1-th on (a lease's time ends
# before all of them have run: the next lease goes on from where it stopped).
racecheck_attention_from() {
  local rest
  # Catch2 reads a comma as "or" and brackets as a tag: the names' own escaped.
  rest="$(build-gpu/tests/test_attention "*Cuda*" --list-test-names-only | grep . | tail -n +"$1" | sed 's/[],[]/\\&/g' | paste -sd, -)"
  # -d yes: each case's name and time as it ends, so a cut run says where the next one starts
  compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/tests/test_attention "$rest" -d yes
}

# The GPT-2-small-shaped model (162M parameters, vocab 50,304, T 1024) as `kiln train --model` reads it.
gpt2_small_json() {
  echo '{"vocab_size": 50304, "d_model": 768, "n_layers": 12, "n_heads": 12, "max_seq_len": 1024, "attention": "mha"}'
}

phase_lease9() {
  local rc=0 t0=$SECONDS
  build-gpu/tests/test_hf "*Cuda*,[cuda]" || rc=1
  echo "--- test_hf Cuda: $((SECONDS - t0)) s"
  timeout 420 bash -c 'racecheck_attention_from 11' || rc=1
  echo "--- racecheck: $((SECONDS - t0)) s"
  phase_lease5b || rc=1
  return $rc
}

# What the eighth lease (2026-11-28) had to run: test_hf's Cuda cases (Qwen3's q/k norms, sliding windows,
# YaRN and longrope tables, Gemma 1/2/3 with Gemma 2's capped decomposed attention, Phi-3; all written after
# the seventh lease), activation checkpointing's memory on a GPU (never measured: the GPT-2-small step with
# it off and on, the device's memory polled by nvidia-smi), then racecheck over test_attention's Cuda cases
# after the 10th, cut by the deadline (targets kiln_cli test_attention test_hf).
phase_lease10() {
  local rc=0 t0=$SECONDS
  build-gpu/tests/test_hf "*Cuda*,[cuda]" || rc=1
  echo "--- test_hf Cuda: $((SECONDS - t0)) s"
  checkpoint_memory || rc=1
  echo "--- checkpointing memory: $((SECONDS - t0)) s"
  racecheck_attention_from 11 || rc=1
  echo "--- racecheck: $((SECONDS - t0)) s"
  return $rc
}

phase_lease11() {
  local rc=0 t0=$SECONDS
  build-gpu/tests/test_nn "[fused]" || rc=1
  echo "--- test_nn [fused]: $((SECONDS - t0)) s"
  checkpoint_memory bf16 || rc=1
  echo "--- bf16 memory: $((SECONDS - t0)) s"
  PYTHONUNBUFFERED=1 "$KILN_PYTHON" bench/cuda/gpu_vs_torch.py --kiln build-gpu/kiln --only gpt --precisions bf16 --steps 12 || rc=1
  echo "--- bf16 gpt step: $((SECONDS - t0)) s"
  racecheck_attention_from 25 || rc=1
  echo "--- racecheck: $((SECONDS - t0)) s"
  return $rc
}

# What the tenth lease (2026-11-28) had to run: racecheck over test_attention's Cuda cases from the 29th
# (the ninth lease's deadline cut it there; no attention kernel has changed since the first 28 ran).
phase_lease12() {
  local t0=$SECONDS rc=0
  racecheck_attention_from "${KILN_RACECHECK_FROM:-29}" || rc=1
  echo "--- racecheck: $((SECONDS - t0)) s"
  return $rc
}

# What the eleventh lease should run: nn::linear_cross_entropy (the LM head and loss in chunks, tensor ops on
# cuBLAS and the cross-entropy kernel, checked on the emulated device only) on a GPU, its memory and time in
# the GPT-2-small step against the logits made whole.
phase_lease13() {
  local rc=0 t0=$SECONDS
  build-gpu/tests/test_nn "[fused],[linear_cross_entropy]" || rc=1
  echo "--- test_nn fused losses: $((SECONDS - t0)) s"
  CHECKPOINTING="false" LOSS_CHUNK_ROWS="-1 0" checkpoint_memory f32 bf16 || rc=1
  echo "--- fused loss memory: $((SECONDS - t0)) s"
  return $rc
}

# GPT-2-small (B 8, T 1024) trained 6 steps by `kiln train --device cuda` with activation checkpointing
# off and on (CHECKPOINTING="false true"), for each train.json loss_chunk_rows in LOSS_CHUNK_ROWS (unset:
# train.json leaves it out), in the precisions given (default f32 and bf16): the device's peak memory in
# use (nvidia-smi every 100 ms, less what was in use before) and the median step time of steps 2.. .
checkpoint_memory() {
  local d rc=0 p ck lc extra base peak ms precisions="${*:-f32 bf16}"
  d="$(mktemp -d)" || return 1
  gpt2_small_json > "$d/m.json"
  "$KILN_PYTHON" tests/reference/kiln_ref.py tokens --vocab 50304 --n 200000 --out "$d/tok.safetensors" || rc=1
  base="$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)"
  for p in $precisions; do
    for ck in ${CHECKPOINTING:-false true}; do
     for lc in ${LOSS_CHUNK_ROWS:-unset}; do
      extra=""
      [ "$lc" != unset ] && extra=", \"loss_chunk_rows\": $lc"
      echo "{\"batch_size\": 8, \"seq_len\": 1024, \"steps\": 6, \"precision\": \"$p\", \"activation_checkpointing\": $ck$extra}" > "$d/t.json"
      nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$d/mem.txt" &
      local poll=$!
      build-gpu/kiln train --model "$d/m.json" --train "$d/t.json" --data "$d/tok.safetensors" --device cuda --log "$d/log.jsonl" \
        --progress off || rc=1
      kill "$poll"; wait "$poll" 2>/dev/null
      peak="$(sort -n "$d/mem.txt" | tail -1)"
      ms="$("$KILN_PYTHON" -c 'import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1]) if "\"ms\"" in l]; print(statistics.median(x["ms"] for x in r[2:]))' "$d/log.jsonl")"
      echo "{\"precision\": \"$p\", \"activation_checkpointing\": $ck, \"loss_chunk_rows\": \"$lc\", \"peak_mib_over_idle\": $((peak - base)), \"median_step_ms\": $ms}"
     done
    done
  done
  rm -rf "$d"
  return $rc
}

phase_profile() {
  build-gpu/tests/test_profile "[cuda]" && phase_profile_exit
}

# KILN_PROFILE=1's report, made in an exit handler: does it still read the device times on a GPU?
phase_profile_exit() {
  local d
  d="$(mktemp -d)" || return 1
  echo '{"vocab_size": 256, "d_model": 256, "n_layers": 2, "n_heads": 4, "max_seq_len": 128, "attention": "diff"}' > "$d/m.json"
  echo '{"batch_size": 8, "seq_len": 128, "steps": 5}' > "$d/t.json"
  "$KILN_PYTHON" tests/reference/kiln_ref.py tokens --vocab 256 --n 20000 --out "$d/tok.safetensors" &&
    KILN_PROFILE=1 KILN_PROFILE_OUT="$d/trace.json" build-gpu/kiln train --model "$d/m.json" --train "$d/t.json" \
      --data "$d/tok.safetensors" --device cuda --log "$d/log.jsonl" --progress off 2> "$d/err.txt"
  local rc=$?
  head -30 "$d/err.txt"
  grep -c '"device stream' "$d/trace.json" || true
  grep -q "device ms" "$d/err.txt" || { echo "profile_exit: no device ms column in the exit report"; rc=1; }
  rm -rf "$d"
  return $rc
}

phase_racecheck() {
  compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/tests/test_attention "*Cuda*"
}

phase_bench() {
  build-gpu/bench/bench_cuda && "$KILN_PYTHON" bench/cuda/gpu_vs_torch.py --kiln build-gpu/kiln
}

export -f phase_profile_exit attention_benchmarks half_attention_checks phase_lease5b checkpoint_memory racecheck_attention_from gpt2_small_json
start=$SECONDS
deadline="${KILN_GPU_DEADLINE_S:-0}"
for p in "$@"; do
  echo "=== gpu_run: $p ($(date -u +%H:%M:%S))"
  limit=()
  if [ "$deadline" -gt 0 ]; then
    left=$((deadline - (SECONDS - start)))
    [ "$left" -le 5 ] && { echo "=== gpu_run: $p not run: the deadline (${deadline} s) is reached"; status=1; continue; }
    limit=(timeout "$left")
  fi
  export -f "phase_$p"
  if "${limit[@]}" bash -c "phase_$p" > "$OUT/$p.log" 2>&1; then
    echo "=== gpu_run: $p ok"
  else
    rc=$?
    status=1
    [ "$rc" -eq 124 ] && echo "=== gpu_run: $p CUT SHORT by the deadline"
    echo "=== gpu_run: $p FAILED (rc $rc); the end of $OUT/$p.log:"
    tail -40 "$OUT/$p.log"
  fi
  [ "$p" = bench ] && grep '^{' "$OUT/bench.log" > "$OUT/bench.jsonl"
done
exit $status
