#pragma once
// Outlier probe for the attention study: runs a trained nn::GPT layer by layer through its public
// modules (GPTLayer::attn_sublayer / mlp_sublayer, nn::AttnResStack, the named submodules) and collects
//   hidden states:     the tensor each sublayer reads (before its RMSNorm) and the final pre-norm state,
//                      i.e. the residual stream for standard residuals and the depth-attention mixture h
//                      for AttnRes, [B, T, D] each;
//   attention logits:  the pre-softmax scores q·kᵀ/√d (after RoPE) on the causal triangle (j ≤ i), of
//                      every head and, for differential attention, of both maps (Diff: the two sub-head
//                      branches; Diff V2: both query heads of each pair).
// The logits are recomputed from the layer's own projections; to show they are the ones the model uses,
// the probe rebuilds each attention output from them (softmax, V, the variant's combination and output
// projection) and the final logits from the probed final state, and reports the largest difference
// from the model's own outputs (`max_rebuild_error`); the caller fails above float round-off.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <kiln/nn/gpt.hpp>

#include "stats.hpp"

namespace study {

struct ProbeResult {
  std::vector<float> hidden, logits;                    // pooled over layers (and heads, maps)
  std::vector<double> hidden_kurtosis, logit_kurtosis;  // one per probed hidden tensor / per layer's logits
  double max_rebuild_error = 0;
};

template <kiln::Backend B> class Probe {
 public:
  explicit Probe(const kiln::nn::GPT<B>& model) : model_(model), c_(model.config()) {
    for (const auto& [name, m] : model.named_modules()) modules_[name] = m;
  }

  ProbeResult run(const kiln::Tensor<B>& ids) const {
    using namespace kiln;
    NoGrad ng;
    ProbeResult r;
    const int64_t T = ids.size(1);
    std::vector<float> causal(static_cast<size_t>(T * T), 0.f);
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = i + 1; j < T; ++j) causal[static_cast<size_t>(i * T + j)] = -INFINITY;
    mask_ = Var<B>(Tensor<B>::from_vector(causal, {T, T}));
    auto record = [&](const Var<B>& h) {
      const std::vector<float> v = to_vector<float>(h.value().contiguous());
      r.hidden_kurtosis.push_back(kurtosis(v));
      r.hidden.insert(r.hidden.end(), v.begin(), v.end());
    };
    Var<B> x = get<nn::Embedding<B>>("tok_emb").forward(ids);
    const int64_t L = c_.n_layers;
    auto attn = [&](int64_t i, const nn::GPTLayer<B>& layer, const Var<B>& h) {
      record(h);
      const Var<B> y = layer.attn_sublayer(h, nullptr);
      r.max_rebuild_error = std::max(r.max_rebuild_error, max_diff(attention_logits(i, h, r), y));
      return y;
    };
    auto mlp = [&](const nn::GPTLayer<B>& layer, const Var<B>& h) {
      record(h);
      return layer.mlp_sublayer(h);
    };
    if (c_.residual == "standard") {
      for (int64_t i = 0; i < L; ++i) {
        const auto& layer = get<nn::GPTLayer<B>>(fmt::format("layers.{}", i));
        x = x.add(attn(i, layer, x));
        x = x.add(mlp(layer, x));
      }
    } else {
      nn::AttnResStack<B> stack(x, c_.residual == "attnres_full" ? 1 : c_.attnres_block_size);
      for (int64_t i = 0; i < L; ++i) {
        const auto& layer = get<nn::GPTLayer<B>>(fmt::format("layers.{}", i));
        stack.step(layer.attn_res(), [&](const Var<B>& h) { return attn(i, layer, h); });
        stack.step(layer.mlp_res(), [&](const Var<B>& h) { return mlp(layer, h); });
      }
      x = stack.finish(get<nn::DepthAttention<B>>("final_res"));
    }
    record(x);
    Var<B> out = get<nn::RMSNorm<B>>("norm").forward(x);
    out =
        c_.tie_embeddings ? out.matmul(Var<B>(model_.parameter("tok_emb.weight").value().t())) : get<nn::Linear<B>>("lm_head").forward(out);
    r.max_rebuild_error = std::max(r.max_rebuild_error, max_diff(out, model_.forward(ids)));
    return r;
  }

