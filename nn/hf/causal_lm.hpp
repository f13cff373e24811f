#pragma once
// Hugging Face causal language models as kiln modules: GPT2LMHeadModel, LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM,
// Gemma3ForCausalLM and Phi3ForCausalLM (architectures() lists them).
//
//   auto model = kiln::hf::load_causal_lm<Cpu>("path/to/model_dir");      // config.json + safetensors
//   Var<Cpu> logits = model->forward(ids);                                  // ids [B, T] -> [B, T, vocab]
//
// One decoder (CausalLM below) serves every architecture: a Spec says which norm, MLP, biases and
// positions it has; each architecture is one file (nn/hf/gpt2.cpp, llama.cpp, qwen.cpp, gemma.cpp, phi3.cpp) holding a
// table that reads config.json into a Spec and names, for every kiln parameter, the checkpoint tensor
// it comes from and how (copy, transpose a Conv1D, a slice of a fused c_attn, RoPE rows re-ordered).
// docs/formats.md has the tables.
//
// RoPE: transformers' Llama family turns the halves of a head (pairs (i, i + d/2), "rotate_half");
// kiln's fused RoPE turns adjacent pairs (2i, 2i+1). Loading re-orders the rows of q_proj and k_proj
// (and their biases) within each head, as llama.cpp's converter does: q·k is unchanged, the same
// frequency turns the same pair, and the fast kernel runs as is. The parameters of a loaded Llama are
// therefore not byte-equal to the checkpoint's q_proj/k_proj (every other tensor is).
//
// # Shapes
//   ids [B, T] (i32/i64) -> logits [B, T, vocab]; with per-layer KV caches, ids are the positions
//   after the cached ones (generation, under NoGrad).
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kiln/formats/hf_dir.hpp"
#include "kiln/nn/attention.hpp"
#include "kiln/nn/embedding.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/nn/norm.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::hf {

enum class NormKind { rms, layer };
enum class MlpKind { gated, fc };  // gated: down(act(gate(x)) * up(x)) (SwiGLU with silu);  fc: proj(act(fc(x)))
enum class Act { gelu_tanh, gelu, relu, silu };

// RoPE as a config spells it (nn/hf/architecture.hpp: read_rope, write_rope).
struct RopeSpec {
  std::string type = "default";  // "default", "linear", "llama3", "yarn", "longrope"
  double theta = 10000.0;
  double factor = 0;                                                                       // linear, llama3, yarn, longrope
  double low_freq_factor = 0, high_freq_factor = 0, original_max_position_embeddings = 0;  // llama3 (the last: yarn too)
  double beta_fast = 32, beta_slow = 1;                                                    // yarn: the correction range's rotations
  bool truncate = true;                                                                    // yarn: the range's bounds rounded outwards
  double attention_factor = 1.0;  // cos and sin are multiplied by it (yarn: 0.1·ln(factor) + 1 unless given)
  // Phi-3's partial RoPE: the first int(head_dim · factor) values of each head turn, the rest pass through.
  double partial_rotary_factor = 1.0;
  // longrope: the frequencies divided by short_factor, or by long_factor in a forward whose positions go
  // past original_max_position_embeddings (transformers' per-call choice).
  std::vector<double> short_factor{}, long_factor{};
};

// What a decoder is made of: the architecture tables fill it from config.json.
struct Spec {
  std::string architecture;  // "LlamaForCausalLM", ...
  int64_t vocab = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  int64_t max_positions = 0;  // learned positions: the table's size (a hard limit); RoPE: informative
  NormKind norm = NormKind::rms;
  double norm_eps = 1e-5;
  MlpKind mlp = MlpKind::gated;
  Act act = Act::silu;
  // Gemma: every RMSNorm scales by (norm_offset + weight), the checkpoint's weights being offsets from 1
  // (nn::RMSNormOptions::offset); 0: by the weight.
  double norm_offset = 0;
  double embed_scale = 0;   // Gemma: the embeddings times this (√hidden, rounded to the parameters' dtype); 0: none
  bool post_norms = false;  // Gemma 2/3: an RMSNorm on the attention's and the MLP's outputs before each residual add
  double attn_scalar = 0;   // the scores are scaled by attn_scalar^-1/2 (Gemma 2/3's query_pre_attn_scalar); 0: head_dim
  // Gemma 2: cap · tanh(x / cap) on the attention scores (before the mask; nn::attention's softcap) and
  // on the logits. 0: none.
  double attn_softcap = 0, final_softcap = 0;
  bool qkv_bias = false, o_bias = false, mlp_bias = false;
  bool learned_positions = false;  // GPT-2's wpe; otherwise RoPE
  bool qk_norm = false;            // Qwen3: RMSNorm over each head's q and k (weights [head_dim]) before RoPE
  // Sliding-window attention (transformers' "sliding_attention" layers: Mistral's sliding_window, Qwen's
  // use_sliding_window, Gemma 2/3): in the layers marked, the query at position i sees the keys at
  // positions i - sliding_window + 1 .. i only. 0: no window (the marked layers still take
  // local_inv_freq's RoPE); empty: no sliding layers.
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers{};  // [layers], or empty (then sliding_window must be 0)
  std::vector<double> inv_freq;        // RoPE: [head_dim/2] angular frequencies (theta and scaling applied; 0 past the turned pairs)
  RopeSpec rope;                       // RoPE: what inv_freq was computed from
  // longrope: the frequencies of a forward whose positions reach past rope.original_max_position_embeddings
  // (its largest position + 1 above it); inv_freq holds the others. Empty: inv_freq always.
  std::vector<double> long_inv_freq{};
  // Phi-3 with longrope: nn::generate drops the KV caches and recomputes the sequence when it first grows
  // past this many positions (transformers' Phi3ForCausalLM.prepare_inputs_for_generation), so that every
  // key turns by the long frequencies; 0: never.
  int64_t rebuild_caches_at = 0;
  // Gemma 3: the sliding-window layers' own RoPE ([head_dim/2] frequencies, and their spec); empty: the
  // sliding layers turn by inv_freq too.
  std::vector<double> local_inv_freq{};
  RopeSpec local_rope{};
  bool tie_embeddings = false;  // lm_head is the embedding matrix
  // The embedding's padding_idx (transformers' Llama family: pad_token_id): that row passes no gradient
  // back from the lookups (nn::EmbeddingOptions::padding_idx), as in a full fine-tune with transformers.
  std::optional<int64_t> padding_idx{};
  // The config.json and generation_config.json of the directory the model was read from (null for a
  // Spec made in code): hf::save_pretrained (nn/hf/export.hpp) writes their other fields back.
  std::shared_ptr<const nlohmann::json> source_config, source_generation_config;
};

