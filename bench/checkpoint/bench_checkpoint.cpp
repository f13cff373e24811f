// Step time with and without activation checkpointing, in one process, interleaved (A B B A per
// round) so that both see the same machine load: forward + cross-entropy + backward of a GPT
// (docs/memory.md; peak memory is measured per process by bench/checkpoint/run.sh).
//
//   bench_checkpoint [d_model 512] [layers 8] [T 512] [B 8] [rounds 2] [attention mha] [residual standard]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>

using namespace kiln;

int main(int argc, char** argv) {
  auto arg = [&](int i, int64_t d) { return argc > i ? std::stoll(argv[i]) : d; };
  ModelConfig c;
  c.d_model = arg(1, 512);
  c.n_layers = arg(2, 8);
  const int64_t T = arg(3, 512), Bn = arg(4, 8), rounds = arg(5, 2);
  c.attention = argc > 6 ? argv[6] : "mha";
  c.residual = argc > 7 ? argv[7] : "standard";
  c.n_heads = c.attention == "diff" ? 4 : 8;
  c.vocab_size = 256;
  c.max_seq_len = T;
  nn::GPT<Cpu> model(c);
  std::mt19937_64 r(0);
  std::vector<int64_t> v(static_cast<size_t>(Bn * (T + 1)));
  for (auto& t : v) t = static_cast<int64_t>(r() % 256);
  const Tensor<Cpu> all = Tensor<Cpu>::from_vector(v, {Bn, T + 1});
  const Tensor<Cpu> x = all.narrow(1, 0, T).contiguous(), y = all.narrow(1, 1, T).contiguous();
  auto step = [&](bool ckpt) {
    model.set_activation_checkpointing(ckpt);
    for (auto& [n, p] : model.named_parameters()) p.zero_grad();
    const auto t0 = std::chrono::steady_clock::now();
    nn::cross_entropy(model.forward(x).reshape({-1, c.vocab_size}), y.reshape({-1})).backward();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  std::printf("GPT %s/%s d_model %lld, %lld layers, T %lld, B %lld, %s, %d threads\n", c.attention.c_str(), c.residual.c_str(),
              static_cast<long long>(c.d_model), static_cast<long long>(c.n_layers), static_cast<long long>(T), static_cast<long long>(Bn),
              std::string(cpu_isa()).c_str(), num_threads());
  step(false);  // warm-up: first-touch page faults, oneDNN primitives
  step(true);
  std::vector<double> off, on;
  for (int64_t i = 0; i < rounds; ++i) {
    off.push_back(step(false));
    on.push_back(step(true));
    on.push_back(step(true));
    off.push_back(step(false));
    std::printf("round %lld: off %.0f ms, on %.0f ms, on %.0f ms, off %.0f ms\n", static_cast<long long>(i), off[off.size() - 2],
                on[on.size() - 2], on.back(), off.back());
  }
  auto median = [](std::vector<double> a) {
    std::sort(a.begin(), a.end());
    return a.size() % 2 ? a[a.size() / 2] : (a[a.size() / 2 - 1] + a[a.size() / 2]) / 2;
  };
  std::printf("forward+backward median: off %.0f ms, on %.0f ms, on/off %.3f\n", median(off), median(on), median(on) / median(off));
}
