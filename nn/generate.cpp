#include "kiln/nn/generate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <utility>

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

// One sequence of a batch.
struct Row {
  size_t index = 0;  // in `prompts`
  int64_t pad = 0;   // padding columns before its first token (left padding)
  std::vector<int64_t> context, out;
  std::mt19937_64 rng;
  std::unique_ptr<Detokenizer> detok;
  std::optional<StopText> stop;
  std::string text;
  bool done = false;
  Finish finish = Finish::length;
};

// Rows of a left-padded batch: each new token's position in its own row and the keys it may see (its
// row's tokens; a padding query sees itself, so no softmax row is empty). T new tokens after `cached`.
template <Backend B> RowInputs<B> row_inputs(const std::vector<int64_t>& pads, int64_t cached, int64_t T) {
  const int64_t n = static_cast<int64_t>(pads.size()), S = cached + T;
  std::vector<int64_t> pos(static_cast<size_t>(n * T));
  std::vector<uint8_t> mask(static_cast<size_t>(n * T * S));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t col = cached + t;  // the query's column in the cache
      pos[static_cast<size_t>(r * T + t)] = std::max<int64_t>(col - pads[static_cast<size_t>(r)], 0);
      for (int64_t j = 0; j < S; ++j) mask[static_cast<size_t>((r * T + t) * S + j)] = j >= pads[static_cast<size_t>(r)] || j == col;
    }
  return {Tensor<B>::from_vector(pos, {n, T}), Tensor<B>::from_vector(mask, {n, 1, T, S}).to(DType::boolean)};
}

// The last position's logits of each row: logits [n, T, V] -> n rows of V.
template <Backend B> std::vector<std::vector<float>> last_rows(const Var<B>& logits) {
  const Tensor<B>& l = logits.value();
  const int64_t n = l.size(0), V = l.size(2);
  const std::vector<float> flat = l.narrow(1, l.size(1) - 1, 1).template to_vector<float>();
  std::vector<std::vector<float>> rows(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) rows[static_cast<size_t>(r)].assign(flat.begin() + r * V, flat.begin() + (r + 1) * V);
  return rows;
}

