#!/usr/bin/env bash
# KILN_CPU_ISA chooses the instruction set of the Cpu backend's kernels, and kiln train's banner names
# it: unset, the best this CPU has (avx512 where /proc/cpuinfo lists avx2, fma and avx512 f/bw/dq/vl,
# else avx2 where it lists avx2 and fma); baseline always works and trains to the same losses; avx2 and
# avx512 work where the CPU has them and are otherwise an error; an unknown name is an error (exit
# status 1 and the message, never a crash).
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
has_flags() { for f in "$@"; do grep -qw "$f" /proc/cpuinfo || return 1; done; }
if [ "$(uname -m)" = x86_64 ] && has_flags avx2 fma; then best=avx2; fi
if [ $best = avx2 ] && has_flags avx512f avx512bw avx512dq avx512vl; then best=avx512; fi

banner_says() {  # banner_says OUTPUT ISA
  grep -q "device cpu ($2)" "$1" || { echo "FAIL: expected 'device cpu ($2)' in:"; cat "$1"; exit 1; }
}

(unset KILN_CPU_ISA; train auto.jsonl) > auto.out 2>&1
banner_says auto.out "$best"
KILN_CPU_ISA=baseline train baseline.jsonl > baseline.out 2>&1
banner_says baseline.out baseline
same_losses baseline.jsonl auto.jsonl

set +e
KILN_CPU_ISA=sse9 train bad.jsonl > bad.out 2>&1
rc_bad=$?
set -e
for isa in avx2 avx512; do
  set +e
  KILN_CPU_ISA=$isa train $isa.jsonl > $isa.out 2>&1
  rc=$?
  set -e
  if [ $best = avx512 ] || { [ $best = avx2 ] && [ $isa = avx2 ]; }; then
    [ $rc -eq 0 ] || { echo "FAIL: KILN_CPU_ISA=$isa on a CPU with it exited $rc:"; cat $isa.out; exit 1; }
    banner_says $isa.out $isa
    same_losses $isa.jsonl baseline.jsonl
  else
    want="KILN_CPU_ISA=$isa: this CPU does not support $([ $isa = avx2 ] && echo 'AVX2 with FMA' || echo 'AVX-512 F/BW/DQ/VL')"
    [ $rc -eq 1 ] && grep -q "$want" $isa.out ||
      { echo "FAIL: KILN_CPU_ISA=$isa without it: expected exit 1 and '$want', got $rc:"; cat $isa.out; exit 1; }
  fi
done
[ $rc_bad -eq 1 ] && grep -q "KILN_CPU_ISA=sse9: unknown instruction set; valid: baseline, avx2, avx512" bad.out ||
  { echo "FAIL: KILN_CPU_ISA=sse9: expected exit 1 and the message, got $rc_bad:"; cat bad.out; exit 1; }
echo "KILN_CPU_ISA: unset -> $best, baseline, avx2 and avx512 as documented, an unknown name is an error"
