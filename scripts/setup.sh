#!/usr/bin/env bash
# Installs the Debian packages kiln needs, only those that are missing. Idempotent: a second run
# installs nothing and takes a second. Both README commands call it first.
#   scripts/setup.sh            build + test dependencies
#   scripts/setup.sh --main     only what the main job (scripts/train_demo.sh) builds and runs: the
#                               library and the kiln command without tests, benchmarks, fuzzers or MPI
#                               (about 300 MB less to fetch and unpack on a bare machine: clang/LLVM,
#                               Open MPI, Catch2, Google Benchmark)
#   scripts/setup.sh --python   also PyTorch/NumPy for the parity tests and the reference benchmark
#   scripts/setup.sh --data     also the examples' data: the Fashion-MNIST dataset (examples/fashion_mnist_*)
#                               and Debian's fortunes (examples/char_lstm, examples/lora_finetune)
set -euo pipefail

main=(build-essential cmake pkg-config libopenblas-dev libopenblas0-openmp libdnnl-dev
      libfmt-dev nlohmann-json3-dev zlib1g-dev
      gnuplot-nox  # kiln plot (training curves)
      libpcre2-dev libsentencepiece-dev libutf8proc-dev  # text/: the tokenizers (regexes, tokenizer.model, NFC)
      ocl-icd-opencl-dev)  # Debian's oneDNN CMake package requires OpenCL (a Recommends of libdnnl-dev)
rest=(catch2 libbenchmark-dev
      clang libclang-rt-dev  # the readers' libFuzzer targets (fuzz/, tests/fuzz)
      clang-format  # the house test that the tree follows .clang-format (clang-format 14)
      libopenmpi-dev openmpi-bin)  # kiln::dist over MPI (mpirun, the dist tests)
pkgs=("${main[@]}")
extra=("${rest[@]}")
for arg in "$@"; do
  case "$arg" in
    --main) extra=() ;;
    --python) pkgs+=(python3 python3-torch python3-numpy) ;;
    --data) pkgs+=(dataset-fashion-mnist fortunes) ;;
    *) echo "setup.sh: unknown argument '$arg' (valid: --main, --python, --data)" >&2; exit 2 ;;
  esac
done
pkgs+=("${extra[@]}")

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup.sh: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
