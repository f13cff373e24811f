#include "kiln/nn/hf/architecture.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kiln::hf {

namespace {
const std::vector<Architecture>& registry() {
  static const std::vector<Architecture> all = {detail::gpt2_architecture(),
                                                detail::llama_architecture("LlamaForCausalLM"),
                                                detail::llama_architecture("MistralForCausalLM"),
                                                detail::qwen2_architecture(),
                                                detail::qwen3_architecture(),
                                                detail::gemma_architecture("GemmaForCausalLM"),
                                                detail::gemma_architecture("Gemma2ForCausalLM"),
                                                detail::gemma_architecture("Gemma3ForCausalLM"),
                                                detail::phi3_architecture(),
                                                detail::gemma3_multimodal_architecture()};
  return all;
}

// config.json fields of every transformers config that do not change a forward pass: names, versions,
// token ids, generation defaults (generate() reads generation_config.json), dropout (inference),
// output switches, task heads kiln does not build.
const char* const kNoEffect[] = {"_attn_implementation_autoset",
                                 "_name_or_path",
                                 "_commit_hash",
                                 "architectures",
                                 "bad_words_ids",
                                 "begin_suppress_tokens",
                                 "bos_token_id",
                                 "chunk_size_feed_forward",
                                 "cross_attention_hidden_size",
                                 "decoder_start_token_id",
                                 "diversity_penalty",
                                 "do_sample",
                                 "early_stopping",
                                 "encoder_no_repeat_ngram_size",
                                 "eos_token_id",
                                 "exponential_decay_length_penalty",
                                 "finetuning_task",
                                 "forced_bos_token_id",
                                 "forced_eos_token_id",
                                 "id2label",
                                 "initializer_range",
                                 "is_decoder",
                                 "label2id",
                                 "length_penalty",
                                 "max_length",
                                 "min_length",
                                 "model_type",
                                 "no_repeat_ngram_size",
                                 "num_beam_groups",
                                 "num_beams",
                                 "num_return_sequences",
                                 "output_attentions",
                                 "output_hidden_states",
                                 "output_scores",
                                 "pad_token_id",
                                 "prefix",
                                 "problem_type",
                                 "remove_invalid_values",
                                 "repetition_penalty",
                                 "return_dict",
                                 "return_dict_in_generate",
                                 "sep_token_id",
                                 "suppress_tokens",
                                 "task_specific_params",
                                 "temperature",
                                 "tf_legacy_loss",
                                 "tie_encoder_decoder",
                                 "tokenizer_class",
                                 "top_k",
                                 "top_p",
                                 "torch_dtype",
                                 "dtype",
                                 "torchscript",
                                 "transformers_version",
                                 "typical_p",
                                 "use_bfloat16",
                                 "use_cache",
                                 "attention_dropout",
                                 "gradient_checkpointing"};
}  // namespace

const Architecture* find_architecture(const std::string& name) {
  for (const Architecture& a : registry())
    if (a.name == name) return &a;
  return nullptr;
}

std::vector<std::string> architectures() {
  std::vector<std::string> out;
  for (const Architecture& a : registry()) out.push_back(a.name);
  return out;
}

