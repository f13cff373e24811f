// matmul on the Cuda backend: [..., M, K] @ [..., K, N] -> [..., M, N] through cuBLAS
// (cublasGemmStridedBatchedEx_64, the 64-bit-integer API, so no int32 limit on sizes or strides).
//
// The plan is backends/gemm_plan.hpp's, shared with the Cpu backend: each operand goes to cuBLAS as
// it lies (a transpose flag with the other stride as leading dimension: x @ Wᵀ costs no copy), only a
// matrix with no unit stride is staged to a contiguous temporary (Cuda::copy; broadcast batch dims not
// materialised), batch dims are coalesced, and [B, T, K] @ [K, N] folds the batch into M.
//
// cuBLAS is column-major. A row-major C [M, N] is the column-major Cᵀ [N, M], so C = A·B is computed
// as Cᵀ = Bᵀ·Aᵀ (cuBLAS m = N, n = M, first operand B). An output stored transposed (unit stride on
// its rows axis) is already column-major, and C = A·B is computed directly; an output cuBLAS cannot
// write is computed into a contiguous temporary and copied out. Of the coalesced batch dims the
// largest becomes cuBLAS's strided batch and the others (rare: e.g. permuted [B, T, H, d] views) are
// looped on the host.
//
// Precision: f32 uses CUBLAS_COMPUTE_32F (no TF32) unless cuda::allow_tf32() (then
// CUBLAS_COMPUTE_32F_FAST_TF32); f64 CUBLAS_COMPUTE_64F; bf16/f16 are read and written in half with
// CUBLAS_COMPUTE_32F accumulation, and reduced-precision (half) split-K reductions are disallowed so
// the result is the f32 sum rounded once, as on the Cpu backend. Integer dtypes throw, as on the Cpu.
#include <algorithm>
#include <memory>
#include <vector>

#include "kiln/backends/cuda/cuda.hpp"
#include "kiln/backends/cuda/runtime.hpp"
#include "kiln/backends/gemm_plan.hpp"
#include "kiln/core/error.hpp"

