#!/usr/bin/env bash
# The README's main job in miniature on the emulated device: tokenize a text (character level), train
# examples/char_gpt's model (differential attention + block Attention Residuals) for a few steps with
# --device cuda and a held-out evaluation, then sample greedily from the checkpoint on the device and on
# the CPU: the two continuations must be identical. Then train again with the emulator's blocks and
# threads in a shuffled order (KILN_EMU_SCHEDULE): GPU training is deterministic, so the two checkpoints
# must be identical byte for byte.
#   main_job.sh KILN SOURCE_DIR WORKDIR
set -euo pipefail
kiln="$1" src="$2" dir="$3"
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
"$kiln" tokenize --text "$src/README.md" --chars --out train.safetensors --eval-out eval.safetensors --eval-fraction 0.1
sed 's/"steps": [0-9]*/"steps": 4/; s/"eval_every": [0-9]*/"eval_every": 2/; s/"batch_size": [0-9]*/"batch_size": 2/;
     s/"seq_len": [0-9]*/"seq_len": 32/; s/"eval_batches": [0-9]*/"eval_batches": 2/; s/"time_limit_s": [0-9]*/"time_limit_s": 0/' \
  "$src/examples/char_gpt/train.json" > train.json  # no time limit: its elapsed seconds in the checkpoints would differ
"$kiln" train --model "$src/examples/char_gpt/model.json" --train train.json --data train.safetensors --eval-data eval.safetensors \
  --checkpoint ck.safetensors --log log.jsonl --device cuda --progress on
test "$(wc -l < log.jsonl)" -ge 4
KILN_EMU_SCHEDULE=97 "$kiln" train --model "$src/examples/char_gpt/model.json" --train train.json --data train.safetensors \
  --eval-data eval.safetensors --checkpoint ck2.safetensors --log log2.jsonl --device cuda --progress off
cmp ck.safetensors ck2.safetensors
"$kiln" sample --checkpoint ck.safetensors --prompt "The " --tokens 40 --temperature 0 --device cuda > cuda.txt
"$kiln" sample --checkpoint ck.safetensors --prompt "The " --tokens 40 --temperature 0 --device cpu > cpu.txt
cat cuda.txt
cmp cuda.txt cpu.txt
