// Bring your own model: load a Hugging Face causal LM directory (GPT-2, Llama, Mistral, Qwen2:
// config.json + model.safetensors or its sharded index) and generate from token ids.
//
//   example_hf_generate MODEL_DIR [ids, comma-separated; prompts separated by /] [max_new_tokens] [device]
//   example_hf_generate tests/hf/fixtures/llama 5,6,7 12
//   example_hf_generate tests/hf/fixtures/llama 5,6,7/8,9/10 12      (three prompts, one batch)
//
// Greedy, stopping at the model's EOS; prints the generated ids of each prompt and the prefill/decode
// speed. Prompts of different lengths decode together as one left-padded batch. Text in and out goes
// through the model's tokenizer (kiln::text::Tokenizer, nn::detokenizer for stop strings,
// `kiln generate --prompt ... --stop ...`).
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <kiln/kiln.hpp>
#include <kiln/nn/generate.hpp>
#include <kiln/nn/hf/causal_lm.hpp>

using namespace kiln;

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: {} MODEL_DIR [ids] [max_new_tokens] [cpu|reference|cuda]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<std::vector<int64_t>> prompts;
  std::stringstream all(argc > 2 ? argv[2] : "1");
  for (std::string p; std::getline(all, p, '/');) {
    std::stringstream ss(p);
    prompts.emplace_back();
    for (std::string t; std::getline(ss, t, ',');) prompts.back().push_back(std::stoll(t));
  }
  const int64_t n = argc > 3 ? std::atoll(argv[3]) : 20;
  try {
    const nn::Generation g = dispatch(argc > 4 ? argv[4] : "cpu", [&]<Backend B>() {
      const hf::ModelDir d = hf::ModelDir::open(dir);
      auto model = hf::load_causal_lm<B>(d, {.dtype = DType::f32});
      const hf::Spec& s = model->spec();
      fmt::print("{}: {} layers, hidden {}, {} heads ({} kv), vocab {}, {} parameters\n", s.architecture, s.layers, s.hidden, s.heads,
                 s.kv_heads, s.vocab, model->num_parameters());
      nn::GenerateOptions o;
      o.max_new_tokens = n;
      o.temperature = 0;  // greedy
      o.stop_ids = hf::eos_token_ids(d);
      if (prompts.size() == 1) o.on_token = [](size_t, int64_t id) { fmt::print("{} ", id), std::fflush(stdout); };  // streaming
      return nn::generate(*model, prompts, o);
    });
    fmt::print("\n");
    for (const auto& ids : g.ids) fmt::print("generated: {}\n", fmt::join(ids, ","));
    fmt::print("prefill {:.0f} tokens/s, decode {:.0f} tokens/s ({} decode passes)\n", g.stats.prefill_tokens_per_second(),
               g.stats.decode_tokens_per_second(), g.stats.decode_passes);
  } catch (const Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
