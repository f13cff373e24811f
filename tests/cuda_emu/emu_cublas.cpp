// The emulated device's cuBLAS: the subset of libcublas that kiln's Cuda backend calls
// (backends/cuda/runtime.cpp, backends/cuda/matmul.cpp), on the host, with cuBLAS's documented
// argument rules, so that kiln's translation of strided views into GEMM calls (transpose flags,
// leading dimensions, batch strides, folded batches) is exercised without a GPU.
//
// cublasGemmStridedBatchedEx_64 follows the cuBLAS documentation of cublasGemmEx:
//  * CUBLAS_STATUS_INVALID_VALUE for m, n, k or batchCount < 0, an unknown transpose, lda < max(1, m)
//    (op N) or max(1, k) (op T), ldb < max(1, k) (op N) or max(1, n) (op T), ldc < max(1, m);
//  * CUBLAS_STATUS_NOT_SUPPORTED for a type combination outside the table (A and B 32F/16F/16BF with C
//    of the same type or 32F under CUBLAS_COMPUTE_32F, 32F under CUBLAS_COMPUTE_32F_FAST_TF32, 64F
//    under CUBLAS_COMPUTE_64F);
//  * alpha and beta in host memory, float for the 32F compute types, double for 64F; beta == 0 means
//    C is not read (garbage and NaN in C do not leak into the result).
// Arithmetic: one accumulator per element, summed over k in order with fma, in f32 (COMPUTE_32F; the
// inputs first rounded to TF32's 10-bit mantissa under FAST_TF32) or f64 (COMPUTE_64F); the result is
// rounded once to C's type.
// Beyond cuBLAS (it would read or write out of bounds, or race, silently), the emulator fails with
// CUBLAS_STATUS_EXECUTION_FAILED and a line on stderr when an operand's footprint is not inside one
// live device allocation, when C overlaps A or B, or when two batch items write the same element of C.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "emu_device.hpp"

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t mode = CUBLAS_DEFAULT_MATH;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

namespace {

cublasStatus_t complain(cublasStatus_t s, const std::string& what) {
  std::fprintf(stderr, "emu cublas: %s\n", what.c_str());
  return s;
}

size_t type_size(cudaDataType t) {
  switch (t) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_64F:
      return 8;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
    default:
      return 0;
  }
}

double load(const void* p, cudaDataType t, int64_t i) {
  switch (t) {
    case CUDA_R_32F:
      return static_cast<const float*>(p)[i];
    case CUDA_R_64F:
      return static_cast<const double*>(p)[i];
    case CUDA_R_16F:
      return static_cast<double>(__half2float(static_cast<const __half*>(p)[i]));
    default:
      return static_cast<double>(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
  }
}

void store(void* p, cudaDataType t, int64_t i, double v) {
  switch (t) {
    case CUDA_R_32F:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case CUDA_R_64F:
      static_cast<double*>(p)[i] = v;
      break;
    case CUDA_R_16F:
      static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v));
      break;
    default:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v));
      break;
  }
}

// Rounds an f32 to TF32 (10 explicit mantissa bits, round to nearest even), as the tensor cores read it.
float to_tf32(float x) {
  if (!std::isfinite(x)) return x;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0xfffu + ((u >> 13) & 1u);
  u &= ~0x1fffu;
  std::memcpy(&x, &u, 4);
  return x;
}

// One operand's element footprint, in elements relative to its pointer: [lo, hi].
struct Span {
  int64_t lo, hi;
};
Span footprint(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t batch) {
  const int64_t last = (cols - 1) * ld + rows - 1;
  const int64_t spread = (batch - 1) * stride;
  return {std::min<int64_t>(0, spread), std::max<int64_t>(0, spread) + last};
}

bool inside(const void* p, size_t es, Span s) {
  return emu::device::contains(static_cast<const char*>(p) + s.lo * static_cast<int64_t>(es), static_cast<size_t>(s.hi - s.lo + 1) * es);
}

}  // namespace

// ------------------------------------------------------------------------------------ handles
cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}
// cuBLAS's rules: a workspace of at least 256-byte alignment inside device memory (checked here against
// the live allocations), or none.
cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t h, void* workspace, size_t bytes) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes > 0 && (!workspace || reinterpret_cast<uintptr_t>(workspace) % 256 != 0))
    return complain(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace: workspace not 256-byte aligned");
  if (bytes > 0 && !emu::device::contains(workspace, bytes))
    return complain(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace: workspace " + emu::device::describe(workspace) + " of " +
                                                     std::to_string(bytes) + " bytes is not inside one device allocation");
  h->workspace = workspace;
  h->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    default:
      return "CUBLAS_STATUS_UNKNOWN";
  }
}
const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    default:
      return "unknown error";
  }
}

