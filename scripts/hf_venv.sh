#!/usr/bin/env bash
# Makes .venv-hf/ in the repository root (git-ignored): the Python reference for Hugging Face interop
# (tests' fixtures, benchmarks). Debian's python3 with --system-site-packages, so Debian's PyTorch
# (python3-torch) is used, plus transformers, tokenizers, sentencepiece and safetensors from PyPI at
# pinned versions. Idempotent: a second run checks the pins and installs nothing.
#   scripts/hf_venv.sh && .venv-hf/bin/python tests/text/make_fixtures.py
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv-hf"
pins=(transformers==4.46.3 tokenizers==0.20.3 sentencepiece==0.2.3 safetensors
      peft==0.13.2 accelerate==0.34.2 Jinja2)  # tests/lora: PEFT and its accelerate; Jinja2 for the model card PEFT writes
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"  # Debian's python3, which sees python3-torch
if ! "$venv/bin/python" - "${pins[@]}" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
for p in sys.argv[1:]:
    name, _, want = p.partition("==")
    have = version(name)
    if want and have != want:
        sys.exit(1)
PY
  "$venv/bin/pip" install -q "${pins[@]}"
fi
echo "$venv: transformers $("$venv/bin/python" -c 'import transformers; print(transformers.__version__)')"
