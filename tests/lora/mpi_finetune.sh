#!/usr/bin/env bash
# `mpirun -np 2 kiln train --init-from MODEL_DIR --lora-r 4` against one process: each rank takes half of
# every batch's rows and DistributedDataParallel averages the adapters' gradients (the frozen weights
# have none), so the per-step losses agree within 1e-5 relative; only rank 0 writes the adapter.
#   mpi_finetune.sh MPIRUN KILN MODEL_DIR TEXT
set -euo pipefail
mpirun=$1 kiln=$2 model=$3 text=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-lora-mpi-XXXXXX")
trap 'rm -rf "$work"' EXIT
head -c 300 "$text" > "$work/small.txt"
echo '{"batch_size": 4, "seq_len": 16, "steps": 6, "optimizer": {"name": "adamw", "lr": 0.05, "weight_decay": 0.0}}' > "$work/train.json"
args=(train --init-from "$model" --data "$work/small.txt" --train "$work/train.json" --lora-r 4 --progress off --quiet)
export KILN_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$kiln" "${args[@]}" --log "$work/one.jsonl"
"$mpirun" -np 2 --oversubscribe --bind-to none "$kiln" "${args[@]}" --log "$work/two.jsonl" --save "$work/adapter"
test -f "$work/adapter/adapter_model.safetensors" && test -f "$work/adapter/adapter_config.json"
python3 - "$work/one.jsonl" "$work/two.jsonl" <<'PY'
import json, sys
one, two = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
print("1 process:", one, "\n2 ranks:  ", two)
assert len(one) == len(two) == 6, (len(one), len(two))
bad = [(i, a, b) for i, (a, b) in enumerate(zip(one, two)) if abs(a - b) > 1e-5 * abs(a)]
sys.exit(f"losses differ at (step, 1 process, 2 ranks): {bad}" if bad else 0)
PY
