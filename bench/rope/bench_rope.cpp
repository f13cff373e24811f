// The fused RoPE on the Cpu backend (backends/cpu/rope.cpp) against a copy of the same bytes, in the
// same run, interleaved: the attention's [B, H, T, hd] view of a [B, T, H, hd] projection output (the
// d256 model's q: [8, 4, 128, 64] f32, 1 MiB), turned forward, backward (a new tensor) and backward in
// place (rope_backward_, as autograd runs it on a gradient it owns), and std::memcpy of 1 MiB, each
//   hot:  10 calls in a row, the operands in cache from the call before (the output's block comes
//         back from the host allocator's cache), per call;
//   cold: after streaming 64 MiB of other memory and reading the input again (warm, as after the GEMM
//         or attention backward that made it; a new output's block cold, as in a training step, where
//         it was last used a step ago; in place, input and output are the same warm lines).
// Reports the median and the minimum of the rounds in microseconds per call.
//   bench_rope [--rounds 40] [--d 64]      (KILN_NUM_THREADS, KILN_CPU_ISA apply)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <kiln/backends/cpu/cpu.hpp>
#include <kiln/core/fused_rope.hpp>
#include <kiln/core/rng.hpp>

using kiln::Cpu;
using T = kiln::Tensor<Cpu>;

namespace {

constexpr int kHotCalls = 10;  // hot: the mean of this many calls in a row

double now_us() { return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Stat {
  std::vector<double> us;
  double median() {
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }
  double min() { return *std::min_element(us.begin(), us.end()); }
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 40;
  int64_t hd = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc)
      rounds = std::atoi(argv[++i]);
    else if (a == "--d" && i + 1 < argc)
      hd = std::atoll(argv[++i]);
    else {
      std::fprintf(stderr, "bench_rope: bad flag %s (valid: --rounds N, --d N)\n", a.c_str());
      return 2;
    }
  }
  if (rounds < 1 || hd < 2 || hd % 2) {
    std::fprintf(stderr, "bench_rope: --rounds must be >= 1 and --d even\n");
    return 2;
  }
  const int64_t B = 8, Tn = 128, H = 256 / hd > 0 ? 256 / hd : 1, D = H * hd;
  kiln::Generator gen(7);
  const T proj = T::randn({B, Tn, D}, kiln::DType::f32, &gen);
  const T x = proj.view({B, Tn, H, hd}).transpose(1, 2);
  const T ang = T::uniform({Tn, hd / 2}, -4.0, 4.0, kiln::DType::f32, &gen);
  const T c = ang.cos(), s = ang.sin();
  T g = x.empty_like_layout(x.shape(), x.dtype());  // rewritten by the in-place runs
  g.copy_(x);
  const size_t bytes = static_cast<size_t>(B * Tn * D) * sizeof(float);
  std::vector<char> junk(64u << 20, 1), dst(bytes);
  const char* px = static_cast<const char*>(static_cast<const void*>(proj.storage()->as<float>()));
  volatile char sink = 0;
  const char* pg = static_cast<const char*>(static_cast<const void*>(g.storage()->as<float>()));
  const auto chill = [&](const char* input) {  // out of cache: 64 MiB of other memory, then the input read again
    for (size_t i = 0; i < junk.size(); i += 64) junk[i] = static_cast<char>(junk[i] + 1);
    char acc = 0;
    for (size_t i = 0; i < bytes; i += 64) acc = static_cast<char>(acc + input[i]);
    sink = static_cast<char>(sink + acc);
  };
  const auto fwd = [&] { sink = static_cast<char>(sink + (kiln::fused::rope_forward(x, c, s).numel() > 0)); };
  const auto bwd = [&] { sink = static_cast<char>(sink + (kiln::fused::rope_backward(x, c, s).numel() > 0)); };
  const auto inplace = [&] { kiln::fused::rope_backward_(g, c, s); };
  const auto copy = [&] { std::memcpy(dst.data(), px, bytes); };
  const char* names[] = {"rope forward", "rope backward", "rope backward in place", "memcpy (the peer)"};
  Stat hot[4], cold[4];
  for (int r = 0; r < rounds; ++r)
    for (int k = 0; k < 4; ++k) {
      const auto run = [&] {
        if (k == 0) fwd();
        if (k == 1) bwd();
        if (k == 2) inplace();
        if (k == 3) copy();
      };
      run();  // warm
      double t0 = now_us();
      for (int i = 0; i < kHotCalls; ++i) run();
      hot[k].us.push_back((now_us() - t0) / kHotCalls);
      chill(k == 2 ? pg : px);
      t0 = now_us();
      run();
      cold[k].us.push_back(now_us() - t0);
    }
  std::printf("bench_rope: [%lld, %lld, %lld, %lld] f32 view of [B, T, H, hd], %.2f MiB, isa %s, %d threads, %d rounds\n",
              static_cast<long long>(B), static_cast<long long>(H), static_cast<long long>(Tn), static_cast<long long>(hd),
              static_cast<double>(bytes) / (1 << 20), std::string(kiln::cpu_isa()).c_str(), kiln::num_threads(), rounds);
  std::printf("| op | hot median us | hot min us | cold output median us | cold min us |\n|---|---|---|---|---|\n");
  for (int k = 0; k < 4; ++k)
    std::printf("| %s | %.1f | %.1f | %.1f | %.1f |\n", names[k], hot[k].median(), hot[k].min(), cold[k].median(), cold[k].min());
  return 0;
}
