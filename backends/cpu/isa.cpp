// The instruction set of the Cpu backend's own kernels (common.hpp, "instruction sets"), chosen once:
// KILN_CPU_ISA=baseline|avx2 when set (for tests, benchmarks and users), else the best this CPU has.
// AVX2 counts only with FMA and with the OS saving the YMM registers (GCC's CPU model checks XGETBV).
// OpenBLAS, oneDNN and glibc choose their own code from CPUID; KILN_CPU_ISA does not reach them.
#include <cstdlib>
#include <string>

#include "kiln/backends/cpu/common.hpp"

namespace kiln {
namespace cpu {
namespace {

constexpr Isa kAll[] = {Isa::baseline, Isa::avx2};  // in order of preference, best last

bool cpu_has(Isa i) {
  switch (i) {
    case Isa::baseline: return true;
    case Isa::avx2:
#if KILN_CPU_X86
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
  }
  return false;
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
    KILN_CHECK(cpu_has(i), "KILN_CPU_ISA={}: this CPU does not support {} (the best it has is {}); set KILN_CPU_ISA={} or unset it",
               want, i == Isa::avx2 ? "AVX2 with FMA" : isa_name(i), isa_name(best()), isa_name(best()));
    return i;
  }
  fail("KILN_CPU_ISA={}: unknown instruction set; valid: baseline, avx2 (unset: the best this CPU has, here {})", want,
       isa_name(best()));
}

}  // namespace

std::string_view isa_name(Isa i) { return i == Isa::avx2 ? "avx2" : "baseline"; }

Isa isa() {
  // A bad KILN_CPU_ISA throws here; the static stays uninitialised, so every later call throws too.
  static const Isa chosen = choose();
  return chosen;
}

}  // namespace cpu

std::string_view cpu_isa() { return cpu::isa_name(cpu::isa()); }

}  // namespace kiln
