#!/bin/sh
# The peer of bench/hf/bench_generate.py: transformers on a current PyTorch 2 (eager), in
# bench/.venv-torch2 (git-ignored; made by bench/torch2/setup.sh when it is not there yet).
#   bench/hf/setup.sh [transformers version, default 5.24.0] [torch version, passed to bench/torch2/setup.sh]
# transformers 5 needs torch >= 2.x; Debian's torch 1.13 (.venv-hf, scripts/hf_venv.sh) is the
# reference of the tests, not the speed peer. Nothing is installed at kiln's run time.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
VENV="$HERE/../.venv-torch2"
TF="${1:-5.24.0}"
if ! [ -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  if [ $# -ge 2 ]; then sh "$HERE/../torch2/setup.sh" "$2"; else sh "$HERE/../torch2/setup.sh"; fi
fi
"$VENV/bin/pip" install --quiet "transformers==$TF" safetensors
"$VENV/bin/python" -c 'import torch, transformers; print("bench/.venv-torch2: torch", torch.__version__, "transformers", transformers.__version__)'
