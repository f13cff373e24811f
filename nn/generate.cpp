#include "kiln/nn/generate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace kiln::nn {

void process_logits(std::vector<float>& x, const std::vector<int64_t>& context, const GenerateOptions& o) {
  const int64_t V = static_cast<int64_t>(x.size());
  const float ninf = -std::numeric_limits<float>::infinity();
  if (o.vocab_limit > 0)
    for (int64_t i = o.vocab_limit; i < V; ++i) x[static_cast<size_t>(i)] = ninf;
  if (o.repetition_penalty != 1.0) {
    std::vector<char> seen(x.size(), 0);
    const auto p = static_cast<float>(o.repetition_penalty);
    for (const int64_t id : context)
      if (id >= 0 && id < V && !seen[static_cast<size_t>(id)]) {
        seen[static_cast<size_t>(id)] = 1;
        float& s = x[static_cast<size_t>(id)];
        s = s < 0 ? s * p : s / p;
      }
  }
  if (o.temperature <= 0) return;  // greedy: the warpers below do not apply (transformers: do_sample=False)
  if (o.temperature != 1.0) {
    const auto t = static_cast<float>(o.temperature);
    for (float& s : x) s = s / t;
  }
  if (o.top_k > 0 && o.top_k < V) {
    std::vector<float> sorted(x);
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<float>());
    const float kth = sorted[static_cast<size_t>(o.top_k - 1)];
    for (float& s : x)
      if (s < kth) s = ninf;
  }
  if (o.top_p < 1.0) {
    // Ascending order; drop the tokens whose cumulative probability (from the least likely up) stays
    // at or below 1 - top_p; the most likely token always stays.
    std::vector<int64_t> idx(x.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return x[static_cast<size_t>(a)] < x[static_cast<size_t>(b)]; });
    const float mx = x[static_cast<size_t>(idx.back())];
    double z = 0;
    for (const float s : x) z += std::exp(static_cast<double>(s) - mx);
    double cum = 0;
    for (size_t r = 0; r + 1 < idx.size(); ++r) {
      float& s = x[static_cast<size_t>(idx[r])];
      cum += std::exp(static_cast<double>(s) - mx) / z;
      if (static_cast<float>(cum) <= static_cast<float>(1.0 - o.top_p)) s = ninf;
    }
  }
}

namespace {

int64_t choose(const std::vector<float>& x, bool sample, std::mt19937_64& rng) {
  if (!sample) return std::max_element(x.begin(), x.end()) - x.begin();  // the first of equal maxima
  const float mx = *std::max_element(x.begin(), x.end());
  std::vector<double> p(x.size());
  double z = 0;
  for (size_t i = 0; i < x.size(); ++i) z += p[i] = std::exp(static_cast<double>(x[i]) - mx);
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * z;  // [0, z), the same on every platform
  double c = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    c += p[i];
    if (u < c && p[i] > 0) return static_cast<int64_t>(i);
  }
  for (size_t i = x.size(); i-- > 0;)
    if (p[i] > 0) return static_cast<int64_t>(i);
  return 0;
}

template <Backend B> std::vector<float> last_row(const Var<B>& logits) {
  const Tensor<B>& l = logits.value();  // [1, T, V]
  return l.narrow(1, l.size(1) - 1, 1).template to_vector<float>();
}

// step(ids [1, T], caches) -> logits [1, T, V]; make() -> fresh caches; limit: the most positions (0: none).
template <Backend B, class Step, class Make> Generation run(const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& o,
                                                            int64_t limit, const char* what, Step step, Make make) {
  KILN_CHECK(o.max_new_tokens >= 0 && o.top_k >= 0 && o.temperature >= 0 && o.top_p > 0 && o.top_p <= 1 && o.repetition_penalty > 0,
             "generate: bad options (max_new_tokens {} and top_k {} must be >= 0, temperature {} >= 0, top_p {} in (0, 1], "
             "repetition_penalty {} > 0)",
             o.max_new_tokens, o.top_k, o.temperature, o.top_p, o.repetition_penalty);
  NoGrad no_grad;
  Generation g;
  std::mt19937_64 rng(o.seed);
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point a) { return std::chrono::duration<double>(clock::now() - a).count(); };
  for (size_t s = 0; s < prompts.size(); ++s) {
    const std::vector<int64_t>& prompt = prompts[s];
    KILN_CHECK(!prompt.empty(), "generate: prompt {} is empty (a causal LM needs at least one token, e.g. BOS)", s);
    const int64_t total = static_cast<int64_t>(prompt.size()) + o.max_new_tokens;
    KILN_CHECK(limit == 0 || total <= limit, "generate: prompt {} ({} tokens) + {} new tokens exceed the {} positions of {}", s,
               prompt.size(), o.max_new_tokens, limit, what);
    std::vector<int64_t> context = prompt, out;
    auto caches = make();
    if (o.max_new_tokens == 0) {
      g.ids.push_back(out);
      continue;
    }
    auto t0 = clock::now();
    std::vector<float> row = last_row(step(Tensor<B>::from_vector(prompt, {1, static_cast<int64_t>(prompt.size())}), caches, total));
    g.stats.prefill_seconds += seconds(t0);
    g.stats.prefill_tokens += static_cast<int64_t>(prompt.size());
    while (true) {
      process_logits(row, context, o);
      const int64_t id = choose(row, o.temperature > 0, rng);
      out.push_back(id);
      context.push_back(id);
      if (o.on_token) o.on_token(s, id);
      if (static_cast<int64_t>(out.size()) == o.max_new_tokens || std::find(o.stop_ids.begin(), o.stop_ids.end(), id) != o.stop_ids.end())
        break;
      t0 = clock::now();
      row = last_row(step(Tensor<B>::from_vector(std::vector<int64_t>{id}, {1, 1}), caches, total));
      g.stats.decode_seconds += seconds(t0);
      g.stats.decode_tokens += 1;
    }
    g.ids.push_back(std::move(out));
  }
  return g;
}

}  // namespace

template <Backend B>
Generation generate(const hf::CausalLM<B>& model, const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& o) {
  return run<B>(
      prompts, o, model.max_positions(), "the model (n_positions)",
      [&](const Tensor<B>& ids, std::vector<KVCache<B>>& c, int64_t cap) { return model.forward(ids, c, cap); },
      [&] { return model.make_caches(); });
}

template <Backend B> Generation generate(const GPT<B>& model, const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& o) {
  return run<B>(
      prompts, o, model.config().max_seq_len, "the model (max_seq_len)",
      [&](const Tensor<B>& ids, std::vector<KVCache<B>>& c, int64_t) { return model.forward(ids, c); },
      [&] { return std::vector<KVCache<B>>(static_cast<size_t>(model.config().n_layers)); });
}

#define KILN_INST(B)                                                                                                         \
  template Generation generate<B>(const hf::CausalLM<B>&, const std::vector<std::vector<int64_t>>&, const GenerateOptions&); \
  template Generation generate<B>(const GPT<B>&, const std::vector<std::vector<int64_t>>&, const GenerateOptions&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
