#!/usr/bin/env bash
# Activation checkpointing: peak memory and step time of `kiln train` with and without it
# (docs/memory.md). One process per run, so the peak resident set (GNU time's "Maximum resident set
# size") is that run's; the difference between the two is the activations kept for backward. The
# runs alternate (off on on off ... ) so both see the same machine load.
#
#   bench/checkpoint/run.sh [build_dir] [pairs]        # defaults: build, 2
#   D=512 L=8 T=512 B=8 STEPS=4 bench/checkpoint/run.sh  # the model and batch (these defaults)
#
# Step time: the median "ms" of the JSONL log over steps 1.. (step 0 pays first-touch page faults).
set -euo pipefail
build=${1:-build}
pairs=${2:-2}
D=${D:-512} L=${L:-8} T=${T:-512} B=${B:-8} STEPS=${STEPS:-4} HEADS=${HEADS:-8}
kiln="$build/kiln"
[ -x "$kiln" ] || { echo "no $kiln: build the kiln_cli target first" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "needs GNU time (/usr/bin/time, Debian package 'time')" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 - "$tmp" "$D" "$L" "$T" "$B" "$STEPS" "$HEADS" <<'PY'
import json, os, random, struct, sys
d, D, L, T, B, S, H = sys.argv[1], *map(int, sys.argv[2:])
json.dump({"vocab_size": 256, "d_model": D, "n_layers": L, "n_heads": H, "max_seq_len": T}, open(f"{d}/model.json", "w"))
for on in (False, True):
    json.dump({"batch_size": B, "seq_len": T, "steps": S, "activation_checkpointing": on},
              open(f"{d}/train_{'on' if on else 'off'}.json", "w"))
n = 1 << 16  # tokens: random bytes, written as a safetensors file with one i32 tensor "tokens"
random.seed(0)
body = struct.pack(f"<{n}i", *(random.randrange(256) for _ in range(n)))
head = json.dumps({"tokens": {"dtype": "I32", "shape": [n], "data_offsets": [0, len(body)]}}).encode()
head += b" " * (-len(head) % 8)
with open(f"{d}/tokens.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(head)) + head + body)
PY

run() {  # $1: off|on, $2: run index
  /usr/bin/time -v "$kiln" train --model "$tmp/model.json" --train "$tmp/train_$1.json" --data "$tmp/tokens.safetensors" \
    --log "$tmp/log_$1_$2.jsonl" --progress off --quiet 2> "$tmp/time_$1_$2.txt"
  rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$tmp/time_$1_$2.txt")
  ms=$(python3 -c 'import json,statistics,sys; r=[json.loads(l)["ms"] for l in open(sys.argv[1])][1:]; print(f"{statistics.median(r):.0f}")' "$tmp/log_$1_$2.jsonl")
  loss=$(python3 -c 'import json,sys; print(" ".join("%.6f" % json.loads(l)["loss"] for l in open(sys.argv[1])))' "$tmp/log_$1_$2.jsonl")
  printf '%-4s run %d: peak RSS %7.1f MiB, median step %6s ms, losses %s\n' "$1" "$2" "$(echo "$rss / 1024" | bc -l)" "$ms" "$loss"
}
echo "kiln train, d_model $D, $L layers, $HEADS heads, T $T, B $B, vocab 256, $STEPS AdamW steps, KILN_NUM_THREADS=${KILN_NUM_THREADS:-all}"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 1 "$pairs"); do
  if [ $((i % 2)) -eq 1 ]; then run off "$i"; run on "$i"; else run on "$i"; run off "$i"; fi
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
