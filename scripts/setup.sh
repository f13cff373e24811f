#!/usr/bin/env bash
# Installs the Debian packages kiln needs, only those that are missing. Idempotent: a second run
# installs nothing and takes a second. Both README commands call it first.
#   scripts/setup.sh            build + test dependencies
#   scripts/setup.sh --python   also PyTorch/NumPy for the parity tests and the reference benchmark
#   scripts/setup.sh --data     also the Fashion-MNIST dataset (examples/fashion_mnist_mlp)
set -euo pipefail

pkgs=(build-essential cmake pkg-config libopenblas-dev libopenblas0-openmp libdnnl-dev catch2
      libfmt-dev nlohmann-json3-dev libbenchmark-dev zlib1g-dev
      gnuplot-nox  # kiln plot (training curves)
      clang libclang-rt-dev  # the readers' libFuzzer targets (fuzz/, tests/fuzz)
      libopenmpi-dev openmpi-bin  # kiln::dist over MPI (mpirun, the dist tests)
      ocl-icd-opencl-dev)  # Debian's oneDNN CMake package requires OpenCL (a Recommends of libdnnl-dev)
for arg in "$@"; do
  case "$arg" in
    --python) pkgs+=(python3 python3-torch python3-numpy) ;;
    --data) pkgs+=(dataset-fashion-mnist) ;;
    *) echo "setup.sh: unknown argument '$arg' (valid: --python, --data)" >&2; exit 2 ;;
  esac
done

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
