// Peak resident memory of fine-tuning a Hugging Face model directory with kiln: LoRA (q_proj, v_proj,
// r 8) or every parameter, AdamW, a few steps (bench/lora/memory.py runs it beside PEFT on PyTorch).
//   bench_lora_memory MODEL_DIR lora|full STEPS BATCH SEQ
// Prints one JSON line: the parameters, the trainable ones, the peak RSS after loading and at the end.
#include <sys/resource.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <kiln/backends/backends.hpp>
#include <kiln/nn/hf/causal_lm.hpp>
#include <kiln/nn/lora.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/optimizer.hpp>

using namespace kiln;

namespace {
double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s MODEL_DIR lora|full STEPS BATCH SEQ\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1], mode = argv[2];
  const int64_t steps = std::stoll(argv[3]), Bn = std::stoll(argv[4]), T = std::stoll(argv[5]);
  auto model = hf::load_causal_lm<Cpu>(dir);
  const double loaded = peak_rss_mb();
  if (mode == "lora") nn::apply_lora(*model, {.r = 8, .alpha = 16, .target_modules = {"q_proj", "v_proj"}});
  int64_t trainable = 0;
  for (const auto& [n, p] : model->named_parameters()) trainable += p.requires_grad() ? p.numel() : 0;
  optim::AdamW<Cpu> opt(model->named_parameters(), {.lr = 1e-4, .weight_decay = 0.01});
  std::mt19937_64 gen(0);
  std::vector<int64_t> tokens(static_cast<size_t>(Bn * T));
  for (auto& t : tokens) t = static_cast<int64_t>(gen() % static_cast<uint64_t>(model->spec().vocab));
  const Tensor<Cpu> ids = Tensor<Cpu>::from_vector(tokens, {Bn, T});
  double loss = 0;
  for (int64_t s = 0; s < steps; ++s) {
    opt.zero_grad();
    const Var<Cpu> logits = model->forward(ids);
    Var<Cpu> l = nn::cross_entropy(logits.narrow(1, 0, T - 1).reshape({Bn * (T - 1), -1}),
                                   ids.narrow(1, 1, T - 1).contiguous().reshape({Bn * (T - 1)}));
    l.backward();
    opt.step();
    loss = to_vector<float>(l.value())[0];
  }
  fmt::print(
      "{{\"framework\": \"kiln\", \"mode\": \"{}\", \"params\": {}, \"trainable\": {}, \"rss_loaded_mb\": {:.0f}, "
      "\"rss_peak_mb\": {:.0f}, \"loss\": {:.4f}}}\n",
      mode, model->num_parameters(), trainable, loaded, peak_rss_mb(), loss);
  return 0;
}
