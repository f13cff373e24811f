// The emulated device's own checks (emu_cudart.cpp, emu_cublas.cpp, emu.cpp): the rules that make the
// emu-device runs of the suite meaningful fail where they should. Linked against kiln_emu_device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <kiln/backends/backends.hpp>
#include <kiln/backends/cuda/cuda.hpp>
#include <kiln/core/tensor.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/optimizer.hpp>
#include "emu_device.hpp"
#include "emu_selftest.hpp"

namespace {

struct DeviceBuf {
  void* p = nullptr;
  explicit DeviceBuf(size_t n) { REQUIRE(cudaMalloc(&p, n) == cudaSuccess); }
  ~DeviceBuf() { (void)cudaFree(p); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  float* f() const { return static_cast<float*>(p); }
};

}  // namespace

TEST_CASE("emulated runtime: allocations are tracked, aligned, filled with garbage and range-checked", "[cuda-emu]") {
  const size_t live = emu::device::live_allocations();
  {
    DeviceBuf a(1000);
    CHECK(reinterpret_cast<uintptr_t>(a.p) % 256 == 0);
    CHECK(emu::device::live_allocations() == live + 1);
    CHECK(emu::device::contains(a.p, 1000));
    CHECK(!emu::device::contains(a.p, 1001));
    CHECK(static_cast<unsigned char*>(a.p)[999] == 0xff);
    std::vector<char> host(1000, 1);
    CHECK(cudaMemcpyAsync(a.p, host.data(), 1000, cudaMemcpyHostToDevice, nullptr) == cudaSuccess);
    // a copy or fill that runs past the allocation fails (on a GPU: an illegal address, or corruption)
    CHECK(cudaMemcpyAsync(a.p, host.data(), 1001, cudaMemcpyHostToDevice, nullptr) == cudaErrorInvalidValue);
    CHECK(cudaMemcpyAsync(host.data(), static_cast<char*>(a.p) + 1, 1000, cudaMemcpyDeviceToHost, nullptr) == cudaErrorInvalidValue);
    CHECK(cudaMemsetAsync(static_cast<char*>(a.p) + 500, 0, 501, nullptr) == cudaErrorInvalidValue);
    CHECK(cudaMemcpyAsync(static_cast<char*>(a.p) + 10, a.p, 20, cudaMemcpyDeviceToDevice, nullptr) == cudaErrorInvalidValue);  // overlap
    (void)cudaGetLastError();
    CHECK(cudaFree(static_cast<char*>(a.p) + 8) == cudaErrorInvalidValue);  // not the start of an allocation
    (void)cudaGetLastError();
  }
  CHECK(emu::device::live_allocations() == live);
  void* huge = nullptr;
  CHECK(cudaMalloc(&huge, size_t{8} << 30) == cudaErrorMemoryAllocation);  // beyond the emulated 4 GiB
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("emulated cuBLAS: the documented argument rules, and operands inside their allocations", "[cuda-emu]") {
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  DeviceBuf a(4 * 6 * 4), b(6 * 5 * 4), c(4 * 5 * 4);
  const float one = 1, zero = 0;
  auto gemm = [&](int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, cublasOperation_t ta, int64_t batch = 1,
                  long long sa = 0, long long sc = 0) {
    return cublasGemmStridedBatchedEx_64(h, ta, CUBLAS_OP_N, m, n, k, &one, a.p, CUDA_R_32F, lda, sa, b.p, CUDA_R_32F, ldb, 0, &zero, c.p,
                                         CUDA_R_32F, ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  // C [4, 5] = A [4, 6] B [6, 5], column-major: A = 1..24, B = 1 everywhere: C(i, j) = sum_l A(i, l)
  std::vector<float> ha(24), hb(30, 1.0f), hc(20);
  for (int i = 0; i < 24; ++i) ha[static_cast<size_t>(i)] = static_cast<float>(i + 1);
  REQUIRE(cudaMemcpyAsync(a.p, ha.data(), 96, cudaMemcpyHostToDevice, nullptr) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(b.p, hb.data(), 120, cudaMemcpyHostToDevice, nullptr) == cudaSuccess);
  REQUIRE(gemm(4, 5, 6, 4, 6, 4, CUBLAS_OP_N) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cudaMemcpyAsync(hc.data(), c.p, 80, cudaMemcpyDeviceToHost, nullptr) == cudaSuccess);
  for (int i = 0; i < 4; ++i) CHECK(hc[static_cast<size_t>(i)] == static_cast<float>(6 * (i + 1) + 4 * 15));
  CHECK(gemm(4, 5, 6, 3, 6, 4, CUBLAS_OP_N) == CUBLAS_STATUS_INVALID_VALUE);                // lda < m
  CHECK(gemm(4, 5, 6, 4, 5, 4, CUBLAS_OP_N) == CUBLAS_STATUS_INVALID_VALUE);                // ldb < k
  CHECK(gemm(4, 5, 6, 4, 6, 3, CUBLAS_OP_N) == CUBLAS_STATUS_INVALID_VALUE);                // ldc < m
  CHECK(gemm(4, 5, 6, 4, 6, 4, CUBLAS_OP_T) == CUBLAS_STATUS_INVALID_VALUE);                // op T: lda >= k = 6
  CHECK(gemm(4, 5, 6, 4, 6, 4, CUBLAS_OP_N, 2, 24, 20) == CUBLAS_STATUS_EXECUTION_FAILED);  // batch 2 reads past A
  CHECK(gemm(4, 5, 6, 4, 6, 4, CUBLAS_OP_N, 2, 0, 0) == CUBLAS_STATUS_EXECUTION_FAILED);    // both batch items write C
  CHECK(cublasGemmStridedBatchedEx_64(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 5, 6, &one, a.p, CUDA_R_32F, 4, 0, b.p, CUDA_R_16F, 6, 0, &zero, c.p,
                                      CUDA_R_32F, 4, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
}

TEST_CASE("emulated device: kiln's Cuda backend runs on it", "[cuda-emu]") {
  REQUIRE(kiln::cuda::available());
  CHECK(kiln::cuda::device_name() == "kiln host emulator");
  const auto x = kiln::Tensor<kiln::Cuda>::ones({3, 4}).mul(2.0).sum();
  CHECK(kiln::item<float>(x.to<kiln::Cpu>()) == 24.0f);
}

TEST_CASE("emulator: kernels that would fail or race on a GPU are refused", "[cuda-emu]") {
  CHECK_THAT(emu_selftest::barrier_in_divergent_code(), Catch::Contains("deadlock") && Catch::Contains("barrier_in_divergent_code"));
  CHECK_THAT(emu_selftest::shuffle_after_early_exit(), Catch::Contains("exited"));
  CHECK(emu_selftest::missing_barrier_changes_with_order());
  CHECK_THAT(emu_selftest::smem_without_optin(), Catch::Contains("opted in"));
  CHECK(emu_selftest::smem_with_optin().empty());
  CHECK(emu_selftest::optin_above_limit_refused());
  CHECK_THAT(emu_selftest::too_many_threads(), Catch::Contains("invalid launch configuration"));
}

TEST_CASE("emulator: mma.sync m16n8k16 (bf16, f16) computes A B with PTX's fragment layout", "[cuda-emu]") {
  std::vector<float> a(16 * 16), b(16 * 8), want(16 * 8, 0.0f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>((i * 37 + 11) % 17) - 8) * 0.5f;  // distinct, exact
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>((i * 53 + 5) % 13) - 6);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 8; ++c)
      for (int k = 0; k < 16; ++k)
        want[static_cast<size_t>(r * 8 + c)] += a[static_cast<size_t>(r * 16 + k)] * b[static_cast<size_t>(k * 8 + c)];
  for (bool bf16 : {true, false}) {
    INFO((bf16 ? "bf16" : "f16"));
    CHECK(emu_selftest::mma_m16n8k16(bf16, a, b) == want);  // small integers and halves: every sum exact
  }
}

// PTX's ldmatrix: lane 8i + r addresses row r of matrix i; register i of lane 4r + w holds that matrix's
// row r, values 2w (low half) and 2w + 1, or with .trans its column r, rows 2w and 2w + 1. Rows here at
// scattered 16-byte-aligned places of a padded tile, as a kernel's fragments take them.
TEST_CASE("emulator: ldmatrix.x4 (and .trans) hands each lane PTX's fragment of four 8 x 8 matrices", "[cuda-emu]") {
  std::vector<uint16_t> tile(16 * 24);
  for (size_t e = 0; e < tile.size(); ++e) tile[e] = static_cast<uint16_t>(1000 + e);  // distinct
  std::vector<int> rows(32);
  for (int lane = 0; lane < 32; ++lane) rows[static_cast<size_t>(lane)] = ((lane * 7) % 16) * 24 + 8 * ((lane / 8) % 3);
  for (bool trans : {false, true}) {
    INFO((trans ? ".trans" : "plain"));
    const std::vector<uint32_t> got = emu_selftest::ldmatrix_x4(trans, tile, rows);
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        const int r = lane / 4, w = lane % 4;
        auto value = [&](int row, int col) {
          return static_cast<uint32_t>(tile[static_cast<size_t>(rows[static_cast<size_t>(8 * i + row)] + col)]);
        };
        const uint32_t want = trans ? value(2 * w, r) | value(2 * w + 1, r) << 16 : value(r, 2 * w) | value(r, 2 * w + 1) << 16;
        INFO("lane " << lane << " register " << i);
        CHECK(got[static_cast<size_t>(4 * lane + i)] == want);
      }
  }
  CHECK_THAT(emu_selftest::ldmatrix_unaligned(), Catch::Contains("16-byte aligned"));
}

// cp.async: a copy lands when issued in blocks of even index, only at the wait that covers it in the
// others, so a kernel that reads before the wait and a barrier, or that reads the destination's old
// contents while a copy into it may be in flight, gets wrong bytes in some blocks.
TEST_CASE("emulator: cp.async copies land at the issue or at the wait, so a missing wait or barrier shows", "[cuda-emu]") {
  const int blocks = 4;
  auto neighbour = [](int b, int t, int i) { return (b * 64 + (t + 1) % 64) * 4 + i; };
  const std::vector<int> ok = emu_selftest::cp_async(0, blocks), no_wait = emu_selftest::cp_async(1, blocks),
                         old = emu_selftest::cp_async(2, blocks);
  for (int b = 0; b < blocks; ++b) {
    INFO("block " << b);
    int ok_right = 0, no_wait_right = 0, old_kept = 0;
    for (int t = 0; t < 64; ++t)
      for (int i = 0; i < 4; ++i) {
        const size_t at = static_cast<size_t>((b * 64 + t) * 4 + i);
        ok_right += ok[at] == neighbour(b, t, i);
        no_wait_right += no_wait[at] == neighbour(b, t, i);
        old_kept += old[at] == -2;
      }
    CHECK(ok_right == 256);
    if (b % 2 == 0) {  // copies land at the issue
      CHECK(no_wait_right == 256);
      CHECK(old_kept < 256);  // some thread read its slot after the neighbour's copy into it
    } else {                  // at the wait: without one, the neighbour's slot still holds the block's garbage
      CHECK(no_wait_right == 0);
      CHECK(old_kept == 256);
    }
  }
  CHECK_THAT(emu_selftest::cp_async_unaligned(), Catch::Contains("16-byte aligned"));
}

TEST_CASE("emulator: a schedule seed shuffles the blocks (and threads), so order-dependent results show", "[cuda-emu]") {
  std::vector<int> grid(40);
  for (int b = 0; b < 40; ++b) grid[static_cast<size_t>(b)] = b;
  CHECK(emu_selftest::block_order(0, 40) == grid);  // the default: grid order
  std::vector<int> a = emu_selftest::block_order(1, 40), b = emu_selftest::block_order(2, 40);
  CHECK(a != grid);
  CHECK(a != b);
  std::sort(a.begin(), a.end());
  CHECK(a == grid);  // every block ran once
  // atomics in a different order round differently: what kiln's scatter_add avoids (backends/cuda/index.cu)
  std::set<float> sums;
  for (uint64_t s = 0; s < 6; ++s) sums.insert(emu_selftest::atomic_sum(s));
  CHECK(sums.size() > 1);
}

// Each host wait drains the GPU's queue; a training step that waits once per parameter (or per layer)
// leaves the GPU idle for a launch latency each time. (Before: 27 waits with 1 layer, 66 with 4 for
// mha; 37 and 100 for diff + attnres: a read per parameter in the gradient norm, RoPE tables uploaded
// by every attention call, two reads per index check.) The step below is kiln train's (trainer.cpp):
// forward, cross-entropy, backward, gradient clipping, AdamW, and the loss read for the log.
TEST_CASE("emulated device: a GPT training step waits for the GPU a fixed, small number of times, whatever the depth", "[cuda-emu]") {
  using namespace kiln;
  auto waits_per_step = [](int64_t layers, const std::string& attention, const std::string& residual) {
    ModelConfig c;
    c.vocab_size = 50;
    c.d_model = 32;
    c.n_layers = layers;
    c.n_heads = 2;
    c.max_seq_len = 16;
    c.attention = attention;
    c.residual = residual;
    c.attnres_block_size = 2;
    nn::GPT<Cuda> model(c.resolved());
    optim::AdamW<Cuda> opt(model.named_parameters(), optim::AdamWOptions{.lr = 1e-3, .weight_decay = 0.1});
    const std::vector<Var<Cuda>> params = model.parameters();
    Generator g(5);
    const Tensor<Cpu> toks = Tensor<Cpu>::rand({2, 17}, DType::f32, &g).mul(50.0).to(DType::i64);  // [0, 50), truncated
    const Tensor<Cuda> x = toks.narrow(1, 0, 16).to<Cuda>(), y = toks.narrow(1, 1, 16).to<Cuda>();
    auto step = [&] {
      opt.zero_grad();
      const Var<Cuda> loss = nn::cross_entropy(model.forward(x).reshape({-1, 50}), y.reshape({-1}));
      loss.backward();
      (void)optim::clip_grad_norm(params, 1.0);
      opt.step();
      return item<double>(loss.value());
    };
    (void)step();
    const uint64_t w0 = emu::device::host_waits();
    const double l = step();
    CHECK(std::isfinite(l));
    return emu::device::host_waits() - w0;
  };
  for (const auto& [attention, residual] :
       std::vector<std::pair<std::string, std::string>>{{"mha", "standard"}, {"diff", "attnres_block"}}) {
    const uint64_t shallow = waits_per_step(1, attention, residual), deep = waits_per_step(4, attention, residual);
    INFO(attention << " + " << residual << ": " << shallow << " waits with 1 layer, " << deep << " with 4");
    CHECK(shallow == deep);
    // the embedding's index check and the gather kernel's flag, the same two for its gradient
    // (index_add), the cross-entropy targets' check, the gradient norm, the loss: 7
    CHECK(deep <= 7);
  }
}
