// Mixed precision on the Cpu, matmul level: kiln's bf16 matmul (oneDNN bf16 kernels where the CPU has
// AVX512-BF16 or AMX) against kiln's f32 matmul (oneDNN/OpenBLAS sgemm), interleaved in the same loop,
// on the products of one training step of the d_model 256 benchmark model (4 layers, B 8, T 128:
// 1024 token rows; SwiGLU hidden 704; vocabulary 256): for every Linear the forward x·Wᵀ and the two
// backward products dy·W and dyᵀ·x. Prints per shape and in total: ms (the fastest of the repetitions),
// GFLOP/s, and the bf16/f32 speedup.
//
//   KILN_NUM_THREADS=2 build/bench_amp [reps]
// (bench/amp/run.sh also times whole training steps, f32 vs "precision": "bf16".)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <kiln/backends/backends.hpp>
#include <kiln/backends/cpu/cpu.hpp>

using namespace kiln;
using T = Tensor<Cpu>;

namespace {
double now_ms() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
struct Shape3 {
  const char* name;
  int64_t M, K, N;  // [M, K] @ [K, N]
  bool bt;          // right operand stored transposed ([N, K], a weight used as Wᵀ)
  bool at;          // left operand stored transposed ([K, M], dyᵀ·x)
};
}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const int64_t R = 8 * 128, D = 256, H = 704, V = 256;
  // (name, M, K, N) of the product; each Linear [in -> out] gives fwd (R, in, out), dx (R, out, in), dW (out, R, in).
  std::vector<Shape3> shapes;
  auto linear = [&](const char* name, int64_t in, int64_t out) {
    shapes.push_back({name, R, in, out, true, false});   // x @ Wᵀ
    shapes.push_back({name, R, out, in, false, false});  // dy @ W
    shapes.push_back({name, out, R, in, false, true});   // dyᵀ @ x
  };
  linear("q/k/v/o 256->256 (x4 per layer)", D, D);
  linear("gate/up 256->704 (x2 per layer)", D, H);
  linear("down 704->256", H, D);
  linear("head 256->256", D, V);
  const std::vector<int> per_step = {16, 8, 4, 1};  // how often each Linear runs per step (4 layers)

  // The CPU and whether it has the bf16 instructions oneDNN's kernels need (kiln's own kernels' ISA,
  // cpu_isa(), does not decide the matmul path).
  std::string model = "?", bf16_isa = "no AVX512-BF16/AMX: bf16 computes in f32";
  {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("model name", 0) == 0 && model == "?") model = line.substr(line.find(':') + 2);
      if (line.rfind("flags", 0) == 0) {
        if (line.find(" amx_bf16") != std::string::npos)
          bf16_isa = "AMX-BF16";
        else if (line.find(" avx512_bf16") != std::string::npos)
          bf16_isa = "AVX-512 BF16";
      }
    }
  }
  std::printf("kiln matmul, bf16 (autocast) vs f32: %s, %s, kiln kernels %s, %s threads\n", model.c_str(), bf16_isa.c_str(),
              std::string(cpu_isa()).c_str(), std::getenv("KILN_NUM_THREADS") ? std::getenv("KILN_NUM_THREADS") : "default");
  std::printf("%-34s %-22s %9s %9s %10s %10s %7s\n", "linear", "product", "f32 ms", "bf16 ms", "f32 GF/s", "bf16 GF/s", "speedup");
  Generator g(1);
  double tot32 = 0, tot16 = 0, flops_step = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape3& s = shapes[i];
    const T a32 = s.at ? T::randn({s.K, s.M}, DType::f32, &g).t() : T::randn({s.M, s.K}, DType::f32, &g);
    const T b32 = s.bt ? T::randn({s.N, s.K}, DType::f32, &g).t() : T::randn({s.K, s.N}, DType::f32, &g);
    const T a16 = s.at ? a32.t().to(DType::bf16).t() : a32.to(DType::bf16), b16 = s.bt ? b32.t().to(DType::bf16).t() : b32.to(DType::bf16);
    std::vector<double> t32, t16;
    for (int r = 0; r < reps + 3; ++r) {  // interleaved; the first 3 warm up (primitive creation)
      double t0 = now_ms();
      T c = a32.matmul(b32);
      const double d32 = now_ms() - t0;
      t0 = now_ms();
      T c16 = a16.matmul(b16);
      const double d16 = now_ms() - t0;
      if (r >= 3) {
        t32.push_back(d32);
        t16.push_back(d16);
      }
    }
    // The fastest repetition of each: on a shared machine the others measure the neighbours.
    const double m32 = *std::min_element(t32.begin(), t32.end()), m16 = *std::min_element(t16.begin(), t16.end());
    const double fl = 2.0 * static_cast<double>(s.M) * static_cast<double>(s.K) * static_cast<double>(s.N);
    const int n = per_step[i / 3];
    tot32 += n * m32;
    tot16 += n * m16;
    flops_step += n * fl;
    const std::string prod = fmt::format("[{},{}]@[{},{}]{}", s.M, s.K, s.K, s.N, s.bt ? " (Bᵀ)" : s.at ? " (Aᵀ)" : "");
    std::printf("%-34s %-22s %9.3f %9.3f %10.1f %10.1f %6.2fx\n", s.name, prod.c_str(), m32, m16, fl / m32 / 1e6, fl / m16 / 1e6,
                m32 / m16);
  }
  std::printf("one step's matmuls outside attention: f32 %.1f ms (%.1f GFLOP/s), bf16 %.1f ms (%.1f GFLOP/s): %.2fx\n", tot32,
              flops_step / tot32 / 1e6, tot16, flops_step / tot16 / 1e6, tot32 / tot16);
  return 0;
}
