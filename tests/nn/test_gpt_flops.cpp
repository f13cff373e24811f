// nn::gpt_flops (the model FLOPs `kiln train` logs) against counts made another way: the dense part
// from the parameter shapes a built GPT actually holds, the attention part by walking the causal
// query-key pairs one by one, the AttnRes part by running the SPECS §2 block state machine.
#include <catch2/catch.hpp>

#include <kiln/backends/backends.hpp>
#include <kiln/nn/gpt.hpp>

using namespace kiln;
using namespace kiln::nn;

namespace {

// 6 FLOPs per matmul parameter and token (2 forward, 4 backward), from the model's own parameters:
// every matrix but the embedding table, which is a lookup unless it is also the LM head.
double dense_from_model(const ModelConfig& c, int64_t T) {
  GPT<Cpu> m(c);
  double n = 0;
  for (const auto& [name, p] : m.named_parameters())
    if (p.dim() == 2 && (name != "tok_emb.weight" || c.tie_embeddings)) n += static_cast<double>(p.numel());
  return 6.0 * static_cast<double>(T) * n;
}

// Forward Q·Kᵀ and P·V, one (query, key) pair at a time over the causal triangle, times 3 for the backward.
double attention_by_pairs(const ModelConfig& c, int64_t T) {
  const int64_t head = c.d_model / c.n_heads;
  double f = 0;
  for (int64_t layer = 0; layer < c.n_layers; ++layer)
    for (int64_t h = 0; h < c.n_heads; ++h)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          if (c.attention == "diff")
            f += 2.0 * (2 * (head / 2) + 2 * head);  // two branches: d_qk = head/2, d_v = head
          else if (c.attention == "diff2")
            f += 2.0 * 2 * (head + head);  // two query heads of width head
          else
            f += 2.0 * (head + head);
        }
  return 3 * f;
}

// SPECS §2's state machine, counting the sources each depth attention reads.
int64_t depth_sources(int64_t n_layers, int64_t S) {
  int64_t blocks = 1, total = 0;
  bool partial = false;
  for (int64_t j = 0; j < 2 * n_layers; ++j) {
    if (j > 0 && j % S == 0) {
      ++blocks;
      partial = false;
    }
    total += blocks + (partial ? 1 : 0);
    partial = true;
  }
  return total + blocks + 1;  // final_res
}

}  // namespace

TEST_CASE("gpt_flops: dense, attention and AttnRes parts match independent counts", "[gpt_flops]") {
  for (const char* att : {"mha", "diff", "diff2"})
    for (const char* res : {"standard", "attnres_full", "attnres_block"})
      for (const bool tied : {false, true})
        for (const int64_t kv : {0, 1}) {
          ModelConfig c;
          c.vocab_size = 37;
          c.d_model = 16;
          c.n_layers = 3;
          c.n_heads = 2;
          c.n_kv_heads = kv;
          c.attention = att;
          c.residual = res;
          c.attnres_block_size = 3;
          c.tie_embeddings = tied;
          c.max_seq_len = 16;
          const int64_t T = 11;
          INFO(att << " " << res << " tied " << tied << " kv " << kv);
          const GPTFlops f = gpt_flops(c, T);
          CHECK(f.dense == Approx(dense_from_model(c, T)).epsilon(1e-12));
          CHECK(f.attention == Approx(attention_by_pairs(c, T)).epsilon(1e-12));
          const int64_t S = std::string(res) == "attnres_full" ? 1 : 3;
          const double depth = std::string(res) == "standard" ? 0.0 : 12.0 * 16 * T * static_cast<double>(depth_sources(3, S));
          CHECK(f.depth == Approx(depth).epsilon(1e-12));
          CHECK(f.total() == Approx(f.dense + f.attention + f.depth));
        }
}

TEST_CASE("gpt_flops: the issue's d_model 256 benchmark model, by hand", "[gpt_flops]") {
  ModelConfig c;
  c.d_model = 256;
  c.n_layers = 4;
  c.n_heads = 4;
  c.max_seq_len = 128;
  // ffn_hidden = ceil64(8·256/3) = 704; per layer 4·256² + 3·256·704 = 802816; LM head 256·256.
  const GPTFlops f = gpt_flops(c, 128);
  CHECK(f.dense == 6.0 * 128 * (4 * 802816.0 + 65536));
  CHECK(f.attention == 3.0 * 4 * 4 * 2 * (64 + 64) * (128 * 129 / 2));  // 12·L·D·T(T+1)/2 = 101.4 MFLOP
  CHECK(f.depth == 0);
  CHECK(f.total() / 128 == Approx(20.45e6).epsilon(1e-3));  // per token
  c.residual = "attnres_full";
  CHECK(gpt_flops(c, 128).depth == 12.0 * 256 * 128 * (1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 + 9));
  CHECK_THROWS_WITH(gpt_flops(c, 0), Catch::Contains("gpt_flops: T must be >= 1"));
}
