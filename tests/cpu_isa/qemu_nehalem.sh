#!/usr/bin/env bash
# A portable build never executes an instruction the CPU lacks: kiln train runs under QEMU user-mode
# emulation of a CPU without AVX (Nehalem: SSE4.2), which raises SIGILL on any AVX instruction (a
# -march=native build dies at once). Checks that it trains, reports the baseline instruction set,
# matches the host's KILN_CPU_ISA=baseline losses, and that KILN_CPU_ISA=avx2 there is a clean error.
# Exit 77 (skipped) without qemu-x86_64 (Debian: apt-get install qemu-user).
#   qemu_nehalem.sh KILN WORKDIR SOURCE_DIR
set -euo pipefail
KILN=$1
work=$2
src=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/tiny.sh"
command -v qemu-x86_64 > /dev/null || { echo "SKIP: qemu-x86_64 not found (apt-get install qemu-user)"; exit 77; }
rm -rf "$work" && mkdir -p "$work" && cd "$work"
tiny_setup "$KILN" "$src"

KILN_CPU_ISA=baseline train host.jsonl > host.out 2>&1
# OpenBLAS 0.3.21 picks its Haswell (AVX2) kernels under qemu-user whatever CPU is emulated; on a real
# CPU it detects the CPU itself. Name the kernels of the emulated one.
export OPENBLAS_CORETYPE=Nehalem
unset KILN_CPU_ISA
set +e
RUN="qemu-x86_64 -cpu Nehalem" train nehalem.jsonl > nehalem.out 2>&1
rc=$?
set -e
[ $rc -eq 0 ] || { echo "FAIL: kiln train on an emulated Nehalem exited $rc (132: SIGILL):"; cat nehalem.out; exit 1; }
grep -q "device cpu (baseline)" nehalem.out || { echo "FAIL: expected 'device cpu (baseline)' in:"; cat nehalem.out; exit 1; }
same_losses nehalem.jsonl host.jsonl

set +e
KILN_CPU_ISA=avx2 RUN="qemu-x86_64 -cpu Nehalem" train avx2.jsonl > avx2.out 2>&1
rc=$?
set -e
[ $rc -eq 1 ] && grep -q "KILN_CPU_ISA=avx2: this CPU does not support AVX2" avx2.out ||
  { echo "FAIL: KILN_CPU_ISA=avx2 on an emulated Nehalem: expected exit 1 and the message, got $rc:"; cat avx2.out; exit 1; }
echo "Nehalem (qemu): trained at the baseline ISA, losses as on the host; KILN_CPU_ISA=avx2 refused"
