#!/usr/bin/env bash
# KILN_CPU_ISA chooses the instruction set of the Cpu backend's kernels, and kiln train's banner names
# it: unset, the best this CPU has (avx2 where /proc/cpuinfo lists avx2 and fma); baseline always works
# and trains to the same losses; avx2 works where the CPU has it and is otherwise an error; an unknown
# name is an error (exit status 1 and the message, never a crash).
#   isa_cli.sh KILN WORKDIR SOURCE_DIR
set -euo pipefail
KILN=$1
work=$2
src=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/tiny.sh"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
tiny_setup "$KILN" "$src"

best=baseline
if [ "$(uname -m)" = x86_64 ] && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then best=avx2; fi

banner_says() {  # banner_says OUTPUT ISA
  grep -q "device cpu ($2)" "$1" || { echo "FAIL: expected 'device cpu ($2)' in:"; cat "$1"; exit 1; }
}

(unset KILN_CPU_ISA; train auto.jsonl) > auto.out 2>&1
banner_says auto.out "$best"
KILN_CPU_ISA=baseline train baseline.jsonl > baseline.out 2>&1
banner_says baseline.out baseline
same_losses baseline.jsonl auto.jsonl

set +e
KILN_CPU_ISA=avx2 train avx2.jsonl > avx2.out 2>&1
rc=$?
KILN_CPU_ISA=sse9 train bad.jsonl > bad.out 2>&1
rc_bad=$?
set -e
if [ "$best" = avx2 ]; then
  [ $rc -eq 0 ] || { echo "FAIL: KILN_CPU_ISA=avx2 on an AVX2 CPU exited $rc:"; cat avx2.out; exit 1; }
  banner_says avx2.out avx2
  same_losses avx2.jsonl baseline.jsonl
else
  [ $rc -eq 1 ] && grep -q "KILN_CPU_ISA=avx2: this CPU does not support AVX2" avx2.out ||
    { echo "FAIL: KILN_CPU_ISA=avx2 without AVX2: expected exit 1 and the message, got $rc:"; cat avx2.out; exit 1; }
fi
[ $rc_bad -eq 1 ] && grep -q "KILN_CPU_ISA=sse9: unknown instruction set; valid: baseline, avx2" bad.out ||
  { echo "FAIL: KILN_CPU_ISA=sse9: expected exit 1 and the message, got $rc_bad:"; cat bad.out; exit 1; }
echo "KILN_CPU_ISA: unset -> $best, baseline and avx2 as documented, an unknown name is an error"
