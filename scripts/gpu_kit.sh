#!/usr/bin/env bash
# Packs the Debian libraries kiln builds against into .gpukit/deps.tar.xz, for a GPU machine whose image
# has nvcc, CMake, g++ and PyTorch but not these (nothing can be installed there). Run it here, then on
# the GPU machine (the device tool's `run`, carrying .gpukit) run scripts/gpu_run.sh; see docs/cuda.md,
# "On a GPU machine".
#
# Packed, from this machine's packages: fmt, nlohmann-json, Catch2 v2, PCRE2, SentencePiece (+ protobuf), utf8proc, OpenBLAS (OpenMP build) with its
# CBLAS headers and runtime needs (libgfortran, libquadmath), zlib. Not packed: oneDNN (40 MB; the GPU
# build turns it off, the Cpu backend then uses OpenBLAS alone) and Google Benchmark (the GPU build
# does not build the CPU benchmarks). The tree keeps Debian's paths (usr/include, usr/lib/<arch>, ...),
# so CMake finds everything under -DKILN_DEPS_ROOT=<where it was unpacked>.
set -euo pipefail
cd "$(dirname "$0")/.."
arch="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)"
pkgs=(libfmt-dev libfmt9 nlohmann-json3-dev catch2 libopenblas0-openmp libopenblas-pthread-dev libgfortran5 libquadmath0 zlib1g-dev zlib1g
      libpcre2-dev libpcre2-8-0 libsentencepiece-dev libsentencepiece0 libprotobuf32 libutf8proc-dev libutf8proc2)  # kiln::text
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || { echo "gpu_kit: package $p is missing: run scripts/setup.sh first" >&2; exit 1; }
done
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
root="$stage/deps"
mkdir -p "$root"
# Every file of the packages, minus documentation, static archives, the BLAS/LAPACK alternatives and
# the pthread OpenBLAS library itself (only its headers are wanted: kiln links the OpenMP build).
# Relative links stay links; absolute ones (/etc/alternatives, /lib) are followed.
dpkg -L "${pkgs[@]}" | sort -u | while read -r f; do
  [ -f "$f" ] || continue
  case "$f" in
    /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/* | *.a) continue ;;
    */openblas-pthread/*.so* | */openblas-pthread/cmake/* | */openblas-pthread/pkgconfig/*) continue ;;
    */libblas.so* | */liblapack.so*) continue ;;
  esac
  mkdir -p "$root$(dirname "$f")"
  if [ -L "$f" ] && [[ "$(readlink "$f")" != /* ]]; then
    cp -P "$f" "$root$f"
  else
    cp -L "$f" "$root$f"
  fi
done
# zlib's runtime lives in /lib (merged into /usr/lib on current systems): one tree.
if [ -d "$root/lib" ]; then
  cp -a "$root/lib/." "$root/usr/lib/"
  rm -rf "$root/lib"
fi
# The CBLAS headers where Debian's alternatives put them.
for h in cblas.h f77blas.h openblas_config.h; do
  cp -L "/usr/include/$arch/openblas-pthread/$h" "$root/usr/include/$arch/$h"
done
mkdir -p .gpukit
tar -C "$stage" -cJf .gpukit/deps.tar.xz deps
echo "gpu_kit: wrote .gpukit/deps.tar.xz ($(du -h .gpukit/deps.tar.xz | cut -f1)); carry .gpukit and run scripts/gpu_run.sh on the GPU machine"
