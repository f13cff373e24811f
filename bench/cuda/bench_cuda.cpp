// GPU benchmarks of the Cuda backend against its peers on the same device, one JSON line per case:
//  * GEMM: kiln's matmul (Tensor<Cuda>::matmul: layout analysis, allocation from the caching allocator,
//    cuBLAS) against a raw cublasGemmEx call on preallocated buffers (target >= 95%).
//  * Flash attention forward + backward (fused::attention_forward/backward), B=4 H=12 T=1024 d=64 causal,
//    f32 on both kernel sets and bf16 inputs,
//    for the PyTorch side see gpu_vs_torch.py (scaled_dot_product_attention on the same device).
//  * Elementwise add (16-byte vectorised kernels) against a device-to-device cudaMemcpyAsync, as
//    bandwidth (add moves three arrays, the copy two).
//  * index_add, the embedding gradient (deterministic: radix sort + ordered run sums, index.cu), on
//    GPT-2's vocabulary with Zipf-like token ids; gpu_vs_torch.py times PyTorch's index_add_ (atomics)
//    and embedding backward on the same ids.
// Run by bench/cuda/run.sh (or scripts/gpu_run.sh bench); timings are medians of repetitions after
// warm-up, each timed by CUDA events on kiln's stream, where both kiln and the raw cuBLAS handle run
// (GPU time, host overhead included only where it leaves the GPU idle).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <kiln/backends/cuda/cuda.hpp>
#include <kiln/backends/cuda/runtime.hpp>
#include <kiln/core/fused.hpp>

using namespace kiln;
using T = Tensor<Cuda>;