namespace detail {

ConfigReader::ConfigReader(const ModelDir& d) : d_(d), path_(d.config_path()) {
  for (const char* k : kNoEffect) read_.insert(k);
  // Generic fields that would change the model if set: they must hold their defaults.
  if (const auto* v = raw("is_encoder_decoder"))
    if (!(v->is_boolean() && !v->get<bool>())) unsupported("is_encoder_decoder", "an encoder-decoder is no causal LM");
  if (const auto* v = raw("add_cross_attention"))
    if (!(v->is_boolean() && !v->get<bool>())) unsupported("add_cross_attention", "cross-attention layers are not built");
  if (const auto* v = raw("pruned_heads"))
    if (!(v->is_object() && v->empty())) unsupported("pruned_heads", "pruned attention heads are not supported");
}

ConfigReader::ConfigReader(const ModelDir& d, const std::string& sub) : ConfigReader(d) {
  const auto it = d.config().find(sub);
  KILN_CHECK(it != d.config().end() && it->is_object(), "{}: field '{}' must be an object (the {} of {}), got {}", d.config_path(), sub,
             sub, d.architecture(), it == d.config().end() ? std::string("nothing") : it->dump());
  sub_ = &*it;
  path_ = fmt::format("{} ({})", d.config_path(), sub);
}

const nlohmann::json& ConfigReader::json() const { return sub_ ? *sub_ : d_.config(); }

const nlohmann::json* ConfigReader::raw(const std::string& key) {
  read_.insert(key);
  const auto it = json().find(key);
  return it == json().end() || it->is_null() ? nullptr : &*it;
}

int64_t ConfigReader::integer(const std::string& key) {
  const auto* v = raw(key);
  KILN_CHECK(v != nullptr, "{}: field '{}' is required", path_, key);
  KILN_CHECK(v->is_number_integer(), "{}: field '{}' must be an integer, got {}", path_, key, v->dump());
  return v->get<int64_t>();
}
int64_t ConfigReader::integer(const std::string& key, int64_t def) { return raw(key) ? integer(key) : def; }
double ConfigReader::number(const std::string& key) {
  const auto* v = raw(key);
  KILN_CHECK(v != nullptr, "{}: field '{}' is required", path_, key);
  KILN_CHECK(v->is_number(), "{}: field '{}' must be a number, got {}", path_, key, v->dump());
  return v->get<double>();
}
double ConfigReader::number(const std::string& key, double def) { return raw(key) ? number(key) : def; }
std::string ConfigReader::string(const std::string& key, const std::string& def) {
  const auto* v = raw(key);
  if (!v) return def;
  KILN_CHECK(v->is_string(), "{}: field '{}' must be a string, got {}", path_, key, v->dump());
  return v->get<std::string>();
}
bool ConfigReader::boolean(const std::string& key, bool def) {
  const auto* v = raw(key);
  if (!v) return def;
  KILN_CHECK(v->is_boolean(), "{}: field '{}' must be true or false, got {}", path_, key, v->dump());
  return v->get<bool>();
}
void ConfigReader::accept(std::initializer_list<const char*> keys) {
  for (const char* k : keys) read_.insert(k);
}
void ConfigReader::unsupported(const std::string& key, const std::string& why) const {
  const auto it = json().find(key);
  fail("{}: field '{}' = {}: {} ({} in kiln)", path_, key, it == json().end() ? std::string("(absent)") : it->dump(), why,
       d_.architecture());
}
void ConfigReader::finish() const {
  for (auto it = json().begin(); it != json().end(); ++it)
    KILN_CHECK(read_.count(it.key()) != 0,
               "{}: field '{}' = {} is not one kiln implements for {}; it may change the model's math, so kiln stops rather than ignore it",
               path_, it.key(), it.value().dump(), d_.architecture());
}

namespace {
std::optional<Act> act_of(const std::string& act) {
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") return Act::gelu_tanh;
  if (act == "gelu") return Act::gelu;
  if (act == "relu") return Act::relu;
  if (act == "silu" || act == "swish") return Act::silu;
  return std::nullopt;
}
}  // namespace

Act read_act(ConfigReader& c, const std::string& key, const std::string& def) {
  const auto a = act_of(c.string(key, def));
  if (!a) c.unsupported(key, "kiln has gelu_new, gelu_pytorch_tanh, gelu, relu, silu and swish");
  return *a;
}

std::string act_spelling(const Spec& s, const std::string& key, bool gelu_is_tanh) {
  if (s.source_config) {
    const auto it = s.source_config->find(key);
    if (it != s.source_config->end() && it->is_string()) {
      std::optional<Act> a = act_of(it->get<std::string>());
      if (gelu_is_tanh && a == Act::gelu) a = Act::gelu_tanh;
      if (a == s.act) return it->get<std::string>();
    }
  }
  return act_name(s.act);
}

const char* act_name(Act a) {
  switch (a) {
    case Act::gelu_tanh:
      return "gelu_pytorch_tanh";
    case Act::gelu:
      return "gelu";
    case Act::relu:
      return "relu";
    case Act::silu:
      return "silu";
  }
  fail("hf: unknown activation");
}

RopeSpec read_rope(ConfigReader& c, double default_theta, int64_t max_positions, const RopeRules& rules) {
  // transformers 5.x: "rope_parameters": {"rope_type": ..., "rope_theta": ..., scaling fields}
  // transformers 4.x: "rope_theta" and "rope_scaling": {"rope_type" (or "type"): ..., scaling fields}
  const nlohmann::json* params = c.raw("rope_parameters");
  const nlohmann::json* scaling = c.raw("rope_scaling");
  const bool top_theta = c.raw("rope_theta") != nullptr;
  RopeSpec r;
  r.theta = top_theta ? c.number("rope_theta") : default_theta;
  const std::string field = params ? "rope_parameters" : "rope_scaling";
  const nlohmann::json* p = params ? params : scaling;
  KILN_CHECK(!(params && scaling),
             "{}: both 'rope_parameters' (transformers 5) and 'rope_scaling' (transformers 4) are set; which one holds?", c.path());
  if (p) {
    KILN_CHECK(p->is_object(), "{}: field '{}' must be an object or null, got {}", c.path(), field, p->dump());
    const double top = r.theta;
    read_rope_params(c, *p, field, r, max_positions, rules);
    if (p->contains("rope_theta") && !(*p)["rope_theta"].is_null()) {
      KILN_CHECK(params, "{}: 'rope_scaling.rope_theta' is not a transformers 4 field (rope_theta is top level)", c.path());
      KILN_CHECK(!top_theta || top == r.theta, "{}: 'rope_theta' ({}) and 'rope_parameters.rope_theta' ({}) disagree", c.path(), top,
                 r.theta);
    }
  }
  KILN_CHECK(r.theta > 0, "{}: rope_theta must be positive, got {}", c.path(), r.theta);
  return r;
}

void read_rope_params(ConfigReader& c, const nlohmann::json& p, const std::string& field, RopeSpec& r, int64_t max_positions,
                      const RopeRules& rules) {
  KILN_CHECK(p.is_object(), "{}: field '{}' must be an object, got {}", c.path(), field, p.dump());
  const std::string top = field.substr(0, field.find('.'));  // the config.json field it is in
  for (const char* k : {"rope_type", "type"}) {              // an unknown type first, whatever its fields
    if (!p.contains(k) || p[k].is_null()) continue;
    KILN_CHECK(p[k].is_string(), "{}: '{}.{}' must be a string, got {}", c.path(), field, k, p[k].dump());
    const auto alias = rules.aliases.find(p[k].get<std::string>());
    const std::string type = alias != rules.aliases.end() ? alias->second : p[k].get<std::string>();
    if (type != "default" && type != "linear" && type != "llama3" && type != "yarn" && type != "longrope")
      c.unsupported(top, fmt::format("rope type \"{}\" is not implemented (kiln has default, linear, llama3, yarn, longrope)", type));
  }
  // longrope's two lists of per-frequency factors
  std::map<std::string, std::vector<double>> lists;
  for (const char* k : {"short_factor", "long_factor"}) {
    if (!p.contains(k) || p[k].is_null()) continue;
    KILN_CHECK(p[k].is_array() && std::all_of(p[k].begin(), p[k].end(), [](const nlohmann::json& x) { return x.is_number(); }),
               "{}: '{}.{}' must be a list of numbers, got {}", c.path(), field, k, p[k].dump());
    lists[k] = p[k].get<std::vector<double>>();
  }
  std::map<std::string, double> num;
  for (auto it = p.begin(); it != p.end(); ++it) {
    const std::string& k = it.key();
    if (k == "rope_type" || k == "type") {
      KILN_CHECK(it->is_string(), "{}: '{}.{}' must be a string, got {}", c.path(), field, k, it->dump());
      const auto alias = rules.aliases.find(it->get<std::string>());
      r.type = alias != rules.aliases.end() ? alias->second : it->get<std::string>();
    } else if (lists.count(k)) {
      continue;
    } else if (k == "truncate") {  // yarn's: read below
      KILN_CHECK(it->is_boolean() || it->is_null(), "{}: '{}.truncate' must be true or false, got {}", c.path(), field, it->dump());
    } else if (it->is_null()) {
      continue;
    } else {
      KILN_CHECK(it->is_number(),
                 "{}: '{}.{}' must be a number, got {} (kiln reads {}.rope_type, rope_theta, factor, low_freq_factor, "
                 "high_freq_factor, original_max_position_embeddings; yarn: beta_fast, beta_slow, mscale, mscale_all_dim, "
                 "attention_factor, truncate)",
                 c.path(), field, k, it->dump(), field);
      num[k] = it->get<double>();
    }
  }
  if (num.count("rope_theta")) {
    r.theta = num["rope_theta"];
    num.erase("rope_theta");
  }
  if (num.count("partial_rotary_factor")) {  // transformers 5 keeps Phi-3's here (the decoders that take it check it)
    r.partial_rotary_factor = num["partial_rotary_factor"];
    num.erase("partial_rotary_factor");
  }
  KILN_CHECK(r.theta > 0, "{}: '{}.rope_theta' must be positive, got {}", c.path(), field, r.theta);
  auto take = [&](const char* k) {
    const auto it = num.find(k);
    KILN_CHECK(it != num.end(), "{}: '{}' of rope type \"{}\" needs '{}'", c.path(), field, r.type, k);
    const double v = it->second;
    num.erase(it);
    return v;
  };
  if (r.type == "default") {
  } else if (r.type == "linear") {
    r.factor = take("factor");
  } else if (r.type == "llama3") {
    r.factor = take("factor");
    r.low_freq_factor = take("low_freq_factor");
    r.high_freq_factor = take("high_freq_factor");
    r.original_max_position_embeddings = take("original_max_position_embeddings");
    if (rules.original_max_positions) r.original_max_position_embeddings = *rules.original_max_positions;
  } else if (r.type == "longrope") {  // transformers' _compute_longrope_parameters (5.x)
    KILN_CHECK(lists.count("short_factor") && lists.count("long_factor"),
               "{}: '{}' of rope type \"longrope\" needs short_factor and long_factor", c.path(), field);
    r.short_factor = lists["short_factor"];
    r.long_factor = lists["long_factor"];
    r.original_max_position_embeddings =
        num.count("original_max_position_embeddings") ? take("original_max_position_embeddings") : static_cast<double>(max_positions);
    if (rules.original_max_positions) r.original_max_position_embeddings = *rules.original_max_positions;
    KILN_CHECK(r.original_max_position_embeddings > 0,
               "{}: '{}' of rope type \"longrope\" needs a positive original_max_position_embeddings, got {}", c.path(), field,
               r.original_max_position_embeddings);
    for (const auto& [name, f] : lists)
      KILN_CHECK(std::all_of(f.begin(), f.end(), [](double x) { return x > 0 && std::isfinite(x); }),
                 "{}: '{}.{}' must hold positive factors, got {}", c.path(), field, name, p[name].dump());
    r.factor = num.count("factor") ? take("factor") : static_cast<double>(max_positions) / r.original_max_position_embeddings;
    const double derived = r.factor <= 1 ? 1.0 : std::sqrt(1 + std::log(r.factor) / std::log(r.original_max_position_embeddings));
    r.attention_factor = num.count("attention_factor") ? take("attention_factor") : derived;
  } else if (r.type == "yarn") {  // transformers' _compute_yarn_parameters (5.x)
    // As transformers: original_max_position_embeddings defaults to max_position_embeddings, and a
    // factor that is null or absent to max_position_embeddings / original_max_position_embeddings.
    r.original_max_position_embeddings =
        num.count("original_max_position_embeddings") ? take("original_max_position_embeddings") : static_cast<double>(max_positions);
    if (rules.original_max_positions) r.original_max_position_embeddings = *rules.original_max_positions;
    r.factor = num.count("factor") ? take("factor") : static_cast<double>(max_positions) / r.original_max_position_embeddings;
    KILN_CHECK(r.factor > 0 && r.original_max_position_embeddings > 0,
               "{}: '{}' of rope type \"yarn\" needs a positive factor and original_max_position_embeddings, got {} and {}", c.path(),
               field, r.factor, r.original_max_position_embeddings);
    const auto optional = [&](const char* k, double def) { return num.count(k) ? take(k) : def; };
    // beta_fast/beta_slow of 0 mean the defaults too (transformers: `... or 32`).
    if (const double v = optional("beta_fast", 0); v != 0) r.beta_fast = v;
    if (const double v = optional("beta_slow", 0); v != 0) r.beta_slow = v;
    const auto mscale = [&](double m) { return r.factor <= 1 ? 1.0 : 0.1 * m * std::log(r.factor) + 1.0; };
    const double m = optional("mscale", 0), m_all = optional("mscale_all_dim", 0);
    r.attention_factor = optional("attention_factor", m != 0 && m_all != 0 ? mscale(m) / mscale(m_all) : mscale(1));
    if (p.contains("truncate") && !p["truncate"].is_null()) r.truncate = p["truncate"].get<bool>();
  } else {
    KILN_CHECK(r.type == "default", "{}: rope type \"{}\"", c.path(), r.type);  // the others are refused above
  }
  if (!num.empty()) c.unsupported(top, fmt::format("'{}' does not apply to rope type \"{}\"", num.begin()->first, r.type));
  if (r.type != "longrope" && !lists.empty())
    c.unsupported(top, fmt::format("'{}' does not apply to rope type \"{}\"", lists.begin()->first, r.type));
  if (r.type != "yarn" && p.contains("truncate") && !p["truncate"].is_null())
    c.unsupported(top, fmt::format("'truncate' does not apply to rope type \"{}\"", r.type));
}

namespace {
// The frequencies over `head_dim` turned values.
std::vector<double> inv_freq_over(const RopeSpec& r, int64_t head_dim) {
  std::vector<double> inv(static_cast<size_t>(head_dim / 2));
  for (int64_t k = 0; k < head_dim / 2; ++k)  // transformers computes these in f32
    inv[static_cast<size_t>(k)] = static_cast<float>(1.0 / std::pow(r.theta, static_cast<double>(2 * k) / static_cast<double>(head_dim)));
  if (r.type == "linear") {
    for (double& f : inv) f = static_cast<float>(f / r.factor);
  } else if (r.type == "llama3") {
    const double factor = r.factor, lo = r.low_freq_factor, hi = r.high_freq_factor, old_ctx = r.original_max_position_embeddings;
    const double lo_wavelen = old_ctx / lo, hi_wavelen = old_ctx / hi;
    for (double& f : inv) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen > lo_wavelen) {
        f = f / factor;
      } else if (!(wavelen < hi_wavelen)) {  // between: interpolate
        const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
        f = (1 - smooth) * f / factor + smooth * f;
      }
      f = static_cast<float>(f);
    }
  } else if (r.type == "yarn") {  // in f32 as transformers: interpolated frequencies below the ramp, the original above
    const int64_t dim = head_dim;
    const auto correction_dim = [&](double rotations) {
      return static_cast<double>(dim) * std::log(r.original_max_position_embeddings / (rotations * 2 * M_PI)) / (2 * std::log(r.theta));
    };
    double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
    if (r.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;  // no zero-width ramp
    for (int64_t k = 0; k < dim / 2; ++k) {
      const float pos = std::pow(static_cast<float>(r.theta), static_cast<float>(2 * k) / static_cast<float>(dim));
      const float extrapolation = 1.0f / pos, interpolation = 1.0f / (static_cast<float>(r.factor) * pos);
      const float ramp = std::clamp((static_cast<float>(k) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f, 1.0f);
      const float keep = 1.0f - ramp;  // the share of the original frequency
      inv[static_cast<size_t>(k)] = interpolation * (1.0f - keep) + extrapolation * keep;
    }
  } else {
    KILN_CHECK(r.type == "default", "hf: rope type \"{}\" is not implemented (kiln has default, linear, llama3, yarn)", r.type);
  }
  return inv;
}

// [head_dim/2]: the frequencies over the turned values, 0 for the pairs after them.
std::vector<double> padded(const std::vector<double>& inv, int64_t head_dim) {
  std::vector<double> full(static_cast<size_t>(head_dim / 2), 0.0);
  std::copy(inv.begin(), inv.end(), full.begin());
  return full;
}

// longrope: 1 / (factor_k · theta^(2k/dim)), in f32 as transformers.
std::vector<double> longrope_inv_freq(const RopeSpec& r, const std::vector<double>& factors, int64_t dim) {
  KILN_CHECK(static_cast<int64_t>(factors.size()) == dim / 2, "hf: longrope needs {} factors (half the {} turned values of a head), got {}",
             dim / 2, dim, factors.size());
  std::vector<double> inv(factors.size());
  for (int64_t k = 0; k < dim / 2; ++k) {
    const float e = static_cast<float>(2 * k) / static_cast<float>(dim);
    inv[static_cast<size_t>(k)] = 1.0f / (static_cast<float>(factors[static_cast<size_t>(k)]) * std::pow(static_cast<float>(r.theta), e));
  }
  return inv;
}
}  // namespace

int64_t rotary_dim(const RopeSpec& r, int64_t head_dim) {
  const auto rd = static_cast<int64_t>(static_cast<double>(head_dim) * r.partial_rotary_factor);  // int() as transformers
  KILN_CHECK(r.partial_rotary_factor > 0 && r.partial_rotary_factor <= 1 && rd >= 2 && rd % 2 == 0,
             "hf: partial_rotary_factor {} of head_dim {} turns {} values; kiln needs an even number in [2, head_dim]",
             r.partial_rotary_factor, head_dim, rd);
  return rd;
}

std::vector<double> rope_inv_freq(const RopeSpec& r, int64_t head_dim) {
  const int64_t rd = rotary_dim(r, head_dim);
  return padded(r.type == "longrope" ? longrope_inv_freq(r, r.short_factor, rd) : inv_freq_over(r, rd), head_dim);
}

std::vector<double> rope_long_inv_freq(const RopeSpec& r, int64_t head_dim) {
  if (r.type != "longrope") return {};
  return padded(longrope_inv_freq(r, r.long_factor, rotary_dim(r, head_dim)), head_dim);
}

void write_rope(const RopeSpec& r, nlohmann::json& config) {
  config["rope_theta"] = r.theta;
  if (r.partial_rotary_factor != 1.0) config["partial_rotary_factor"] = r.partial_rotary_factor;
  if (r.type == "default") {
    config["rope_scaling"] = nullptr;
  } else if (r.type == "linear") {
    config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", r.factor}};
  } else if (r.type == "longrope") {
    config["rope_scaling"] = {{"rope_type", "longrope"},
                              {"short_factor", r.short_factor},
                              {"long_factor", r.long_factor},
                              {"factor", r.factor},
                              {"original_max_position_embeddings", static_cast<int64_t>(r.original_max_position_embeddings)},
                              {"attention_factor", r.attention_factor}};
  } else if (r.type == "yarn") {  // every parameter explicit, the attention factor as computed
    config["rope_scaling"] = {{"rope_type", "yarn"},
                              {"factor", r.factor},
                              {"original_max_position_embeddings", static_cast<int64_t>(r.original_max_position_embeddings)},
                              {"beta_fast", r.beta_fast},
                              {"beta_slow", r.beta_slow},
                              {"truncate", r.truncate},
                              {"attention_factor", r.attention_factor}};
  } else {
    KILN_CHECK(r.original_max_position_embeddings == std::floor(r.original_max_position_embeddings),
               "hf: rope original_max_position_embeddings {} is not a whole number of positions", r.original_max_position_embeddings);
    config["rope_scaling"] = {{"rope_type", r.type},
                              {"factor", r.factor},
                              {"low_freq_factor", r.low_freq_factor},
                              {"high_freq_factor", r.high_freq_factor},
                              {"original_max_position_embeddings", static_cast<int64_t>(r.original_max_position_embeddings)}};
  }
}

}  // namespace detail

template <Backend B> Tensor<B> rope_rows_order(const Tensor<B>& t, int64_t heads, int64_t rotary, bool to_kiln) {
  const int64_t hd = t.size(0) / heads, rest = t.numel() / t.size(0), rd = rotary > 0 ? rotary : hd;
  KILN_CHECK(t.size(0) == heads * hd && rd % 2 == 0 && rd <= hd, "hf: RoPE rows of {} over {} heads, {} turned rows per head",
             shape_str(t.shape()), heads, rd);
  const Tensor<B> h = t.reshape({heads, hd, rest});
  const Shape from = to_kiln ? Shape{heads, 2, rd / 2, rest} : Shape{heads, rd / 2, 2, rest};
  Tensor<B> turned = h.narrow(1, 0, rd).reshape(from).transpose(1, 2).reshape({heads, rd, rest});
  if (rd < hd) turned = Tensor<B>::cat({turned, h.narrow(1, rd, hd - rd)}, 1);
  return turned.contiguous().reshape(t.shape());
}

#define KILN_INST(B) template Tensor<B> rope_rows_order<B>(const Tensor<B>&, int64_t, int64_t, bool);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::hf
