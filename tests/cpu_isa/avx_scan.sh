#!/usr/bin/env bash
# A portable build holds AVX instructions only where they are chosen at run time: every function of
# libkiln with a VEX/EVEX-encoded instruction (an x86 mnemonic starting with v) is an AVX2 or AVX-512
# kernel variant or primitive (its name carries Avx2/avx2/Avx512/avx512, backends/cpu/common.hpp), and
# no other function holds an AVX-512 one (a zmm or mask register, EVEX-only), and the kiln command
# has none. Catches a file compiled with -mavx2, an #ifdef __AVX2__ body, or an AVX2 COMDAT copy of
# an inline function kept by the linker, on paths no test runs.
#   avx_scan.sh LIBKILN KILN
set -euo pipefail
vex_functions() {  # the demangled names of the functions of $1 with VEX/EVEX instructions
  objdump -d --no-show-raw-insn -C "$1" |
    awk '/^[0-9a-f]+ <.*>:$/ { name = $0; next } /^ *[0-9a-f]+:\t(v[a-z0-9]+)( |$)/ { if (!(name in seen)) { seen[name] = 1; print name } }'
}
evex512_functions() {  # ... with AVX-512 instructions: a zmm register or a mask register (k0-k7)
  objdump -d --no-show-raw-insn -C "$1" |
    awk '/^[0-9a-f]+ <.*>:$/ { name = $0; next } /^ *[0-9a-f]+:\t/ && /%zmm|%k[0-7]/ { if (!(name in seen)) { seen[name] = 1; print name } }'
}
lib=$(vex_functions "$1")
n=$(printf '%s\n' "$lib" | grep -c . || true)
[ "$n" -gt 0 ] || { echo "FAIL: no AVX instruction in $1 at all: are the AVX2 variants compiled (and the scan right)?"; exit 1; }
bad=$(printf '%s\n' "$lib" | grep -viE 'avx2|avx512' || true)
[ -z "$bad" ] || { echo "FAIL: AVX instructions outside the AVX2 / AVX-512 variants of $1:"; printf '%s\n' "$bad" | cut -c1-300; exit 1; }
lib512=$(evex512_functions "$1")
n512=$(printf '%s\n' "$lib512" | grep -c . || true)
[ "$n512" -gt 0 ] || { echo "FAIL: no AVX-512 instruction in $1 at all: are the AVX-512 variants compiled (and the scan right)?"; exit 1; }
bad=$(printf '%s\n' "$lib512" | grep -vi 'avx512' || true)
[ -z "$bad" ] || { echo "FAIL: AVX-512 instructions outside the AVX-512 variants of $1:"; printf '%s\n' "$bad" | cut -c1-300; exit 1; }
cli=$(vex_functions "$2")
[ -z "$cli" ] || { echo "FAIL: AVX instructions in $2:"; printf '%s\n' "$cli" | cut -c1-300; exit 1; }
echo "$n functions of $1 hold AVX instructions, all AVX2 / AVX-512 variants ($n512 with AVX-512 ones, all AVX-512 variants); $2 none"
