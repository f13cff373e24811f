// A GCC 12 wrong-code bug that kiln's AVX-512 code is exposed to (CMakeLists.txt runs this at configure
// time, cmake/KilnAvx512Check.cmake). With AVX-512 enabled, GCC 12 copies 32-byte blocks as one 256-bit
// integer (OImode) value; a constant such value is rewritten as a broadcast of its low 64 bits when
// "all its 64-bit words are equal", but the check looks only at the words the compressed constant
// stores (ix86_convert_const_wide_int_to_broadcast loops over CONST_WIDE_INT_NUNITS, 3 for
// {x, x, x, 0} with a non-negative x: the zero top word is implicit). So std::vector<double>{1, 1, 1, 0}
// is built as {1, 1, 1, 1}: tests/autograd/semantics.cpp saw it. Not undefined behaviour: the GIMPLE
// is right, the RTL expansion is not. The same happens without AVX-512 at -mmove-max=256; AVX-512 only
// turns on the 256-bit block moves that carry such constants. -mtune-ctrl=^inter_unit_moves_to_vec
// switches the broadcast rewrite off at its first test (a tuning knob: correctness never depends on it).
// The function is compiled as kiln's AVX-512 kernels are (a target region; the whole file in a native
// build). Exit 0: right; 1: miscompiled; 2: this CPU cannot run AVX-512, nothing checked.
#include <cstdio>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl")
__attribute__((noipa)) bool last_is_zero(const std::vector<double>& v) { return v.size() == 4 && v[3] == 0.0; }
__attribute__((noinline)) bool check() { return last_is_zero({1.0, 1.0, 1.0, 0.0}); }
#pragma GCC pop_options

int main() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512vl")) {
    std::printf("no AVX-512 on this CPU: not checked\n");
    return 2;
  }
  const bool ok = check();
  std::printf("std::vector<double>{1, 1, 1, 0} %s\n", ok ? "built right" : "built wrong (GCC 12 constant broadcast bug)");
  return ok ? 0 : 1;
}
