// nn::generate on kiln's GPT: a batch of prompts of different lengths, left-padded, decodes as one
// batch (each row's positions and a padding mask through nn::RowInputs), every attention kind, and
// gives each row the logits and the greedy ids it gets alone. (Hugging Face models: test_hf.cpp.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <kiln/backends/backends.hpp>
#include <kiln/nn/generate.hpp>
#include <kiln/nn/gpt.hpp>

using namespace kiln;
using namespace kiln::nn;

namespace {

const std::vector<std::vector<int64_t>> kPrompts = {{3, 14, 15, 9, 2}, {6, 5}, {3, 5, 8, 9, 7, 9, 3}};

ModelConfig config(const std::string& attention, bool rope) {
  ModelConfig c;
  c.vocab_size = 40;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = attention == "diff" ? 2 : 4;
  c.n_kv_heads = attention == "mha" ? 2 : 0;  // GQA on the plain attention
  c.max_seq_len = 24;
  c.attention = attention;
  c.rope = rope;
  return c.resolved();
}

// A GPT whose logits are far from uniform (greedy ids not decided by rounding): weights ×8.
template <Backend B> std::shared_ptr<GPT<B>> model(const std::string& attention, bool rope) {
  auto m = std::make_shared<GPT<B>>(config(attention, rope));
  m->init_weights(7);
  NoGrad ng;
  for (auto& [name, p] : m->named_parameters())
    if (p.dim() >= 2) {
      Tensor<B> t = p.value();  // shares the parameter's storage
      t.copy_(t.mul(8.0));
    }
  m->eval();
  return m;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return num / den;
}

// Prefill of the left-padded batch and two decode steps against each prompt alone (a full forward).
template <Backend B> void check_rows(const GPT<B>& m) {
  NoGrad ng;
  const int64_t n = static_cast<int64_t>(kPrompts.size()), V = m.config().vocab_size;
  int64_t L = 0;
  for (const auto& p : kPrompts) L = std::max<int64_t>(L, static_cast<int64_t>(p.size()));
  std::vector<int64_t> ids, pads;
  for (const auto& p : kPrompts) {
    pads.push_back(L - static_cast<int64_t>(p.size()));
    ids.insert(ids.end(), static_cast<size_t>(pads.back()), 0);
    ids.insert(ids.end(), p.begin(), p.end());
  }
  auto rows = [&](int64_t cached, int64_t T) {
    std::vector<int64_t> pos;
    std::vector<uint8_t> mask;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t t = 0; t < T; ++t) {
        pos.push_back(std::max<int64_t>(cached + t - pads[static_cast<size_t>(r)], 0));
        for (int64_t j = 0; j < cached + T; ++j) mask.push_back(j >= pads[static_cast<size_t>(r)] || j == cached + t);
      }
    return RowInputs<B>{Tensor<B>::from_vector(pos, {n, T}), Tensor<B>::from_vector(mask, {n, 1, T, cached + T}).to(DType::boolean)};
  };
  std::vector<KVCache<B>> caches;
  const std::vector<float> prefill = m.forward(Tensor<B>::from_vector(ids, {n, L}), caches, rows(0, L)).value().template to_vector<float>();
  std::vector<std::vector<float>> steps;
  for (int64_t k = 0; k < 2; ++k)
    steps.push_back(m.forward(Tensor<B>::from_vector(std::vector<int64_t>(static_cast<size_t>(n), 11 + k), {n, 1}), caches, rows(L + k, 1))
                        .value()
                        .template to_vector<float>());
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int64_t> alone = kPrompts[static_cast<size_t>(r)];
    alone.insert(alone.end(), {11, 12});
    const std::vector<float> want =
        m.forward(Tensor<B>::from_vector(alone, {1, static_cast<int64_t>(alone.size())})).value().template to_vector<float>();
    std::vector<float> got(prefill.begin() + (r * L + pads[static_cast<size_t>(r)]) * V, prefill.begin() + (r + 1) * L * V);
    for (const auto& s : steps) got.insert(got.end(), s.begin() + r * V, s.begin() + (r + 1) * V);
    INFO("row " << r << ", " << pads[static_cast<size_t>(r)] << " padding");
    CHECK(rel_err(got, want) < 1e-5);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("generate: each row of a left-padded GPT batch gets the logits it gets alone, every attention kind", "[hf][generate]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  for (const char* att : {"mha", "diff", "diff2"})
    for (const bool rope : {true, false}) DYNAMIC_SECTION(att << (rope ? " rope" : " no positions")) check_rows(*model<B>(att, rope));
}

TEST_CASE("generate: a GPT batch of prompts of different lengths gives each prompt's greedy ids alone, in fewer passes (cpu)",
          "[hf][generate]") {
  for (const char* att : {"mha", "diff", "diff2"}) {
    DYNAMIC_SECTION(att) {
      const auto m = model<Cpu>(att, true);
      const GenerateOptions o{.max_new_tokens = 9, .stop_ids = {17}};
      const Generation batch = generate(*m, kPrompts, o);
      GenerateOptions one = o;
      one.batch_size = 1;
      const Generation alone = generate(*m, kPrompts, one);
      CHECK(batch.ids == alone.ids);
      CHECK(batch.finish == alone.finish);
      for (size_t i = 0; i < kPrompts.size(); ++i) {
        const Generation single = generate(*m, {kPrompts[i]}, o);
        CHECK(single.ids[0] == batch.ids[i]);
      }
      CHECK(batch.stats.prefill_passes == 1);
      CHECK(alone.stats.prefill_passes == 3);
      CHECK(batch.stats.decode_passes < alone.stats.decode_passes);
      CHECK(batch.stats.decode_tokens == alone.stats.decode_tokens);
      // Sampling: row i draws from seed + i, so it samples alone what it samples in the batch.
      GenerateOptions s = o;
      s.temperature = 1.0;
      s.seed = 5;
      const Generation sb = generate(*m, kPrompts, s);
      s.seed = 5 + 2;
      CHECK(generate(*m, {kPrompts[2]}, s).ids[0] == sb.ids[2]);
    }
  }
}
