#!/usr/bin/env bash
# kiln::dist benchmarks on this machine (figures: bench/RESULTS.md, "Data parallelism"):
#  1. dist::all_reduce against raw MPI_Allreduce of the same buffer, 2 ranks (bench_dist allreduce);
#  2. the share of the gradient all-reduce hidden behind backward (bench_dist overlap);
#  3. `kiln train` on the d_model 256 benchmark model (4 layers, T 128, B 8): 2 ranks x 1 thread
#     against 1 process x 2 threads, tokens/s from the median "ms" of steps 3.. (ZeRO-1 off and on).
#   bench/dist/run.sh [build-dir]     (default build-bench-dist; configures and builds what it runs)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build-bench-dist}
bash scripts/setup.sh
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_BENCH=ON -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$dir" -j"$(nproc)" --target bench_dist kiln_cli
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun -np 2 --oversubscribe --bind-to none -x KILN_NUM_THREADS=1 -x OMP_NUM_THREADS=1)
echo "## machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, CPU flags:" \
     "$(grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u | xargs); $(mpirun --version | head -1)"
echo "## load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
"${mpi[@]}" "$dir/bench/bench_dist" allreduce
echo
for mb in 25 4 1; do "${mpi[@]}" "$dir/bench/bench_dist" overlap 10 $mb; echo; done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 > "$tmp/text.txt"
"$dir/kiln" tokenize --text "$tmp/text.txt" --out "$tmp/tokens.safetensors" >/dev/null
echo '{"vocab_size": 256, "d_model": 256, "n_layers": 4, "n_heads": 4, "max_seq_len": 128}' > "$tmp/model.json"
median_tps() {  # tokens/s from the median ms of steps 3.. of a log
  python3 -c 'import json,sys,statistics as st
ms=[json.loads(l)["ms"] for l in open(sys.argv[1]) if l.strip()][3:]
print("%.0f" % (8*128/(st.median(ms)/1e3)))' "$1"
}
echo "kiln train, d_model 256, 4 layers, T 128, B 8 (global), 12 steps; tokens/s from the median step of steps 3..:"
echo "| zero_stage | 1 process x 2 threads | 2 ranks x 1 thread | ratio |"
echo "|---|---|---|---|"
for z in 0 1; do
  echo "{\"batch_size\": 8, \"seq_len\": 128, \"steps\": 12, \"zero_stage\": $z}" > "$tmp/train.json"
  common=(train --model "$tmp/model.json" --train "$tmp/train.json" --data "$tmp/tokens.safetensors" --progress off --quiet)
  KILN_NUM_THREADS=2 "$dir/kiln" "${common[@]}" --log "$tmp/one.jsonl"
  "${mpi[@]}" "$dir/kiln" "${common[@]}" --log "$tmp/two.jsonl"
  a=$(median_tps "$tmp/one.jsonl") b=$(median_tps "$tmp/two.jsonl")
  echo "| $z | $a tok/s | $b tok/s | $(python3 -c "print('%.2f' % ($b/$a))") |"
done
