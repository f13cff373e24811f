# Sourced by the cpu_isa tests: writes a tiny GPT (differential attention, block Attention Residuals:
# matmul, flash attention, depth attention, RMSNorm, softmax cross-entropy, AdamW) and character
# tokens of the README into the current folder; train() runs 2 steps of it and logs them.
#   tiny_setup KILN SRC      then: train LOG [kiln train args...]  (with any launcher in $RUN)
tiny_setup() {
  local kiln=$1 src=$2
  cat > model.json <<'JSON'
{"vocab_size": 128, "d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 32, "attention": "diff",
 "residual": "attnres_block", "attnres_block_size": 2}
JSON
  echo '{"batch_size": 4, "seq_len": 32, "steps": 2}' > train.json
  head -c 20000 "$src/README.md" > corpus.txt
  "$kiln" tokenize --text corpus.txt --out tokens.safetensors --chars > /dev/null
}

# The kiln command re-executes itself to set GOMP_SPINCOUNT; under qemu-user that child would run on
# the host CPU, so it is told not to (KILN_NO_REEXEC).
train() {
  local log=$1
  shift
  KILN_NO_REEXEC=1 KILN_NUM_THREADS=2 ${RUN:-} "$KILN" train --model model.json --train train.json --data tokens.safetensors \
    --seed 1 --log "$log" "$@"
}

# The losses of two logs agree to a relative 1e-4 (the same model through different kernels: rounding
# only; a wrong kernel is off by far more).
losses() { grep -o '"loss":[^,}]*' "$1" | cut -d: -f2 | tr '\n' ' '; }
same_losses() {
  local a b
  a=$(losses "$1")
  b=$(losses "$2")
  awk -v a="$a" -v b="$b" 'BEGIN {
    n = split(a, x, " "); m = split(b, y, " ")
    if (n != 2 || m != 2) { print "expected 2 logged steps each, got: " a " / " b; exit 1 }
    for (i = 1; i <= n; i++) {
      d = x[i] - y[i]; if (d < 0) d = -d
      r = y[i] < 0 ? -y[i] : y[i]
      if (!(d <= 1e-4 * r)) { print "losses differ: " a " vs " b; exit 1 }
    }
    print "losses agree: " a " vs " b }'
}
