#!/bin/sh
# Makes bench/.venv-torch2 (git-ignored): a current PyTorch from PyPI beside Debian's torch 1.13, for
# bench/train_vs_torch2.py (kiln vs PyTorch 1.13, PyTorch 2 eager and torch.compile on the same models).
#   bench/torch2/setup.sh [torch version, default 2.15.0]
# The CPU wheel index (https://download.pytorch.org/whl/cpu, ~200 MB) is tried first; where it cannot be
# reached, the default PyPI wheel is used (it brings the CUDA libraries: about 4 GB on disk, unused here).
# torch.compile on CPU needs a C++ compiler (g++) at run time; the venv gets no other package than
# torch and its dependencies (numpy for the tensors' interop, which torch 2 asks for).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
VENV="$HERE/../.venv-torch2"
VER="${1:-2.15.0}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
if ! "$VENV/bin/pip" install --quiet --index-url https://download.pytorch.org/whl/cpu "torch==$VER" 2>/dev/null; then
  echo "setup.sh: the CPU wheel index is unreachable; installing torch==$VER from PyPI (with CUDA libraries, ~4 GB)" >&2
  "$VENV/bin/pip" install --quiet "torch==$VER"
fi
"$VENV/bin/pip" install --quiet numpy
"$VENV/bin/python" -c 'import torch; print("bench/.venv-torch2:", "torch", torch.__version__)'