// step(ids [n, T], caches, capacity, rows) -> logits [n, T, V]; make() -> fresh caches; limit: the most
// positions of a sequence (0: none); rebuild_at > 0: when the cached positions reach it and the sequence
// grows past it, the caches are dropped and the whole sequence recomputed (hf::Spec::rebuild_caches_at).
template <Backend B, class Step, class Make> Generation run(const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& o,
                                                            int64_t limit, const char* what, Step step, Make make, int64_t rebuild_at = 0) {
  KILN_CHECK(o.max_new_tokens >= 0 && o.top_k >= 0 && o.temperature >= 0 && o.top_p > 0 && o.top_p <= 1 && o.repetition_penalty > 0 &&
                 o.batch_size >= 0,
             "generate: bad options (max_new_tokens {}, top_k {} and batch_size {} must be >= 0, temperature {} >= 0, top_p {} in (0, "
             "1], repetition_penalty {} > 0)",
             o.max_new_tokens, o.top_k, o.batch_size, o.temperature, o.top_p, o.repetition_penalty);
  KILN_CHECK(o.stop_strings.empty() || o.detokenizer, "generate: {} stop strings need a detokenizer (GenerateOptions::detokenizer)",
             o.stop_strings.size());
  for (const std::string& st : o.stop_strings) KILN_CHECK(!st.empty(), "generate: a stop string is empty");
  for (size_t s = 0; s < prompts.size(); ++s) {
    KILN_CHECK(!prompts[s].empty(), "generate: prompt {} is empty (a causal LM needs at least one token, e.g. BOS)", s);
    // the last new token is never read back
    const int64_t total = static_cast<int64_t>(prompts[s].size()) + std::max<int64_t>(o.max_new_tokens - 1, 0);
    KILN_CHECK(limit == 0 || total <= limit,
               "generate: prompt {} ({} tokens) + {} new tokens need {} positions (the last new token is not read back), more than "
               "the {} positions of {}",
               s, prompts[s].size(), o.max_new_tokens, total, limit, what);
  }
  NoGrad no_grad;
  Generation g;
  g.ids.resize(prompts.size());
  g.finish.assign(prompts.size(), Finish::length);
  if (o.detokenizer) g.text.resize(prompts.size());
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point a) { return std::chrono::duration<double>(clock::now() - a).count(); };

  // The batches: batch_size prompts each, in order.
  std::vector<std::vector<size_t>> batches;
  const size_t bs = o.batch_size > 0 ? static_cast<size_t>(o.batch_size) : std::max<size_t>(prompts.size(), 1);
  for (size_t first = 0; first < prompts.size(); first += bs) {
    batches.emplace_back();
    for (size_t i = first; i < std::min(prompts.size(), first + bs); ++i) batches.back().push_back(i);
  }
  if (o.max_new_tokens == 0) return g;

  for (const std::vector<size_t>& batch : batches) {
    int64_t L = 0;
    for (size_t i : batch) L = std::max<int64_t>(L, static_cast<int64_t>(prompts[i].size()));
    std::vector<Row> rows(batch.size());
    std::vector<int64_t> ids;
    for (size_t r = 0; r < batch.size(); ++r) {
      Row& row = rows[r];
      row.index = batch[r];
      row.context = prompts[row.index];
      row.pad = L - static_cast<int64_t>(row.context.size());
      row.rng.seed(o.seed + row.index);
      if (o.detokenizer) row.detok = o.detokenizer();
      if (!o.stop_strings.empty()) row.stop.emplace(o.stop_strings);
      ids.insert(ids.end(), static_cast<size_t>(row.pad), 0);  // any valid id: masked
      ids.insert(ids.end(), row.context.begin(), row.context.end());
      g.stats.prefill_tokens += static_cast<int64_t>(row.context.size());
    }
    const int64_t capacity = L + std::max<int64_t>(o.max_new_tokens - 1, 0);  // positions read: the last new token is not
    auto caches = make();
    std::vector<int64_t> pads;
    for (const Row& row : rows) pads.push_back(row.pad);
    auto padded = [](const std::vector<int64_t>& p) { return std::any_of(p.begin(), p.end(), [](int64_t x) { return x > 0; }); };
    auto t0 = clock::now();
    const int64_t n0 = static_cast<int64_t>(rows.size());
    std::vector<std::vector<float>> logits =
        last_rows(step(Tensor<B>::from_vector(ids, {n0, L}), caches, capacity, padded(pads) ? row_inputs<B>(pads, 0, L) : RowInputs<B>{}));
    g.stats.prefill_seconds += seconds(t0);
    g.stats.prefill_passes += 1;
    int64_t cached = L;
    std::vector<size_t> active(rows.size());  // rows[active[k]] is row k of the batch
    std::iota(active.begin(), active.end(), 0);
    while (true) {
      std::vector<int64_t> next;
      std::vector<int64_t> keep;  // the batch rows that go on
      for (size_t k = 0; k < active.size(); ++k) {
        Row& row = rows[active[k]];
        std::vector<float>& x = logits[k];
        process_logits(x, row.context, o);
        const int64_t id = choose(x, o.temperature > 0, row.rng);
        row.out.push_back(id);
        row.context.push_back(id);
        if (o.on_token) o.on_token(row.index, id);
        if (std::find(o.stop_ids.begin(), o.stop_ids.end(), id) != o.stop_ids.end()) {
          row.done = true;
          row.finish = Finish::stop_id;
        }
        if (row.detok) {
          const std::string piece = row.detok->push(id);
          std::string out = row.stop ? row.stop->push(piece) : piece;
          if (row.stop && row.stop->stopped()) {
            row.done = true;
            row.finish = Finish::stop_string;
          } else if (row.done || static_cast<int64_t>(row.out.size()) == o.max_new_tokens) {
            const std::string rest = row.detok->finish();
            out += row.stop ? row.stop->push(rest) : rest;
            if (row.stop && !row.stop->stopped()) out += row.stop->finish();
            if (row.stop && row.stop->stopped()) row.finish = Finish::stop_string;
          }
          row.text += out;
          if (o.on_text && !out.empty()) o.on_text(row.index, out);
        }
        if (static_cast<int64_t>(row.out.size()) == o.max_new_tokens) row.done = true;
        if (!row.done) {
          keep.push_back(static_cast<int64_t>(k));
          next.push_back(id);
        }
      }
      if (keep.empty()) break;
      if (keep.size() < active.size()) {  // rows that ended leave the batch
        const Tensor<B> idx = Tensor<B>::from_vector(keep, {static_cast<int64_t>(keep.size())});
        for (KVCache<B>& c : caches) {
          if (!c.k.defined()) continue;
          c.k = c.k.index_select(0, idx);
          c.v = c.v.index_select(0, idx);
        }
        std::vector<size_t> a;
        std::vector<int64_t> p;
        for (const int64_t k : keep) {
          a.push_back(active[static_cast<size_t>(k)]);
          p.push_back(pads[static_cast<size_t>(k)]);
        }
        active = std::move(a);
        pads = std::move(p);
      }
      const int64_t n = static_cast<int64_t>(active.size());
      t0 = clock::now();
      if (rebuild_at > 0 && cached == rebuild_at) {  // the whole (padded) sequence again, into fresh caches
        std::vector<int64_t> all;
        for (size_t k = 0; k < active.size(); ++k) {
          all.insert(all.end(), static_cast<size_t>(pads[k]), 0);
          all.insert(all.end(), rows[active[k]].context.begin(), rows[active[k]].context.end());
        }
        caches = make();
        logits = last_rows(step(Tensor<B>::from_vector(all, {n, cached + 1}), caches, capacity,
                                padded(pads) ? row_inputs<B>(pads, 0, cached + 1) : RowInputs<B>{}));
      } else {
        logits = last_rows(
            step(Tensor<B>::from_vector(next, {n, 1}), caches, capacity, padded(pads) ? row_inputs<B>(pads, cached, 1) : RowInputs<B>{}));
      }
      g.stats.decode_seconds += seconds(t0);
      g.stats.decode_tokens += n;
      g.stats.decode_passes += 1;
      cached += 1;
    }
    for (Row& row : rows) {
      g.ids[row.index] = std::move(row.out);
      g.finish[row.index] = row.finish;
      if (o.detokenizer) g.text[row.index] = std::move(row.text);
    }
  }
  return g;
}

}  // namespace

