#!/usr/bin/env bash
# examples/lora_finetune: adapt a small Hugging Face model to a new corpus with LoRA, on this machine,
# with no downloads (README.md beside this script has the figures and what they mean).
#   1. pre-train a small Llama-shaped kiln GPT (RMSNorm, SwiGLU, RoPE, GQA; one token per byte) on
#      Debian's fortunes, every category but one;
#   2. `kiln export` it to a Hugging Face directory (LlamaForCausalLM, with a byte-level tokenizer.json):
#      from here on it is treated as any imported checkpoint;
#   3. `kiln train --init-from DIR --lora-*` on the category left out (songs and poems: verse, a
#      different style), with the held-out part of that category as --eval-data; the adapter is saved in
#      PEFT's layout; a full fine-tune of the same directory for comparison;
#   4. example_lora_finetune: held-out losses on both corpora of the base, base + adapter, the merged
#      model (nn::merge_lora) and the merged model exported and reloaded, and of the full fine-tune;
#   5. `kiln plot` of the fine-tuning curves, and a sample of the base and of the merged model.
#
#   bash examples/lora_finetune/run.sh             the documented run (about 4 minutes on 2 cores)
#   PRETRAIN_STEPS=20 STEPS=10 bash ...run.sh      shorter (the smoke test's settings, with EVAL_BATCHES=2)
# Environment: BUILD (default build; configured and the two programs built there when KILN/EXAMPLE are
# not given), KILN and EXAMPLE (the `kiln` and `example_lora_finetune` programs), OUT (default
# out/lora_finetune; "tmp": a fresh folder under $TMPDIR, removed at the end), PRETRAIN_STEPS, STEPS (of
# each fine-tune), EVAL_BATCHES, FULL=0 (skip the full fine-tune), MAX_NEW_LOSS (exit 1 unless the
# adapted model's held-out loss on the new corpus ends below it), FORTUNES (the corpus folder),
# NEW_CATEGORY (the fortune file to adapt to; default songs-poems), LORA_R, LORA_ALPHA, LORA_TARGET.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

fortunes="${FORTUNES:-/usr/share/games/fortunes}"
new_category="${NEW_CATEGORY:-songs-poems}"
if [ ! -f "$fortunes/$new_category" ]; then
  echo "lora_finetune: no $fortunes/$new_category: the corpus is Debian's fortunes package (apt-get install fortunes," \
    "or scripts/setup.sh --data)" >&2
  exit 2
fi

if [ -z "${KILN:-}" ] || [ -z "${EXAMPLE:-}" ]; then
  build="${BUILD:-build}"
  [ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j"$(nproc)" --target kiln_cli example_lora_finetune
  KILN="${KILN:-$build/kiln}"
  EXAMPLE="${EXAMPLE:-$build/examples/example_lora_finetune}"
fi

out="${OUT:-out/lora_finetune}"
if [ "$out" = "tmp" ]; then
  out="$(mktemp -d "${TMPDIR:-/tmp}/kiln_lora_finetune.XXXXXX")"
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
export KILN_NUM_THREADS="${KILN_NUM_THREADS:-$(nproc)}"
export GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-1000}"  # the example program on shared cores (README, "Threads")
progress="${PROGRESS:-auto}"

# A train.json with the step count and evaluation batches of this run.
configure() {  # configure SOURCE DEST STEPS
  sed -e "s/\"steps\": [0-9]*/\"steps\": $3/" -e "s/\"eval_batches\": [0-9]*/\"eval_batches\": ${EVAL_BATCHES:-8}/" "$1" >"$2"
}
# The last eval_loss of a JSONL log.
last_eval() { grep -o '"eval_loss":[^,}]*' "$1" | tail -1 | cut -d: -f2; }
phase() {
  echo
  echo "=== $* ($SECONDS s)"
}