struct LoadOptions {
  DType dtype = DType::f32;     // the parameters' dtype (the weights are converted from the stored one)
  DType autocast = DType::f32;  // bf16/f16: forward under autocast (matmuls and attention in that dtype)
};

template <Backend B> class DecoderLayer;

template <Backend B> class CausalLM : public nn::Module<B> {
 public:
  CausalLM(Spec s, LoadOptions o = {});
  const Spec& spec() const { return s_; }
  const LoadOptions& options() const { return o_; }

  Var<B> forward(const Tensor<B>& ids) const;
  Var<B> operator()(const Tensor<B>& ids) const { return forward(ids); }
  // With one KV cache per layer: ids hold the positions after the cached ones. `capacity`: the
  // positions the caches are allocated for on their first use (prompt + tokens to generate).
  Var<B> forward(const Tensor<B>& ids, std::vector<nn::KVCache<B>>& caches, int64_t capacity) const;
  // A left-padded batch (batched generation, nn/generate.hpp): each row's positions and a mask that
  // hides the padding (nn::RowInputs).
  Var<B> forward(const Tensor<B>& ids, std::vector<nn::KVCache<B>>& caches, int64_t capacity, const nn::RowInputs<B>& rows) const;
  // The final norm's output [B, T, hidden]: the forward without the LM head (in the autocast dtype).
  Var<B> hidden(const Tensor<B>& ids) const;
  // The mean next-token cross-entropy of forward(ids) against targets [B, T] through
  // nn::linear_cross_entropy (the [B·T, vocab] logits never kept whole); where the head is more than a
  // matrix (Gemma 2's final soft cap, a LoRA adapter on lm_head) through forward and cross_entropy.
  Var<B> loss(const Tensor<B>& ids, const Tensor<B>& targets, nn::LinearCrossEntropyOptions o = {}) const;
  std::vector<nn::KVCache<B>> make_caches() const { return std::vector<nn::KVCache<B>>(static_cast<size_t>(s_.layers)); }
  // The most positions a sequence may have (learned positions); 0: no limit.
  int64_t max_positions() const { return s_.learned_positions ? s_.max_positions : 0; }

  // The RoPE tables (cos, sin [T, head_dim/2], f32) for positions pos0..pos0+T-1, grown on demand; local:
  // the sliding-window layers' (Spec::local_inv_freq; the same as the others' when it is empty). With
  // longrope, the long frequencies' when pos0 + T is past original_max_position_embeddings.
  std::pair<Tensor<B>, Tensor<B>> rope_tables(int64_t pos0, int64_t T, bool local = false) const;
  // Activation checkpointing (autograd/checkpoint.hpp, docs/memory.md): when on, a forward that records
  // (grad mode on, no KV cache) keeps no activations inside the decoder layers (one segment per layer,
  // recomputed in backward under the same autocast dtype). The gradients are the same as without it.
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }
  bool activation_checkpointing() const { return checkpointing_; }

 private:
  Var<B> run(const Tensor<B>& ids, std::vector<nn::KVCache<B>>* caches, int64_t capacity, const nn::RowInputs<B>& rows,
             bool head = true) const;
  Spec s_;
  LoadOptions o_;
  bool checkpointing_ = false;
  std::shared_ptr<nn::Embedding<B>> embed_, pos_embed_;
  std::vector<std::shared_ptr<DecoderLayer<B>>> layers_;
  std::shared_ptr<nn::RMSNorm<B>> rms_;
  std::shared_ptr<nn::LayerNorm<B>> ln_;
  std::shared_ptr<nn::Linear<B>> lm_head_;
  mutable std::mutex rope_mu_;
  mutable Tensor<B> cos_[3], sin_[3];  // [0] inv_freq, [1] local_inv_freq, [2] long_inv_freq
};

// Reads a Hugging Face model directory (formats/hf_dir.hpp) into a CausalLM: the architecture's table
// (config.json -> Spec, checkpoint tensors -> parameters). An unknown architecture, a config field kiln
// does not implement, a missing, extra or mis-shaped tensor is a kiln::Error naming the file, the field
// or the tensor. Tensors are read from the mapped files one at a time, converted to options.dtype.
template <Backend B> KILN_API std::shared_ptr<CausalLM<B>> load_causal_lm(const std::string& dir, const LoadOptions& options = {});
template <Backend B> KILN_API std::shared_ptr<CausalLM<B>> load_causal_lm(const ModelDir& dir, const LoadOptions& options = {});

// The architectures load_causal_lm knows ("GPT2LMHeadModel", ...).
std::vector<std::string> architectures();

#define KILN_EXTERN(B) extern template class CausalLM<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::hf
#pragma GCC visibility pop