namespace kiln {

namespace {

// A matrix as cuBLAS takes it; trans: stored column-major (unit stride along rows).
using gemm::BatchDim;
using gemm::Operand;

// A contiguous copy of a view in dtype `to` on the device (gemm::staging).
struct Staged {
  std::shared_ptr<CudaStorage> storage;
  Layout layout;
};
Staged stage(Cuda::V v, DType to) {
  const gemm::Staging st = gemm::staging(v.layout);
  Staged r{Cuda::allocate(static_cast<size_t>(st.elements) * dtype_size(to)), st.layout};
  Cuda::copy(Cuda::M{*r.storage, st.dst, to}, Cuda::V{v.storage, st.src, v.dtype});
  return r;
}

cudaDataType cuda_type(DType d) {
  switch (d) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f64:
      return CUDA_R_64F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_16F;
  }
}

// The fixed parts of one product: pointers advance by batch offsets (in elements) per call.
struct Gemm {
  DType dt;
  bool c_colmajor;  // false: compute Cᵀ = Bᵀ Aᵀ (C row-major); true: C = A B (C column-major)
  int64_t M, N, K;
  Operand A, B;
  int64_t ldc;
  const char* pa;
  const char* pb;
  char* pc;
};

void run(const Gemm& g, int64_t oa, int64_t ob, int64_t oc, int64_t batch, int64_t sa, int64_t sb, int64_t sc) {
  const size_t es = dtype_size(g.dt);
  const void* a = g.pa + static_cast<size_t>(oa) * es;
  const void* b = g.pb + static_cast<size_t>(ob) * es;
  void* c = g.pc + static_cast<size_t>(oc) * es;
  const cudaDataType ty = cuda_type(g.dt);
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (g.dt == DType::f64)
    compute = CUBLAS_COMPUTE_64F;
  else if (g.dt == DType::f32 && cuda::allow_tf32())
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  const float alpha_f = 1.0f, beta_f = 0.0f;
  const double alpha_d = 1.0, beta_d = 0.0;
  const void* alpha = g.dt == DType::f64 ? static_cast<const void*>(&alpha_d) : static_cast<const void*>(&alpha_f);
  const void* beta = g.dt == DType::f64 ? static_cast<const void*>(&beta_d) : static_cast<const void*>(&beta_f);
  const cublasHandle_t h = cuda::cublas();
  KILN_CUBLAS_CHECK_OP(
      "matmul", cublasSetMathMode(h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  if (!g.c_colmajor) {
    // Cᵀ [N, M] (column-major, ld ldc) = op(B) [N, K] · op(A) [K, M]: a row-major operand is its own
    // transpose in column-major terms (no flag), a column-major one needs the flag.
    KILN_CUBLAS_CHECK_OP(
        "matmul",
        cublasGemmStridedBatchedEx_64(h, g.B.trans ? CUBLAS_OP_T : CUBLAS_OP_N, g.A.trans ? CUBLAS_OP_T : CUBLAS_OP_N, g.N, g.M, g.K, alpha,
                                      b, ty, g.B.ld, sb, a, ty, g.A.ld, sa, beta, c, ty, g.ldc, sc, batch, compute, CUBLAS_GEMM_DEFAULT));
  } else {
    // C [M, N] (column-major, ld ldc) = op(A) [M, K] · op(B) [K, N].
    KILN_CUBLAS_CHECK_OP(
        "matmul",
        cublasGemmStridedBatchedEx_64(h, g.A.trans ? CUBLAS_OP_N : CUBLAS_OP_T, g.B.trans ? CUBLAS_OP_N : CUBLAS_OP_T, g.M, g.N, g.K, alpha,
                                      a, ty, g.A.ld, sa, b, ty, g.B.ld, sb, beta, c, ty, g.ldc, sc, batch, compute, CUBLAS_GEMM_DEFAULT));
  }
}

void matmul_float(Cuda::M out, Cuda::V a, Cuda::V b) {
  const Shape& os = out.layout.shape;
  const size_t r = os.size();
  const int64_t M = os[r - 2], N = os[r - 1], K = a.layout.shape[r - 1];
  if (out.layout.numel() == 0) return;
  if (K == 0) return Cuda::fill(out, Scalar(0.0));

  Staged sa, sb, sc;
  const Layout* la = &a.layout;
  const Layout* lb = &b.layout;
  const Layout* lc = &out.layout;
  const CudaStorage* stA = &a.storage;
  const CudaStorage* stB = &b.storage;
  CudaStorage* stC = &out.storage;
  auto mat = [](const Layout& l, int64_t rows, int64_t cols) { return gemm::classify(l, rows, cols); };
  Operand A = mat(*la, M, K), B = mat(*lb, K, N), C = mat(*lc, M, N);
  if (!A.ok) {
    sa = stage(a, a.dtype);
    la = &sa.layout;
    stA = sa.storage.get();
    A = mat(*la, M, K);
  }
  if (!B.ok) {
    sb = stage(b, b.dtype);
    lb = &sb.layout;
    stB = sb.storage.get();
    B = mat(*lb, K, N);
  }
  const bool stage_c = !C.ok;
  if (stage_c) {
    sc = Staged{Cuda::allocate(static_cast<size_t>(out.layout.numel()) * dtype_size(out.dtype)), Layout(os)};
    lc = &sc.layout;
    stC = sc.storage.get();
    C = mat(*lc, M, N);
  }
  KILN_CHECK(A.ok && B.ok && C.ok, "matmul: internal error: no cuBLAS layout for {} @ {} -> {}", shape_str(a.layout.shape),
             shape_str(b.layout.shape), shape_str(os));

  Gemm g{out.dtype,
         C.trans,
         M,
         N,
         K,
         A,
         B,
         C.ld,
         static_cast<const char*>(stA->data()),
         static_cast<const char*>(stB->data()),
         static_cast<char*>(stC->data())};
  const std::vector<BatchDim> dims = gemm::coalesce(*la, *lb, *lc);  // innermost first

  if (dims.empty()) {
    run(g, la->offset, lb->offset, lc->offset, 1, 0, 0, 0);
  } else if (gemm::folds(dims, M, A, C)) {
    g.M = M * dims[0].size;  // fold the batch into M: rows of A and C are evenly spaced across it
    run(g, la->offset, lb->offset, lc->offset, 1, 0, 0, 0);
  } else {
    // the largest dim is cuBLAS's batch; the others are looped here
    size_t big = 0;
    for (size_t i = 1; i < dims.size(); ++i)
      if (dims[i].size > dims[big].size) big = i;
    std::vector<BatchDim> loop;
    for (size_t i = 0; i < dims.size(); ++i)
      if (i != big) loop.push_back(dims[i]);
    const BatchDim& bd = dims[big];
    gemm::for_each_item(loop, la->offset, lb->offset, lc->offset,
                        [&](int64_t oa, int64_t ob, int64_t oc) { run(g, oa, ob, oc, bd.size, bd.sa, bd.sb, bd.sc); });
  }
  if (stage_c) Cuda::copy(out, Cuda::V{*sc.storage, sc.layout, out.dtype});
}

}  // namespace

void Cuda::matmul(M out, V a, V b) {
  const size_t r = out.layout.shape.size();
  KILN_CHECK(r >= 2 && a.layout.shape.size() == r && b.layout.shape.size() == r, "matmul: ranks differ or < 2: {} @ {} -> {}",
             shape_str(a.layout.shape), shape_str(b.layout.shape), shape_str(out.layout.shape));
  KILN_CHECK(a.dtype == b.dtype && a.dtype == out.dtype, "matmul: dtypes differ: {} @ {} -> {}", a.dtype, b.dtype, out.dtype);
  const int64_t K = a.layout.shape[r - 1];
  KILN_CHECK(
      b.layout.shape[r - 2] == K && a.layout.shape[r - 2] == out.layout.shape[r - 2] && b.layout.shape[r - 1] == out.layout.shape[r - 1],
      "matmul: {} @ {} -> {}: shapes do not match", shape_str(a.layout.shape), shape_str(b.layout.shape), shape_str(out.layout.shape));
  for (size_t i = 0; i + 2 < r; ++i)
    KILN_CHECK(a.layout.shape[i] == out.layout.shape[i] && b.layout.shape[i] == out.layout.shape[i],
               "matmul: {} @ {} -> {}: batch dims differ", shape_str(a.layout.shape), shape_str(b.layout.shape),
               shape_str(out.layout.shape));
  switch (a.dtype) {
    case DType::f32:
    case DType::f64:
    case DType::bf16:
    case DType::f16:
      break;
    default:
      fail("matmul: not supported for dtype {} ({} @ {})", a.dtype, shape_str(a.layout.shape), shape_str(b.layout.shape));
  }
  cuda::check_device(out.storage, "matmul");
  cuda::check_device(a.storage, "matmul");
  cuda::check_device(b.storage, "matmul");
  matmul_float(out, a, b);
}

}  // namespace kiln