phase "1. the corpora: Debian's fortunes; the base model's are every category but '$new_category'"
# Fortunes (separated by '%' lines, which become blank lines) go to the held-out set one in ten, in
# file order; only tab, newline and printable ASCII are kept, as scripts/train_demo.sh does.
split_fortunes() {  # split_fortunes TRAIN EVAL FILE...
  local train="$1" eval="$2"
  shift 2
  awk -v tr="$train.raw" -v ev="$eval.raw" '
    function flush() { if (rec != "") { if (n % 10 == 9) printf "%s\n", rec > ev; else printf "%s\n", rec > tr; n++ } rec = "" }
    FNR == 1 { flush() }
    $0 == "%" { flush(); next }
    { rec = rec $0 "\n" }
    END { flush() }' "$@"
  LC_ALL=C tr -cd '\11\12\40-\176' <"$train.raw" >"$train"
  LC_ALL=C tr -cd '\11\12\40-\176' <"$eval.raw" >"$eval"
  rm -f "$train.raw" "$eval.raw"
}
mapfile -t base_files < <(find "$fortunes" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name "$new_category" | sort)
split_fortunes "$out/original_train.txt" "$out/original_eval.txt" "${base_files[@]}"
split_fortunes "$out/new_train.txt" "$out/new_eval.txt" "$fortunes/$new_category"
wc -c "$out"/original_*.txt "$out"/new_*.txt | sed 's/^/  /'
# The model's own tokenizer: byte-level BPE without merges (examples/lora_finetune/tokenizer, written by
# make_tokenizer.py), one token per byte, so the token files below and the text files `kiln train
# --init-from` encodes with the exported directory's tokenizer give the same ids.
tokenizer="$here/tokenizer"
"$KILN" tokenize --tokenizer "$tokenizer" --text "$out/original_train.txt" --out "$out/original_train.safetensors"
"$KILN" tokenize --tokenizer "$tokenizer" --text "$out/original_eval.txt" --out "$out/original_eval.safetensors"

phase "2. pre-train the base model (Llama-shaped kiln GPT, $here/model.json)"
configure "$here/pretrain.json" "$out/pretrain.json" "${PRETRAIN_STEPS:-800}"
mkdir -p "$out/pretrain"
"$KILN" train --model "$here/model.json" --train "$out/pretrain.json" --data "$out/original_train.safetensors" \
  --eval-data "$out/original_eval.safetensors" --checkpoint "$out/pretrain/checkpoint.safetensors" --log "$out/pretrain/log.jsonl" \
  --progress "$progress"

phase "3. export it as a Hugging Face directory (the 'imported model' from here on)"
"$KILN" export "$out/pretrain/checkpoint.safetensors" --format hf --out "$out/base_hf" --tokenizer "$tokenizer" --force

phase "4. LoRA fine-tune of $out/base_hf on '$new_category'"
configure "$here/lora.json" "$out/lora.json" "${STEPS:-300}"
rm -rf "$out/adapter"
mkdir -p "$out/lora"
"$KILN" train --init-from "$out/base_hf" --data "$out/new_train.txt" --eval-data "$out/new_eval.txt" --train "$out/lora.json" \
  --lora-r "${LORA_R:-8}" --lora-alpha "${LORA_ALPHA:-16}" \
  --lora-target "${LORA_TARGET:-q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj}" \
  --save "$out/adapter" --log "$out/lora/log.jsonl" --progress "$progress"
ls -l "$out/adapter" | sed 's/^/  /'

full_args=()
plot_full=()
if [ "${FULL:-1}" != "0" ]; then
  phase "5. for comparison: full fine-tune of every parameter on '$new_category'"
  configure "$here/full.json" "$out/full.json" "${STEPS:-300}"
  mkdir -p "$out/full"
  "$KILN" train --init-from "$out/base_hf" --data "$out/new_train.txt" --eval-data "$out/new_eval.txt" --train "$out/full.json" \
    --save "$out/full/model.safetensors" --log "$out/full/log.jsonl" --progress "$progress"
  full_args=(--full "$out/full/model.safetensors")
  plot_full=(--log "$out/full/log.jsonl" --label "full fine-tune (lr 1e-3)")
fi

phase "6. held-out losses before and after, merging, the merged model as a Hugging Face directory"
max_new=()
[ -n "${MAX_NEW_LOSS:-}" ] && max_new=(--max-new-loss "$MAX_NEW_LOSS")
"$EXAMPLE" --base "$out/base_hf" --adapter "$out/adapter" --new "$out/new_eval.txt" --original "$out/original_eval.txt" \
  "${full_args[@]}" --merged-out "$out/merged_hf" --batches "${EVAL_BATCHES:-8}" --batch-size 16 --seq-len 128 \
  --log-eval "$(last_eval "$out/lora/log.jsonl")" "${max_new[@]}" --json "$out/results.json"

phase "7. the curves (kiln plot) and a sample of the base and of the merged model"
"$KILN" plot --log "$out/lora/log.jsonl" --label "LoRA r ${LORA_R:-8} (lr 3e-3)" "${plot_full[@]}" --out "$out/curves.png" --size 1200x800 \
  --title "kiln train --init-from: LoRA vs full fine-tune on fortunes' $new_category"
for model in base_hf merged_hf; do
  echo "--- $model (temperature 0.8, top-k 40) ---"
  "$KILN" generate "$out/$model" --prompt "The " --max-new-tokens "${SAMPLE_TOKENS:-200}" --temperature 0.8 --top-k 40 --seed 1 2>/dev/null
done
echo
echo "lora_finetune: done in $SECONDS s; results in $out (results.json, curves.png, adapter/, merged_hf/)"