namespace {

int g_reps = 20;

double median_ms(const std::function<void()>& f) {
  const int reps = g_reps;
  for (int i = 0; i < 3; ++i) f();
  cuda::synchronize();
  std::vector<double> t;
  cudaEvent_t a, b;
  KILN_CUDA_CHECK(cudaEventCreate(&a));
  KILN_CUDA_CHECK(cudaEventCreate(&b));
  const cudaStream_t s = cuda::stream();
  for (int i = 0; i < reps; ++i) {
    KILN_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    KILN_CUDA_CHECK(cudaEventRecord(b, s));
    KILN_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  KILN_CUDA_CHECK(cudaEventDestroy(a));
  KILN_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void gemm(int64_t M, int64_t N, int64_t K, DType d, bool tf32) {
  cuda::set_allow_tf32(tf32);
  Generator g(1);
  const T a = T::randn({M, K}, DType::f32, &g).to(d), b = T::randn({K, N}, DType::f32, &g).to(d);
  T c = T::empty({M, N}, d);
  const double kiln_ms = median_ms([&] { c = a.matmul(b); });
  cublasHandle_t h;
  KILN_CUBLAS_CHECK_OP("bench", cublasCreate(&h));
  KILN_CUBLAS_CHECK_OP("bench", cublasSetStream(h, cuda::stream()));
  const cudaDataType_t ty = d == DType::f32 ? CUDA_R_32F : d == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const cublasComputeType_t ct = d == DType::f32 && !tf32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
  const float one = 1, zero = 0;
  T out = T::empty({M, N}, d);
  const double raw_ms = median_ms([&] {  // row-major C = A B as column-major C^T = B^T A^T
    KILN_CUBLAS_CHECK_OP(
        "raw cublasGemmEx",
        cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &one, b.storage()->data(),
                     ty, static_cast<int>(N), a.storage()->data(), ty, static_cast<int>(K), &zero, out.storage()->data(), ty,
                     static_cast<int>(N), d == DType::f32 ? ct : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  cublasDestroy(h);
  const double tflops = 2.0 * M * N * K / 1e9;
  std::printf(
      "{\"bench\": \"gemm\", \"M\": %ld, \"N\": %ld, \"K\": %ld, \"dtype\": \"%s\", \"tf32\": %s, \"kiln_tflops\": %.1f, "
      "\"cublas_tflops\": %.1f, \"ratio\": %.3f}\n",
      M, N, K, std::string(dtype_name(d)).c_str(), tf32 ? "true" : "false", tflops / kiln_ms, tflops / raw_ms, raw_ms / kiln_ms);
  cuda::set_allow_tf32(false);
}

void attention(int64_t Bt, int64_t H, int64_t Hkv, int64_t Tn, int64_t d, int64_t dv) {
  Generator g(2);
  const T q = T::randn({Bt, H, Tn, d}, DType::f32, &g), k = T::randn({Bt, Hkv, Tn, d}, DType::f32, &g),
          v = T::randn({Bt, Hkv, Tn, dv}, DType::f32, &g), dout = T::randn({Bt, H, Tn, dv}, DType::f32, &g);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // f32 on the default kernels (tensor cores where the head dims fit), then on the FMA kernels; bf16
  // inputs (the same values rounded) on the default kernels, conversions included
  auto time = [&](bool tc, DType dt) {
    cuda::set_attention_tensor_cores(tc);
    const T qt = q.to(dt), kt = k.to(dt), vt = v.to(dt), gt = dout.to(dt);
    std::pair<T, T> fwd;
    const double f_ms = median_ms([&] { fwd = fused::attention_forward(qt, kt, vt, scale, true, 0); });
    const double b_ms = median_ms([&] { (void)fused::attention_backward(qt, kt, vt, fwd.first, fwd.second, gt, scale, true, 0); });
    return std::pair{f_ms, b_ms};
  };
  const auto [f_ms, b_ms] = time(true, DType::f32);
  const auto [f_fma, b_fma] = time(false, DType::f32);
  const auto [f_bf16, b_bf16] = time(true, DType::bf16);
  cuda::set_attention_tensor_cores(true);
  std::printf(
      "{\"bench\": \"attention\", \"B\": %ld, \"H\": %ld, \"Hkv\": %ld, \"T\": %ld, \"d\": %ld, \"dv\": %ld, \"fwd_ms\": %.3f, "
      "\"bwd_ms\": %.3f, \"fma_fwd_ms\": %.3f, \"fma_bwd_ms\": %.3f, \"bf16_fwd_ms\": %.3f, \"bf16_bwd_ms\": %.3f}\n",
      Bt, H, Hkv, Tn, d, dv, f_ms, b_ms, f_fma, b_fma, f_bf16, b_bf16);
}

void elementwise(int64_t n) {
  Generator g(3);
  const T a = T::randn({n}, DType::f32, &g), b = T::randn({n}, DType::f32, &g);
  T c;
  const double add_ms = median_ms([&] { c = a.add(b); });
  T dst = T::empty({n}, DType::f32);
  const double copy_ms = median_ms([&] {
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(dst.storage()->data(), a.storage()->data(), static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, cuda::stream()));
  });
  const double add_gbps = 3.0 * 4.0 * static_cast<double>(n) / add_ms / 1e6, copy_gbps = 2.0 * 4.0 * static_cast<double>(n) / copy_ms / 1e6;
  std::printf("{\"bench\": \"add\", \"n\": %ld, \"kiln_gbps\": %.1f, \"memcpy_gbps\": %.1f, \"ratio\": %.3f}\n", n, add_gbps, copy_gbps,
              add_gbps / copy_gbps);
}

// Token ids shared with gpu_vs_torch.py: Zipf-like (id = floor(V^u) - 1, u a low-discrepancy sequence).
std::vector<int64_t> zipf_ids(int64_t vocab, int64_t n) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double u = std::fmod(static_cast<double>(i) * 0.6180339887498949, 1.0);
    ids[static_cast<size_t>(i)] =
        std::min<int64_t>(vocab - 1, static_cast<int64_t>(std::floor(std::pow(static_cast<double>(vocab), u))) - 1);
  }
  return ids;
}

void index_add(int64_t vocab, int64_t n, int64_t dim) {
  Generator g(4);
  const T ids = T::from_vector(zipf_ids(vocab, n));
  const T src = T::randn({n, dim}, DType::f32, &g), base = T::zeros({vocab, dim});
  T out;
  const double ms = median_ms([&] { out = base.index_add(0, ids, src); });
  std::printf("{\"bench\": \"index_add\", \"vocab\": %ld, \"n\": %ld, \"dim\": %ld, \"kiln_ms\": %.3f}\n", vocab, n, dim, ms);
}

}  // namespace

int main(int argc, char** argv) {
  // --smoke: tiny sizes, a few repetitions (checks that the program runs: the emulated device's CTest)
  // attention: the attention cases alone
  const bool smoke = argc > 1 && std::string(argv[1]) == "--smoke";
  const bool only_attention = argc > 1 && std::string(argv[1]) == "attention";
  if (!cuda::available()) {
    std::printf("no CUDA device (%s)\n", cuda::unavailable_reason().c_str());
    return 77;
  }
  std::printf("{\"device\": \"%s\"}\n", cuda::device_name().c_str());
  if (smoke) {
    g_reps = 2;
    for (auto [d, tf32] : std::vector<std::pair<DType, bool>>{{DType::f32, false}, {DType::f32, true}, {DType::bf16, false}})
      gemm(24, 40, 16, d, tf32);
    attention(1, 2, 2, 24, 16, 16);
    attention(1, 2, 1, 24, 16, 32);
    elementwise(1000);
    index_add(50, 300, 8);
    return 0;
  }
  if (!only_attention)
    for (auto [M, N, K] : std::vector<std::array<int64_t, 3>>{
             {1024, 1024, 1024}, {4096, 4096, 4096}, {8192, 768, 768}, {8192, 3072, 768}, {8192, 768, 3072}, {8192, 50304, 768}})
      for (auto [d, tf32] : std::vector<std::pair<DType, bool>>{{DType::f32, false}, {DType::f32, true}, {DType::bf16, false}})
        gemm(M, N, K, d, tf32);
  attention(4, 12, 12, 1024, 64, 64);    // GPT-2 small, MHA
  attention(4, 6, 6, 1024, 64, 128);     // Diff: half the heads, value width 2d
  attention(4, 12, 4, 1024, 64, 64);     // GQA 3:1
  attention(2, 16, 16, 2048, 128, 128);  // head dim 128 (Llama-style)
  if (only_attention) return 0;
  for (const int64_t n : {int64_t{1} << 20, int64_t{1} << 26}) elementwise(n);
  index_add(50304, 8 * 1024, 768);  // GPT-2 small: the token embedding's gradient for B=8, T=1024
  return 0;
}