 private:
  template <class M> const M& get(const std::string& name) const {
    const auto it = modules_.find(name);
    KILN_CHECK(it != modules_.end(), "attention_study probe: the model has no module '{}'", name);
    const auto* m = dynamic_cast<const M*>(it->second);
    KILN_CHECK(m != nullptr, "attention_study probe: module '{}' is not of the expected type", name);
    return *m;
  }
  const kiln::nn::Linear<B>& proj(int64_t layer, const char* name) const {
    return get<kiln::nn::Linear<B>>(fmt::format("layers.{}.attn.{}", layer, name));
  }
  static double max_diff(const kiln::Var<B>& a, const kiln::Var<B>& b) { return kiln::item<double>(a.value().sub(b.value()).abs().max()); }
  kiln::Var<B> rope(const kiln::Var<B>& t) const { return c_.rope ? kiln::nn::rope(t, 0, c_.rope_theta) : t; }
  // k or v [B, hkv, T, w] -> [B, hkv·g, T, w]: query head i reads kv head ⌊i/g⌋.
  static kiln::Var<B> repeat_kv(const kiln::Var<B>& t, int64_t g) {
    if (g == 1) return t;
    const int64_t Bn = t.size(0), hkv = t.size(1), T = t.size(2), w = t.size(3);
    return t.unsqueeze(2).expand({Bn, hkv, g, T, w}).reshape({Bn, hkv * g, T, w});
  }
  // Appends the causal triangle of logits [..., T, T] (scaled scores) to r and returns softmax(logits)·v.
  kiln::Var<B> scores(const kiln::Var<B>& q, const kiln::Var<B>& k, const kiln::Var<B>& v, double scale, ProbeResult& r) const {
    const kiln::Var<B> s = q.matmul(k.transpose(-2, -1)).mul(scale);
    const std::vector<float> all = kiln::to_vector<float>(s.value().contiguous());
    const int64_t T = s.size(-1);
    std::vector<float> tri;
    tri.reserve(all.size() / 2 + static_cast<size_t>(T));
    for (size_t m = 0; m < all.size(); m += static_cast<size_t>(T * T))
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j <= i; ++j) tri.push_back(all[m + static_cast<size_t>(i * T + j)]);
    r.logit_kurtosis.push_back(kurtosis(tri));
    r.logits.insert(r.logits.end(), tri.begin(), tri.end());
    return s.add(mask_).softmax(-1).matmul(v);
  }
  // The attention sublayer of layer i rebuilt from its logits (which it records): attn(attn_norm(h)).
  kiln::Var<B> attention_logits(int64_t i, const kiln::Var<B>& h, ProbeResult& r) const {
    using namespace kiln;
    const Var<B> n = get<nn::RMSNorm<B>>(fmt::format("layers.{}.attn_norm", i)).forward(h);
    const int64_t Bn = n.size(0), T = n.size(1), D = c_.d_model, H = c_.n_heads, Hkv = c_.n_kv_heads;
    if (c_.attention == "mha") {
      const int64_t hd = D / H;
      const Var<B> q = rope(proj(i, "q_proj").forward(n).view({Bn, T, H, hd}).transpose(1, 2));
      const Var<B> k = rope(proj(i, "k_proj").forward(n).view({Bn, T, Hkv, hd}).transpose(1, 2));
      const Var<B> v = proj(i, "v_proj").forward(n).view({Bn, T, Hkv, hd}).transpose(1, 2);
      const Var<B> y = scores(q, repeat_kv(k, H / Hkv), repeat_kv(v, H / Hkv), 1.0 / std::sqrt(double(hd)), r);
      return proj(i, "out_proj").forward(y.transpose(1, 2).reshape({Bn, T, H * hd}));
    }
    if (c_.attention == "diff") {
      const int64_t d = D / H / 2, g = H / Hkv;
      const Var<B> q = rope(proj(i, "q_proj").forward(n).view({Bn, T, H, 2, d}).permute({0, 2, 3, 1, 4}));  // [B, H, 2, T, d]
      Var<B> k = rope(proj(i, "k_proj").forward(n).view({Bn, T, Hkv, 2, d}).permute({0, 2, 3, 1, 4}));      // [B, Hkv, 2, T, d]
      if (g > 1) k = k.unsqueeze(2).expand({Bn, Hkv, g, 2, T, d}).reshape({Bn, H, 2, T, d});
      const Var<B> v =
          repeat_kv(proj(i, "v_proj").forward(n).view({Bn, T, Hkv, 2 * d}).transpose(1, 2), g).unsqueeze(2).expand({Bn, H, 2, T, 2 * d});
      const Var<B> a = scores(q, k, v, 1.0 / std::sqrt(double(d)), r);  // [B, H, 2, T, 2d]
      const auto& mod = get<nn::DifferentialAttention<B>>(fmt::format("layers.{}.attn", i));
      const double lambda = item<double>(mod.lambda().value());
      Var<B> o = a.select(2, 0).sub(a.select(2, 1).mul(lambda));
      if (mod.options().subln) o = get<nn::RMSNorm<B>>(fmt::format("layers.{}.attn.subln", i)).forward(o);
      o = o.mul(1.0 - mod.lambda_init());
      return proj(i, "out_proj").forward(o.transpose(1, 2).reshape({Bn, T, H * 2 * d}));
    }
    KILN_CHECK(c_.attention == "diff2", "attention_study probe: unknown attention '{}'", c_.attention);
    const int64_t hd = D / H, g = 2 * H / Hkv;
    const Var<B> q = rope(proj(i, "q_proj").forward(n).view({Bn, T, 2 * H, hd}).transpose(1, 2));  // [B, 2H, T, hd]
    const Var<B> k = rope(proj(i, "k_proj").forward(n).view({Bn, T, Hkv, hd}).transpose(1, 2));
    const Var<B> v = proj(i, "v_proj").forward(n).view({Bn, T, Hkv, hd}).transpose(1, 2);
    const Var<B> a = scores(q, repeat_kv(k, g), repeat_kv(v, g), 1.0 / std::sqrt(double(hd)), r).view({Bn, H, 2, T, hd});
    const Var<B> lam = proj(i, "lambda_proj").forward(n).sigmoid().transpose(1, 2).unsqueeze(-1);  // [B, H, T, 1]
    const Var<B> o = a.select(2, 0).sub(a.select(2, 1).mul(lam));
    return proj(i, "o_proj").forward(o.transpose(1, 2).reshape({Bn, T, H * hd}));
  }

  const kiln::nn::GPT<B>& model_;
  kiln::ModelConfig c_;
  std::map<std::string, const kiln::nn::Module<B>*> modules_;
  mutable kiln::Var<B> mask_;
};

}  // namespace study
