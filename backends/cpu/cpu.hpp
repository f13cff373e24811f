#pragma once
// The Cpu backend: OpenBLAS (OpenMP build) or oneDNN for matmul, whichever measures faster for the
// shape class; OpenMP-parallel, vectorised loops for everything else; fused softmax. One OpenMP
// thread pool serves kiln and BLAS; its size comes from KILN_NUM_THREADS, else OMP_NUM_THREADS, else
// all cores (see threads.cpp).
#include <memory>
#include <string_view>
#include <vector>

#include "kiln/backends/host_storage.hpp"
#include "kiln/backends/primitives.hpp"
#include "kiln/core/backend.hpp"
#include "kiln/core/conv_params.hpp"
#include "kiln/core/fused_optim_params.hpp"
#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

struct Cpu {
  using Storage = HostStorage;
  using V = View<Storage>;
  using M = MutView<Storage>;
  static constexpr std::string_view name = "cpu";

  static std::shared_ptr<Storage> allocate(size_t bytes) { return HostStorage::make(bytes); }
  static void write(Storage& s, size_t off, const void* src, size_t n) { s.write(off, src, n); }
  static void read(const Storage& s, size_t off, void* dst, size_t n) { s.read(off, dst, n); }

  KILN_BACKEND_PRIMITIVES                                     // backends/primitives.hpp
      KILN_FUSED_RMS_NORM                                     // norm.cpp
          KILN_FUSED_SWIGLU                                   // unary.cpp
              KILN_FUSED_ROPE                                 // rope.cpp
                  KILN_FUSED_DIFF2_COMBINE                    // diff2.cpp
                      KILN_FUSED_DEPTH_ATTENTION              // depth.cpp
                          KILN_FUSED_SOFTMAX                  // softmax.cpp
                              KILN_FUSED_CROSS_ENTROPY        // softmax.cpp
                                  KILN_FUSED_ADAM             // optim.cpp
                                      KILN_FUSED_SUM_SQUARES  // optim.cpp
      // flash attention (attention.cpp): outputs in the inputs' layouts, every element written
      static constexpr bool attention_any_layout = true;
  // and with Gemma 2's soft cap on the scores (core/fused.hpp)
  static constexpr bool attention_softcap = true;
  // cross-entropy on bf16/f16 logits as they are (softmax.cpp; core/fused_loss.hpp)
  static constexpr bool cross_entropy_half = true;
  KILN_FUSED_ATTENTION
  KILN_FUSED_DIFF_ATTENTION  // both branches of differential attention in one op (attention.cpp)
      KILN_FUSED_CONV_POOL   // convolution (oneDNN, conv.cpp) and pooling (pool.cpp)
};
static_assert(Backend<Cpu>);

// Threads used by kiln's loops and BLAS (KILN_NUM_THREADS > OMP_NUM_THREADS > all cores).
int num_threads();
void set_num_threads(int n);

// The instruction set of the Cpu backend's own kernels, chosen once at first use: "avx512" (AVX-512 F,
// BW, DQ, VL), "avx2" (AVX2 + FMA) or "baseline" (any x86-64, or another architecture). KILN_CPU_ISA=
// baseline|avx2|avx512 chooses; unset, the best this CPU has. Throws kiln::Error when KILN_CPU_ISA is
// unknown or asks for what the CPU lacks. (OpenBLAS and oneDNN pick their own code for the CPU.)
std::string_view cpu_isa();

// Whether bf16 matmuls run on oneDNN's native bf16 kernels (bf16 operands, f32 accumulation, the output
// rounded once), which need AVX512-BF16 or AMX (as oneDNN sees the CPU: ONEDNN_MAX_CPU_ISA applies) and
// not KILN_CPU_MATMUL=blas. Otherwise they convert the operands to f32, run sgemm and round the output
// once: the same contract, another summation order. f16 matmuls always take the f32 path.
bool native_bf16_matmul();

// The kernels OpenBLAS chose for this CPU, as it names them ("Haswell", "SkylakeX", "Zen", ...;
// OPENBLAS_CORETYPE, read when the library loads, overrides its choice), and whether they predate the
// CPU: a core name from before AVX2 (e.g. its generic SSE3 "Prescott", which Debian 12's OpenBLAS 0.3.21
// takes on CPUs newer than it knows) where the CPU has AVX2 + FMA. Such kernels run several times below
// the CPU's speed, so the "auto" rule below then sends every f32 product of 32^3 or more to oneDNN.
std::string_view blas_core();
bool blas_core_predates_cpu();
namespace cpu {
// The rule of blas_core_predates_cpu on a given core name and CPU (case-insensitive name).
bool blas_core_predates(std::string_view core, bool cpu_has_avx2_fma);
}  // namespace cpu

// The library behind f32 matmuls (backends/cpu/matmul.cpp): "auto" (the default: oneDNN for batched
// products and single ones of 32^3 <= M·N·K < 1024^3, or of any size from 32^3 where OpenBLAS's kernels
// predate the CPU (blas_core_predates_cpu); OpenBLAS for the rest and for f64), "blas" or
// "onednn" (that library for every f32 product; blas also sends bf16 to the f32 path), for comparing
// them in one process. KILN_CPU_MATMUL sets the initial value. A name not listed, or onednn in a build
// without oneDNN, is a kiln::Error.
void set_matmul_library(std::string_view name);
std::string_view matmul_library();

extern template class Tensor<Cpu>;

}  // namespace kiln
#pragma GCC visibility pop
