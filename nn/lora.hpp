#pragma once
// LoRA (Hu et al. 2021) on any Linear of any kiln model, in PEFT's layout (docs/lora.md).
//
//   auto model = kiln::hf::load_causal_lm<Cpu>("llama_dir");
//   nn::apply_lora(*model, {.r = 8, .alpha = 16, .target_modules = {"q_proj", "v_proj"}});
//   ... train model->named_parameters() (only the adapters require grad) ...
//   nn::save_lora(*model, "adapter_dir");   // adapter_model.safetensors + adapter_config.json
//   nn::merge_lora(*model);                  // W += scaling·B·A; plain Linears again
//
// A wrapped Linear computes y = x Wᵀ + b + scaling · lora_B(lora_A(dropout(x))), lora_A [r, in]
// (kaiming-uniform, a = √5, as PEFT), lora_B [out, r] (zeros), scaling = alpha / r (alpha / √r with
// use_rslora). Every other parameter of the model is frozen (requires_grad false), so backward computes
// no gradient for it and an optimizer keeps no state for it.
//
// Names. A module's "PEFT path" is the path PEFT sees: for a model from hf::load_causal_lm, the Hugging
// Face module ("model.layers.0.self_attn.q_proj", "transformer.h.0.mlp.c_fc"); for any other model, the
// kiln path ("layers.0.attn.q_proj"). Patterns match PEFT paths: a name without wildcards matches the
// path or its last dotted components (PEFT's rule: "q_proj", "self_attn.q_proj"); a glob ("*.mlp.*",
// '*' and '?') matches the whole path; target_regex is PEFT's string form (a regex in Python's syntax,
// which PCRE2 reads; a full match). In kiln the adapter's parameters are "<kiln path>.lora_A.weight" /
// ".lora_B.weight"; in the saved file they are "base_model.model.<PEFT path>.lora_A.weight" /
// ".lora_B.weight", as PEFT writes them.
//
// Imported models: the adapter follows the checkpoint layout PEFT sees. Llama-family q_proj/k_proj
// rows are re-ordered on import (nn/hf/causal_lm.hpp), so lora_B's rows are re-ordered the same way on
// load and back on save. GPT-2's Conv1D modules (c_proj, c_fc) are fan_in_fan_out in PEFT: the adapter
// shapes are the same ([r, in], [out, r]). GPT-2's fused c_attn is three Linears in kiln (q, k, v);
// PEFT puts one adapter on it (lora_A [r, D], lora_B [3D, r]): kiln registers both under q_proj
// (layers.i.attn.q_proj.lora_A/lora_B.weight) and k_proj/v_proj use rows D..2D and 2D..3D of lora_B,
// so the math, the gradients and the saved file are PEFT's (with dropout, each of the three draws its
// own mask where PEFT draws one).
#include <memory>
#include <string>
#include <vector>

#include "kiln/nn/linear.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

struct LoraOptions {
  int64_t r = 8;
  double alpha = 8.0;
  double dropout = 0.0;
  // Names or globs (see above), or PEFT's regex string (full match); not both. Neither: the model's
  // default_lora_targets, as PEFT's LoraConfig without target_modules.
  std::vector<std::string> target_modules{};
  std::string target_regex{};
  std::string bias = "none";              // the only one implemented: biases stay frozen
  bool use_rslora = false;                // scaling alpha/√r instead of alpha/r
  std::string base_model_name_or_path{};  // written to adapter_config.json
};

// One LoRA-wrapped Linear.
template <Backend B> class LoraAdapter : public LinearAdapter<B> {
 public:
  LoraAdapter(const LoraOptions& o, int64_t in, int64_t out, DType dtype, std::string peft_path);
  Var<B> forward(const Var<B>& x) const override;

  const LoraOptions& options() const { return o_; }
  double scaling() const { return scaling_; }
  const std::string& peft_path() const { return peft_path_; }
  // lora_A [r, in] and lora_B [out, r] (a part of a fused module: its owner's, the fused module's [Σ out, r]).
  Linear<B>& lora_A() const { return owner_ ? owner_->lora_A() : *a_; }
  Linear<B>& lora_B() const { return owner_ ? owner_->lora_B() : *b_; }
  std::shared_ptr<Module<B>> dropout_module() const { return drop_; }
  // Imported Llama q/k_proj: the heads whose rows were re-ordered on import (0: none), and the rows of
  // each head that were (hf::rope_rows_order; 0: all).
  int64_t rope_heads = 0, rope_rotary = 0;
  bool fan_in_fan_out = false;  // a GPT-2 Conv1D in PEFT
  // A slice of a fused module (GPT-2's c_attn, Phi-3's qkv_proj and gate_up_proj): rows [row0, row0 +
  // rows) of the owner's lora_B (the adapter of part 0, which holds lora_A and the whole lora_B; owner()
  // is null there). The parts may differ in size and have RoPE rows of their own (q and k of a qkv_proj).
  int64_t part = 0, parts = 1, row0 = 0, rows = 0;
  void share(std::shared_ptr<LoraAdapter> owner, int64_t part_index, int64_t part_count);
  const LoraAdapter* owner() const { return owner_.get(); }

 private:
  LoraOptions o_;
  double scaling_;
  std::string peft_path_;
  std::shared_ptr<Linear<B>> a_, b_;
  std::shared_ptr<Module<B>> drop_;
  std::shared_ptr<LoraAdapter> owner_;
};

// PEFT's default targets for the model: for one from hf::load_causal_lm its model_type's (GPT-2:
// c_attn; Llama, Mistral, Qwen2, Qwen3, Gemma 1-3: q_proj, v_proj; Phi-3 has none: a kiln::Error asking for
// target_modules, as PEFT raises), for any other model q_proj, v_proj (kiln's attention).
template <Backend B> KILN_API std::vector<std::string> default_lora_targets(const Module<B>& model);

// Wraps every Linear whose PEFT path matches, freezes every other parameter, and returns the kiln paths
// of the wrapped modules. Errors (naming the patterns or the module path): no match, a match that is
// not a Linear (a parent module: matching "*.mlp" is; use "*.mlp.*"), a Linear wrapped already, r < 1,
// dropout outside [0, 1), bias other than "none", a fused module matched in part.
template <Backend B> KILN_API std::vector<std::string> apply_lora(Module<B>& model, const LoraOptions& o);

// The wrapped Linears: kiln path -> adapter.
template <Backend B> KILN_API std::vector<std::pair<std::string, LoraAdapter<B>*>> lora_adapters(const Module<B>& model);

// The adapters' tensors under PEFT's saved names, in PEFT's layout.
template <Backend B> KILN_API std::vector<std::pair<std::string, Tensor<B>>> lora_state_dict(const Module<B>& model);

// DIR/adapter_model.safetensors + DIR/adapter_config.json (created; DIR is made if missing).
template <Backend B> KILN_API void save_lora(const Module<B>& model, const std::string& dir);

// Reads DIR/adapter_config.json, applies it (apply_lora) and loads DIR/adapter_model.safetensors.
// A config field kiln does not implement, a missing, extra or mis-shaped tensor is an error naming it.
template <Backend B> KILN_API std::vector<std::string> load_lora(Module<B>& model, const std::string& dir);

// The options an adapter_config.json holds (the PEFT fields kiln implements).
KILN_API LoraOptions read_lora_config(const std::string& path);

// W += scaling · B·A for every wrapped Linear, then removes the adapters: the state dict has the base
// names only. The base parameters stay frozen (requires_grad_(true) on the model to train them).
template <Backend B> KILN_API void merge_lora(Module<B>& model);

}  // namespace kiln::nn
#pragma GCC visibility pop