std::string StopText::push(const std::string& piece) {
  if (stopped_) return {};
  held_ += piece;
  size_t at = std::string::npos;
  for (const std::string& s : *stops_) at = std::min(at, held_.find(s));
  if (at != std::string::npos) {  // the text before the stop string is final; the rest is dropped
    stopped_ = true;
    std::string out = held_.substr(0, at);
    held_.clear();
    return out;
  }
  // Hold back the longest end of the text that begins a stop string.
  size_t hold = 0;
  for (const std::string& s : *stops_)
    for (size_t k = std::min(s.size() - 1, held_.size()); k > hold; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopText::finish() { return stopped_ ? std::string() : std::exchange(held_, std::string()); }

namespace {
class StreamDetokenizer : public Detokenizer {
 public:
  StreamDetokenizer(const text::Tokenizer& t, bool skip) : s_(t, skip) {}
  std::string push(int64_t id) override { return s_.push(static_cast<int32_t>(id)); }
  std::string finish() override { return s_.finish(); }

 private:
  text::TextStream s_;
};
}  // namespace

DetokenizerFactory detokenizer(const text::Tokenizer& tokenizer, bool skip_special_tokens) {
  return [tokenizer, skip_special_tokens] { return std::make_unique<StreamDetokenizer>(tokenizer, skip_special_tokens); };
}

template <Backend B>
Generation generate(const hf::CausalLM<B>& model, const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& o) {
  return run<B>(
      prompts, o, model.max_positions(), "the model (n_positions)",
      [&](const Tensor<B>& ids, std::vector<KVCache<B>>& c, int64_t cap, const RowInputs<B>& rows) {
        return model.forward(ids, c, cap, rows);
      },
      [&] { return model.make_caches(); }, model.spec().rebuild_caches_at);
}

template <Backend B> Generation generate(const GPT<B>& model, const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& o) {
  return run<B>(
      prompts, o, model.config().max_seq_len, "the model (max_seq_len)",
      [&](const Tensor<B>& ids, std::vector<KVCache<B>>& c, int64_t, const RowInputs<B>& rows) { return model.forward(ids, c, rows); },
      [&] { return std::vector<KVCache<B>>(static_cast<size_t>(model.config().n_layers)); });
}

#define KILN_INST(B)                                                                                                         \
  template Generation generate<B>(const hf::CausalLM<B>&, const std::vector<std::vector<int64_t>>&, const GenerateOptions&); \
  template Generation generate<B>(const GPT<B>&, const std::vector<std::vector<int64_t>>&, const GenerateOptions&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