// ------------------------------------------------------------------------------------ GEMM
cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx_64(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                                          int64_t m, int64_t n, int64_t k, const void* alpha, const void* A,
                                                          cudaDataType Atype, int64_t lda, long long int strideA, const void* B,
                                                          cudaDataType Btype, int64_t ldb, long long int strideB, const void* beta, void* C,
                                                          cudaDataType Ctype, int64_t ldc, long long int strideC, int64_t batchCount,
                                                          cublasComputeType_t computeType, cublasGemmAlgo_t) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto op_ok = [](cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T || o == CUBLAS_OP_C; };
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  const std::string args = "m " + std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k) + " lda " +
                           std::to_string(lda) + " ldb " + std::to_string(ldb) + " ldc " + std::to_string(ldc) + " strides " +
                           std::to_string(strideA) + "/" + std::to_string(strideB) + "/" + std::to_string(strideC) + " batch " +
                           std::to_string(batchCount) + (ta ? " opA T" : " opA N") + (tb ? " opB T" : " opB N");
  if (m < 0 || n < 0 || k < 0 || batchCount < 0 || !op_ok(transa) || !op_ok(transb) || lda < std::max<int64_t>(1, ta ? k : m) ||
      ldb < std::max<int64_t>(1, tb ? n : k) || ldc < std::max<int64_t>(1, m) || !alpha || !beta)
    return complain(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmStridedBatchedEx_64: invalid value: " + args);
  const bool half_in = Atype == CUDA_R_16F || Atype == CUDA_R_16BF;
  const bool types_ok =
      Atype == Btype && (Ctype == Atype || (half_in && Ctype == CUDA_R_32F)) &&
      ((computeType == CUBLAS_COMPUTE_32F && (Atype == CUDA_R_32F || half_in)) ||
       (computeType == CUBLAS_COMPUTE_32F_FAST_TF32 && Atype == CUDA_R_32F) || (computeType == CUBLAS_COMPUTE_64F && Atype == CUDA_R_64F));
  if (!types_ok)
    return complain(CUBLAS_STATUS_NOT_SUPPORTED, "cublasGemmStridedBatchedEx_64: unsupported types A " + std::to_string(Atype) + " B " +
                                                     std::to_string(Btype) + " C " + std::to_string(Ctype) + " compute " +
                                                     std::to_string(computeType));
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;

  const bool f64 = computeType == CUBLAS_COMPUTE_64F, tf32 = computeType == CUBLAS_COMPUTE_32F_FAST_TF32;
  const double al = f64 ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  const double be = f64 ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  const size_t ea = type_size(Atype), ec = type_size(Ctype);

  // Footprints: every element the call may touch lies inside one live allocation; C is disjoint from
  // A and B; batch items write disjoint elements of C.
  const Span sc = footprint(m, n, ldc, strideC, batchCount);
  if (!inside(C, ec, sc)) return complain(CUBLAS_STATUS_EXECUTION_FAILED, "C out of bounds: " + args + ", C " + emu::device::describe(C));
  if (k > 0 && al != 0) {
    const Span sa = footprint(ta ? k : m, ta ? m : k, lda, strideA, batchCount);
    const Span sb = footprint(tb ? n : k, tb ? k : n, ldb, strideB, batchCount);
    if (!inside(A, ea, sa)) return complain(CUBLAS_STATUS_EXECUTION_FAILED, "A out of bounds: " + args + ", A " + emu::device::describe(A));
    if (!inside(B, ea, sb)) return complain(CUBLAS_STATUS_EXECUTION_FAILED, "B out of bounds: " + args + ", B " + emu::device::describe(B));
    auto overlaps = [&](const void* p, size_t es, Span s) {
      const char* c0 = static_cast<const char*>(C) + sc.lo * static_cast<int64_t>(ec);
      const char* c1 = static_cast<const char*>(C) + (sc.hi + 1) * static_cast<int64_t>(ec);
      const char* p0 = static_cast<const char*>(p) + s.lo * static_cast<int64_t>(es);
      const char* p1 = static_cast<const char*>(p) + (s.hi + 1) * static_cast<int64_t>(es);
      return p0 < c1 && c0 < p1;
    };
    if (overlaps(A, ea, sa) || overlaps(B, ea, sb)) return complain(CUBLAS_STATUS_EXECUTION_FAILED, "C overlaps A or B: " + args);
  }
  if (batchCount > 1 && sc.hi - sc.lo < (int64_t{1} << 26)) {
    std::vector<bool> seen(static_cast<size_t>(sc.hi - sc.lo + 1));
    for (int64_t b = 0; b < batchCount; ++b)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < m; ++i) {
          const auto at = static_cast<size_t>(b * strideC + j * ldc + i - sc.lo);
          if (seen[at]) return complain(CUBLAS_STATUS_EXECUTION_FAILED, "batch items write the same element of C: " + args);
          seen[at] = true;
        }
  }

  for (int64_t b = 0; b < batchCount; ++b) {
    const int64_t oa = b * strideA, ob = b * strideB, oc = b * strideC;
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        const int64_t ci = oc + j * ldc + i;
        double r;
        if (f64) {
          double acc = 0;
          for (int64_t l = 0; l < k && al != 0; ++l)
            acc =
                std::fma(load(A, Atype, oa + (ta ? i * lda + l : l * lda + i)), load(B, Btype, ob + (tb ? l * ldb + j : j * ldb + l)), acc);
          r = al * acc + (be != 0 ? be * load(C, Ctype, ci) : 0.0);
        } else {
          float acc = 0;
          for (int64_t l = 0; l < k && al != 0; ++l) {
            float x = static_cast<float>(load(A, Atype, oa + (ta ? i * lda + l : l * lda + i)));
            float y = static_cast<float>(load(B, Btype, ob + (tb ? l * ldb + j : j * ldb + l)));
            if (tf32) {
              x = to_tf32(x);
              y = to_tf32(y);
            }
            acc = std::fma(x, y, acc);
          }
          float rf = static_cast<float>(al) * acc;
          if (be != 0) rf = std::fma(static_cast<float>(be), static_cast<float>(load(C, Ctype, ci)), rf);
          r = rf;
        }
        store(C, Ctype, ci, r);
      }
  }
  return CUBLAS_STATUS_SUCCESS;
}

// The 32-bit-integer GEMM (bench/cuda's raw peer): one batch item of the above.
cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                                         const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B, cudaDataType Btype,
                                         int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                         cublasGemmAlgo_t algo) {
  return cublasGemmStridedBatchedEx_64(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C, Ctype, ldc, 0,
                                       1, computeType, algo);
}
