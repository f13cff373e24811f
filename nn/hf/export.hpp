#pragma once
// The way back to Hugging Face: a kiln model written as a transformers model directory.
//
//   auto model = kiln::hf::load_causal_lm<Cpu>("in_dir");          // or a kiln-native nn::GPT
//   kiln::hf::save_pretrained(*model, "out_dir", {.dtype = DType::bf16});
//
// What is written (formats/hf_dir.hpp): config.json, generation_config.json, model.safetensors (or
// model-0000i-of-0000n.safetensors shards and model.safetensors.index.json above max_shard_bytes, as
// transformers' save_pretrained(max_shard_size=...) does), every safetensors file with {"format": "pt"}
// metadata, and the tokenizer files of options.tokenizer_from.
//
// The tensors come from the same per-architecture tables the import reads (nn/hf/architecture.hpp),
// read backwards: q/k rows re-ordered back to rotate-half RoPE, GPT-2's q, k, v fused again into
// c_attn and its Conv1D weights stored [in, out]. A model imported by load_causal_lm and saved in its
// stored dtype gives the checkpoint's tensors bit for bit (names, dtypes, shapes, bytes) and a
// config.json that reads back as the same model: its math fields are written from the Spec, its other
// fields (token ids, names, dropout, ...) copied from the source's config.json, and the source's
// generation_config.json is copied as is.
//
// A kiln-native GPT (nn/gpt.hpp) exports as LlamaForCausalLM when it has the Llama shape: MHA with GQA,
// standard residuals and RoPE (kiln's GPT is always RMSNorm, SwiGLU, no biases). Differential
// attention, attention residuals and a GPT without RoPE have no Hugging Face architecture: each is a
// kiln::Error naming the option. kiln's GPT cannot express GPT-2 (LayerNorm, GELU MLP, learned
// positions, biases), so nothing exports as GPT2LMHeadModel from it; imported GPT-2 models do.
//
// The directory is written under a temporary name next to DIR, read back (config.json through the
// import's own reader, which must give the model's Spec; every safetensors file validated) and only
// then renamed to DIR: on any error nothing is left behind, and an existing DIR is untouched. An
// existing non-empty DIR is an error unless options.overwrite.
#include <cstdint>
#include <optional>
#include <string>

#include "kiln/nn/gpt.hpp"
#include "kiln/nn/hf/causal_lm.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::hf {

struct ExportOptions {
  DType dtype = DType::f32;  // the stored dtype: f32, bf16 or f16 (converted from the parameters')
  // Shard above this many bytes of weights per file (transformers' max_shard_size); 0: one file.
  int64_t max_shard_bytes = 5'000'000'000;
  // A directory whose tokenizer files (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
  // tokenizer.model, vocab.json, merges.txt, added_tokens.json) are copied; it must hold at least one.
  std::string tokenizer_from = {};
  bool overwrite = false;  // replace an existing non-empty DIR
  // config.json / generation_config.json token ids for a model with no source config (kiln-native).
  std::optional<int64_t> bos_token_id = {}, eos_token_id = {};
};

// An imported model (or a CausalLM built from a Spec) as the Hugging Face architecture of its Spec.
template <Backend B> KILN_API void save_pretrained(const CausalLM<B>& model, const std::string& dir, const ExportOptions& options = {});
// A kiln-native GPT as LlamaForCausalLM (see above for what cannot export).
template <Backend B> KILN_API void save_pretrained(const nn::GPT<B>& model, const std::string& dir, const ExportOptions& options = {});

// The LlamaForCausalLM Spec of a kiln GPT configuration; a kiln::Error naming each option that has no
// Hugging Face equivalent.
Spec llama_spec_of(const ModelConfig& config);

// "2GB", "500MB", "20KB" (powers of 10), "1GiB", "10MiB", "4KiB" (powers of 2) or a plain number of
// bytes, as transformers' max_shard_size reads them; anything else is an error naming the text.
int64_t parse_byte_size(const std::string& text);

// Whether DIR holds a tokenizer file that ExportOptions::tokenizer_from copies (tokenizer.json,
// tokenizer.model, vocab.json, ...).
bool has_tokenizer_files(const std::string& dir);

// A kiln::Error unless save_pretrained can write a model of this Spec's architecture (one kiln reads in
// part, a multimodal checkpoint's text model, cannot be): checked before work that would end in writing it.
void require_writable(const Spec& s);

}  // namespace kiln::hf
#pragma GCC visibility pop
