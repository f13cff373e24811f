#pragma once
// The per-architecture tables behind hf::load_causal_lm (nn/hf/causal_lm.hpp): one file per
// architecture (gpt2.cpp, llama.cpp, qwen.cpp, gemma.cpp, phi3.cpp) defines an Architecture: how config.json becomes a
// Spec, and where each parameter of the shared decoder comes from in the checkpoint. Adding an
// architecture is one more file and one line in architecture.cpp's list.
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kiln/nn/hf/causal_lm.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::hf {

// Where one kiln parameter comes from.
struct TensorSource {
  enum class Op {
    copy,       // as stored
    transpose,  // a GPT-2 Conv1D weight, stored [in, out]: transposed to Linear's [out, in]
    rope_rows,  // q_proj/k_proj weight [H·hd, in] or bias [H·hd]: rows (i, i + hd/2) of each head
                // become (2i, 2i+1) (rotate-half RoPE onto kiln's interleaved kernel)
  };
  std::string name;  // the checkpoint's tensor
  Shape shape;       // its shape in the checkpoint, as config.json implies
  Op op = Op::copy;
  int64_t part = 0, parts = 1;  // after op: rows [part·n/parts, (part+1)·n/parts) (GPT-2's fused c_attn)
  // rows > 0: after op, rows [row0, row0 + rows) instead (the parts of different sizes of Phi-3's
  // qkv_proj); part and parts still order the parts (the export concatenates them in that order).
  int64_t row0 = 0, rows = 0;
  int64_t heads = 0;   // rope_rows: the heads of the tensor
  int64_t rotary = 0;  // rope_rows: the rows of each head RoPE turns (partial_rotary_factor), re-ordered; the rest stay; 0: all
};

// The rope_rows re-ordering of a tensor of `heads` heads ([heads·hd, ...] or [heads·hd]): within each
// head's first `rotary` rows (0: all hd), rows (i, i + rotary/2) of the checkpoint (rotate-half) become
// kiln's (2i, 2i + 1) (interleaved pairs); to_kiln false: back.
template <Backend B> KILN_API Tensor<B> rope_rows_order(const Tensor<B>& t, int64_t heads, int64_t rotary, bool to_kiln);

struct Architecture {
  std::string name;  // config.json "architectures"[0]
  // config.json (and the directory) -> the decoder; throws naming the field on anything unsupported.
  std::function<Spec(const ModelDir&)> spec;
  // kiln parameter name -> its source (every parameter of CausalLM(spec), nothing more). The
  // directory is null when exporting (nn/hf/export.hpp reads the same table backwards): then the
  // names transformers' save_pretrained writes.
  std::function<std::map<std::string, TensorSource>(const Spec&, const ModelDir*)> tensors;
  // Checkpoint tensors that are no weights (buffers some exports carry: GPT-2's attn.bias causal
  // mask, rotary_emb.inv_freq), matched as name suffixes; they are skipped.
  std::vector<std::string> ignored_suffixes;
  // The export's config.json: the fields that make spec() read back this Spec ("architectures",
  // "model_type", the sizes, norm, activation, RoPE, tying, biases). nn/hf/export.cpp adds the rest.
  std::function<nlohmann::json(const Spec&)> config;
  // PEFT's default LoRA targets for this model_type (a LoraConfig without target_modules; peft's
  // TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING): nn::default_lora_targets.
  std::vector<std::string> lora_targets;
  // Checkpoint tensors of parts kiln does not build (a multimodal model's vision tower), matched as name
  // prefixes; they are skipped.
  std::vector<std::string> ignored_prefixes{};
  // Non-empty: why hf::save_pretrained and LoRA refuse this architecture (kiln holds part of the model).
  std::string read_only{};
};

const Architecture* find_architecture(const std::string& name);

namespace detail {
// Strict reading of config.json: each field an architecture reads is asked for by name; finish()
// rejects whatever key is left that is neither read nor in the list of fields with no effect on the
// math (names, dropout, generation defaults, ...), naming the file and the field.
class ConfigReader {
 public:
  explicit ConfigReader(const ModelDir& d);
  // The object config.json[sub] (a multimodal model's "text_config"), named so in errors.
  ConfigReader(const ModelDir& d, const std::string& sub);
  // A required integer / number / string, or an optional one (returns def when absent or null).
  int64_t integer(const std::string& key);
  int64_t integer(const std::string& key, int64_t def);
  double number(const std::string& key);
  double number(const std::string& key, double def);
  std::string string(const std::string& key, const std::string& def);
  bool boolean(const std::string& key, bool def);
  const nlohmann::json* raw(const std::string& key);     // null when absent or null; marks it read
  void accept(std::initializer_list<const char*> keys);  // fields this architecture knows change nothing
  [[noreturn]] void unsupported(const std::string& key, const std::string& why) const;
  void finish() const;
  const std::string& path() const { return path_; }
  const nlohmann::json& json() const;

 private:
  const ModelDir& d_;
  const nlohmann::json* sub_ = nullptr;
  std::string path_;
  std::set<std::string> read_;
};

// RoPE of a Llama-family config, both spellings: transformers 4.x ("rope_theta" and "rope_scaling" at
// the top level) and 5.x ("rope_parameters": {"rope_type", "rope_theta", ...}). rope types:
// "default", "linear", "llama3"; anything else is an error naming the field.
// max_positions: max_position_embeddings (yarn's original_max_position_embeddings when absent).
// What an architecture's config class changes in reading RoPE.
struct RopeRules {
  std::map<std::string, std::string> aliases{};  // rope types it renames (Phi3Config: "su" and "yarn" are "longrope")
  // > 0: original_max_position_embeddings of llama3, yarn and longrope, whatever the RoPE object says
  // (transformers takes a config's top-level field first: Phi-3's, 4096 by default)
  std::optional<double> original_max_positions{};
};
RopeSpec read_rope(ConfigReader& c, double default_theta, int64_t max_positions, const RopeRules& rules = {});
// One RoPE parameter object p (rope_type and its fields; `field` names it in errors) over r, whose theta
// is the default when p has no rope_theta.
void read_rope_params(ConfigReader& c, const nlohmann::json& p, const std::string& field, RopeSpec& r, int64_t max_positions,
                      const RopeRules& rules = {});
// The values of each head RoPE turns: int(head_dim · partial_rotary_factor), as transformers (even, > 0).
int64_t rotary_dim(const RopeSpec& r, int64_t head_dim);
// The angular frequencies [head_dim/2] of a RoPE spec, as transformers computes them (in f32) over the
// rotary_dim turned values; the pairs past them (partial RoPE) get 0.
std::vector<double> rope_inv_freq(const RopeSpec& r, int64_t head_dim);
// longrope's frequencies past original_max_position_embeddings (long_factor's); empty for other types.
std::vector<double> rope_long_inv_freq(const RopeSpec& r, int64_t head_dim);
// The transformers 4.x spelling of a RoPE spec: config["rope_theta"] and config["rope_scaling"].
void write_rope(const RopeSpec& r, nlohmann::json& config);

// An activation as transformers' ACT2FN names it (config[key], def when absent): gelu_new and
// gelu_pytorch_tanh (gelu_tanh), gelu, relu, silu and swish; anything else is an error naming the field.
Act read_act(ConfigReader& c, const std::string& key, const std::string& def);
// The name transformers reads back for an activation.
const char* act_name(Act a);
// config[key] for the export: the source config's spelling when it means s.act (gelu_is_tanh: Gemma 1,
// whose "gelu" is the tanh GELU), else act_name.
std::string act_spelling(const Spec& s, const std::string& key, bool gelu_is_tanh = false);

Architecture gpt2_architecture();
Architecture llama_architecture(const std::string& name);  // LlamaForCausalLM, MistralForCausalLM
Architecture qwen2_architecture();
Architecture qwen3_architecture();
Architecture gemma_architecture(const std::string& name);  // GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM
Architecture phi3_architecture();
Architecture gemma3_multimodal_architecture();  // Gemma3ForConditionalGeneration: its text model only
// What the Llama family's config classes assume for fields a config.json leaves out.
struct FamilyDefaults {
  int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  int64_t kv_heads = 0;  // num_key_value_heads when absent (0: num_attention_heads, as when null)
  int64_t max_positions = 2048;
  const char* act_field = "hidden_act";  // the field transformers' MLP reads
  const char* act = "silu";
  bool tie_embeddings = false;
  double rope_theta = 10000.0;
  bool rope = true;             // false: the caller reads RoPE (Gemma 3's per-layer-type parameters)
  bool partial_rotary = false;  // partial_rotary_factor may be below 1 (Phi-3; transformers' other decoders ignore it)
  RopeRules rope_rules{};
};
// The Llama family's config fields and tensor names (nn/hf/llama.cpp; Llama, Mistral, Qwen2, Qwen3, Gemma).
Spec llama_family_spec(ConfigReader& c, const ModelDir& d, const FamilyDefaults& def = {});
std::map<std::string, TensorSource> llama_family_tensors(const Spec& s, const ModelDir* d);
nlohmann::json llama_family_config(const Spec& s, const char* model_type);
// config.json's sliding_window as Mistral's and Qwen's config classes read it: absent 4096 (their
// default), null none (nullopt), else the integer (not checked further).
std::optional<int64_t> sliding_window_field(ConfigReader& c);
// config.json's layer_types for Spec::sliding_layers ("sliding_attention" / "full_attention").
nlohmann::json layer_types_field(const Spec& s);
}  // namespace detail

}  // namespace kiln::hf
#pragma GCC visibility pop
