// The instruction set of the Cpu backend's own kernels (common.hpp, "instruction sets"), chosen once:
// KILN_CPU_ISA=baseline|avx2|avx512 when set (for tests, benchmarks and users), else the best this CPU
// has. AVX2 counts only with FMA, AVX-512 only with F, BW, DQ and VL (what the kernels are compiled
// for), each only with the OS saving the YMM / ZMM and mask registers (GCC's CPU model checks XGETBV:
// __builtin_cpu_supports reports no AVX-512 feature where the OS does not enable that state).
// OpenBLAS, oneDNN and glibc choose their own code from CPUID; KILN_CPU_ISA does not reach them.
#include <cstdlib>
#include <string>

#include "kiln/backends/cpu/common.hpp"

namespace kiln {
namespace cpu {
namespace {

constexpr Isa kAll[] = {Isa::baseline, Isa::avx2, Isa::avx512};  // in order of preference, best last

bool cpu_has(Isa i) {
  switch (i) {
    case Isa::baseline:
      return true;
    case Isa::avx2:
#if KILN_CPU_X86
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
    case Isa::avx512:
#if KILN_CPU_X86 && !defined(KILN_CPU_NO_AVX512)  // (set by the build where the compiler's AVX-512 code is wrong)
      __builtin_cpu_init();
      return cpu_has(Isa::avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
      return false;
#endif
  }
  return false;
}

std::string_view describe(Isa i) {
  switch (i) {
    case Isa::baseline:
      return "baseline";
    case Isa::avx2:
      return "AVX2 with FMA";
    case Isa::avx512:
      return "AVX-512 F/BW/DQ/VL";
  }
  return "?";
}

Isa best() {
  Isa b = Isa::baseline;
  for (Isa i : kAll)
    if (cpu_has(i)) b = i;
  return b;
}

Isa choose() {
  const char* env = std::getenv("KILN_CPU_ISA");
  if (!env || !*env) return best();
  const std::string_view want(env);
  for (Isa i : kAll) {
    if (want != isa_name(i)) continue;
    KILN_CHECK(cpu_has(i), "KILN_CPU_ISA={}: this CPU does not support {} (the best it has is {}); set KILN_CPU_ISA={} or unset it", want,
               describe(i), isa_name(best()), isa_name(best()));
    return i;
  }
  fail("KILN_CPU_ISA={}: unknown instruction set; valid: baseline, avx2, avx512 (unset: the best this CPU has, here {})", want,
       isa_name(best()));
}

}  // namespace

std::string_view isa_name(Isa i) {
  switch (i) {
    case Isa::baseline:
      return "baseline";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
  }
  return "?";
}

Isa best_isa() { return best(); }

Isa isa() {
  // A bad KILN_CPU_ISA throws here; the static stays uninitialised, so every later call throws too.
  static const Isa chosen = choose();
  return chosen;
}

}  // namespace cpu

std::string_view cpu_isa() { return cpu::isa_name(cpu::isa()); }

}  // namespace kiln
