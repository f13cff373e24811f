#include "kiln/nn/lora.hpp"

#include <fnmatch.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/autograd/autocast.hpp"
#include "kiln/formats/safetensors.hpp"
#include "kiln/nn/hf/architecture.hpp"
#include "kiln/nn/init.hpp"
#include "kiln/nn/layers.hpp"
#include "kiln/text/regex.hpp"

namespace kiln::nn {

namespace {

using json = nlohmann::json;

// Where a kiln Linear sits in the model PEFT sees.
struct PeftName {
  std::string path;
  int64_t rope_heads = 0, rope_rotary = 0;  // RoPE rows re-ordered (hf::rope_rows_order)
  bool fan_in_fan_out = false;
  int64_t part = 0, parts = 1;  // a slice of a fused module (GPT-2's c_attn, Phi-3's qkv_proj and gate_up_proj)
};

std::string strip_weight(const std::string& name) {
  return name.size() > 7 && name.ends_with(".weight") ? name.substr(0, name.size() - 7) : std::string();
}

// kiln module path -> its PEFT name; empty for a model that is not an imported one (kiln paths are
// then the PEFT paths). The architecture table is the one load_causal_lm read the checkpoint with.
template <Backend B> std::map<std::string, PeftName> peft_names(const Module<B>& model) {
  std::map<std::string, PeftName> out;
  const auto* lm = dynamic_cast<const hf::CausalLM<B>*>(&model);
  if (lm == nullptr) return out;
  const hf::Architecture* a = hf::find_architecture(lm->spec().architecture);
  if (a == nullptr) return out;
  KILN_CHECK(a->read_only.empty(), "LoRA on {}: {}", a->name, a->read_only);
  // Without a directory (null, as when exporting) the table gives the names of the Hugging Face model's
  // modules (GPT-2's without its checkpoint's "transformer." prefix), which are what PEFT sees.
  for (const auto& [kiln_name, src] : a->tensors(lm->spec(), nullptr)) {
    const std::string k = strip_weight(kiln_name), h = strip_weight(src.name);
    if (k.empty() || h.empty()) continue;
    const bool rope = src.op == hf::TensorSource::Op::rope_rows;
    out[k] = {h, rope ? src.heads : 0, rope ? src.rotary : 0, src.op == hf::TensorSource::Op::transpose, src.part, src.parts};
  }
  return out;
}

bool is_glob(const std::string& p) { return p.find_first_of("*?[") != std::string::npos; }

// PEFT's rule for a name in a list: the path itself or its last dotted components; a glob: the path;
// target_regex (`re`): the whole path, as Python's re.fullmatch.
bool matches(const LoraOptions& o, const text::Regex* re, const std::string& path) {
  if (re != nullptr) return re->full_match(path);
  for (const auto& p : o.target_modules) {
    if (is_glob(p) ? fnmatch(p.c_str(), path.c_str(), 0) == 0 : path == p || path.ends_with("." + p)) return true;
  }
  return false;
}

std::string patterns_str(const LoraOptions& o) {
  return o.target_regex.empty() ? fmt::format("[{}]", fmt::join(o.target_modules, ", ")) : "regex '" + o.target_regex + "'";
}

// The regex PEFT reads (a string target_modules, full match) for patterns with globs: each glob as
// fnmatch(3) reads it (flags 0: '*', '?', bracket sets with ranges and '!' or '^' negating, '\\'
// quoting the next character), each name as PEFT's rule (the path or its last dotted components).
std::string glob_regex(const std::vector<std::string>& patterns) {
  const auto literal = [](char c) {
    return std::string_view("\\^$.|+*?()[]{}").find(c) != std::string_view::npos ? std::string("\\") + c : std::string(1, c);
  };
  std::string re;
  for (const auto& p : patterns) {
    re += re.empty() ? "(" : "|(";
    if (!is_glob(p)) re += "(.*\\.)?";
    for (size_t i = 0; i < p.size(); ++i) {
      const char c = p[i];
      if (c == '*') {
        re += ".*";
      } else if (c == '?') {
        re += ".";
      } else if (c == '\\' && i + 1 < p.size()) {
        re += literal(p[++i]);
      } else if (c == '[') {  // a set ends at the first ']' after its first character (a ']' there is one)
        size_t j = i + 1;
        if (j < p.size() && (p[j] == '!' || p[j] == '^')) ++j;
        if (j < p.size() && p[j] == ']') ++j;
        while (j < p.size() && p[j] != ']') ++j;
        if (j == p.size()) {  // no closing ']': fnmatch reads the '[' as itself
          re += "\\[";
          continue;
        }
        re += '[';
        size_t k = i + 1;
        if (p[k] == '!' || p[k] == '^') {
          re += '^';
          ++k;
        }
        for (; k < j; ++k) re += literal(p[k]);  // ranges' '-' stays; an escaped character is itself in a set
        re += ']';
        i = j;
      } else {
        re += literal(c);
      }
    }
    re += ")";
  }
  return re;
}

template <Backend B> struct Wrapped {
  std::string path;
  Linear<B>* linear;
  LoraAdapter<B>* adapter;
};

// The Linears with a LoRA adapter. The model is const in the traversal API; callers that change a
// Linear were handed the model non-const.
template <Backend B> std::vector<Wrapped<B>> wrapped(const Module<B>& model) {
  std::vector<Wrapped<B>> out;
  for (const auto& [path, m] : model.named_modules()) {
    auto* lin = dynamic_cast<Linear<B>*>(const_cast<Module<B>*>(m));
    if (lin == nullptr) continue;
    if (auto* a = dynamic_cast<LoraAdapter<B>*>(lin->adapter())) out.push_back({path, lin, a});
  }
  return out;
}

std::string saved_name(const std::string& peft_path, const char* which) {
  return "base_model.model." + peft_path + "." + which + ".weight";
}

}  // namespace

// ------------------------------------------------------------------------------------------ adapter

template <Backend B> LoraAdapter<B>::LoraAdapter(const LoraOptions& o, int64_t in, int64_t out, DType dtype, std::string peft_path)
    : o_(o),
      scaling_(o.use_rslora ? o.alpha / std::sqrt(static_cast<double>(o.r)) : o.alpha / static_cast<double>(o.r)),
      peft_path_(std::move(peft_path)) {
  // PEFT's default init: lora_A kaiming-uniform with a = √5, i.e. U(±1/√in), Linear's own default.
  a_ = std::make_shared<Linear<B>>(LinearOptions{.in = in, .out = o.r, .bias = false, .dtype = dtype});
  b_ = std::make_shared<Linear<B>>(LinearOptions{.in = o.r, .out = out, .bias = false, .dtype = dtype});
  init::zeros_(b_->weight());
  drop_ = std::make_shared<Dropout<B>>(o.dropout);
}

template <Backend B> void LoraAdapter<B>::share(std::shared_ptr<LoraAdapter> owner, int64_t part_index, int64_t part_count) {
  owner_ = std::move(owner);
  part = part_index;
  parts = part_count;
  a_.reset();
  b_.reset();
}

template <Backend B> Var<B> LoraAdapter<B>::forward(const Var<B>& x) const {
  const auto& drop = static_cast<const Dropout<B>&>(*drop_);
  if (parts == 1) return b_->forward(a_->forward(drop.forward(x))) * scaling_;
  // One part of a fused module: this part's rows of the owner's lora_B.
  const LoraAdapter& o = owner_ ? *owner_ : *this;
  const Var<B> h = o.a_->forward(drop.forward(x));                                              // [..., r]
  const Var<B> b = autocast::cast(autocast::Op::linear, o.b_->weight()).narrow(0, row0, rows);  // [rows, r], cast once
  Shape out_shape = h.shape();
  out_shape.back() = rows;
  return h.reshape({-1, o_.r}).matmul(b.t()).reshape(out_shape) * scaling_;
}

// ------------------------------------------------------------------------------------------ apply

template <Backend B> std::vector<std::string> default_lora_targets(const Module<B>& model) {
  if (const auto* lm = dynamic_cast<const hf::CausalLM<B>*>(&model))
    if (const hf::Architecture* a = hf::find_architecture(lm->spec().architecture); a != nullptr) {
      KILN_CHECK(!a->lora_targets.empty(),
                 "LoRA: PEFT has no default target modules for {} (nor has kiln): give target_modules (kiln train: --lora-target), "
                 "e.g. o_proj, gate_up_proj, down_proj",
                 a->name);
      return a->lora_targets;
    }
  return {"q_proj", "v_proj"};
}

template <Backend B> std::vector<std::string> apply_lora(Module<B>& model, const LoraOptions& options) {
  LoraOptions o = options;
  const bool by_default = o.target_modules.empty() && o.target_regex.empty();
  if (by_default) o.target_modules = default_lora_targets(model);
  KILN_CHECK(o.r >= 1, "apply_lora: r must be >= 1, got {}", o.r);
  KILN_CHECK(o.dropout >= 0 && o.dropout < 1, "apply_lora: dropout must be in [0, 1), got {}", o.dropout);
  KILN_CHECK(std::isfinite(o.alpha), "apply_lora: alpha must be finite, got {}", o.alpha);
  KILN_CHECK(o.bias == "none", "apply_lora: bias '{}' is not implemented (kiln has 'none': biases stay frozen)", o.bias);
  KILN_CHECK(o.target_modules.empty() || o.target_regex.empty(), "apply_lora: give target_modules or target_regex, not both");
  const auto re = o.target_regex.empty() ? nullptr : std::make_unique<text::Regex>(o.target_regex, "apply_lora: target_regex");
  const auto names = peft_names(model);
  struct Match {
    std::string path;
    Linear<B>* linear;
    PeftName name;
  };
  std::vector<Match> found;
  std::vector<std::string> wrapped_prefixes;
  for (const auto& [path, m] : model.named_modules()) {
    if (path.empty()) continue;
    bool inside = false;  // the adapter modules of a wrapped Linear
    for (const auto& w : wrapped_prefixes) inside = inside || path.starts_with(w + ".");
    if (inside) continue;
    auto* lin = dynamic_cast<Linear<B>*>(const_cast<Module<B>*>(m));
    if (lin != nullptr && lin->adapter() != nullptr) wrapped_prefixes.push_back(path);
    const auto it = names.find(path);
    const PeftName name = it != names.end() ? it->second : PeftName{path};
    if (!matches(o, re.get(), name.path)) continue;
    KILN_CHECK(lin != nullptr, "apply_lora: target {} matches module '{}', which is not a Linear (LoRA wraps Linear layers only)",
               patterns_str(o), name.path);
    KILN_CHECK(lin->adapter() == nullptr, "apply_lora: module '{}' has an adapter already", name.path);
    found.push_back({path, lin, name});
  }
  // PEFT adapts lm_head even where the head is tied to the embedding; kiln's tied models compute the
  // head from the embedding matrix, with no Linear to wrap: an error rather than a target left out.
  for (const auto& p : o.target_modules) {
    if (is_glob(p) || !(p == "lm_head" || p.ends_with(".lm_head"))) continue;
    bool hit = false;
    for (const auto& f : found) hit = hit || f.name.path == p || f.name.path.ends_with("." + p);
    KILN_CHECK(hit,
               "apply_lora: target '{}' matches no module (a model whose output head is tied to its embedding, tie_word_embeddings, "
               "computes it from the embedding matrix in kiln: there is no lm_head Linear to adapt)",
               p);
  }
  KILN_CHECK(!found.empty(), "apply_lora: target {} matches no module{}", patterns_str(o),
             by_default ? " (the default targets for this model: give target_modules)" : "");
  // A fused module (GPT-2's c_attn) is matched whole: every part, part 0 first (the table's order).
  std::map<std::string, int64_t> fused_parts;
  for (const auto& f : found)
    if (f.name.parts > 1) ++fused_parts[f.name.path];
  for (const auto& f : found)
    KILN_CHECK(f.name.parts == 1 || fused_parts[f.name.path] == f.name.parts,
               "apply_lora: fused module '{}' is matched in part ({} of its {} Linears)", f.name.path, fused_parts[f.name.path],
               f.name.parts);
  // A fused module's parts, by part: their rows in its lora_B follow one another.
  std::map<std::string, std::map<int64_t, int64_t>> part_rows;
  for (const auto& f : found)
    if (f.name.parts > 1) part_rows[f.name.path][f.name.part] = f.linear->options().out;
  model.requires_grad_(false);
  std::vector<std::string> paths;
  std::map<std::string, std::shared_ptr<LoraAdapter<B>>> owners;  // fused module -> the adapter of its part 0
  for (auto& [path, lin, name] : found) {
    const LinearOptions& lo = lin->options();
    int64_t total = lo.out, row0 = 0;  // the fused module's rows, and this part's first
    if (name.parts > 1) {
      total = 0;
      for (const auto& [p, n] : part_rows[name.path]) {
        if (p < name.part) row0 += n;
        total += n;
      }
    }
    auto a = std::make_shared<LoraAdapter<B>>(o, lo.in, total, lin->weight().dtype(), name.path);
    a->row0 = row0;
    a->rows = lo.out;
    a->rope_heads = name.rope_heads;
    a->rope_rotary = name.rope_rotary;
    a->fan_in_fan_out = name.fan_in_fan_out;
    a->parts = name.parts;
    a->dropout_module()->train(model.is_training());
    std::vector<std::pair<std::string, std::shared_ptr<Module<B>>>> modules{{"lora_dropout", a->dropout_module()}};
    if (name.parts > 1 && name.part > 0) {
      const auto owner = owners.find(name.path);
      KILN_CHECK(owner != owners.end(), "apply_lora: fused module '{}': part {} comes before part 0", name.path, name.part);
      a->share(owner->second, name.part, name.parts);
    } else {
      if (name.parts > 1) owners[name.path] = a;
      a->lora_A().train(model.is_training());
      a->lora_B().train(model.is_training());
      modules.emplace_back("lora_A", std::shared_ptr<Module<B>>(a, &a->lora_A()));
      modules.emplace_back("lora_B", std::shared_ptr<Module<B>>(a, &a->lora_B()));
    }
    lin->set_adapter(a, modules);
    paths.push_back(path);
  }
  return paths;
}

template <Backend B> std::vector<std::pair<std::string, LoraAdapter<B>*>> lora_adapters(const Module<B>& model) {
  std::vector<std::pair<std::string, LoraAdapter<B>*>> out;
  for (const auto& w : wrapped(model)) out.emplace_back(w.path, w.adapter);
  return out;
}

// ------------------------------------------------------------------------------------------ save

// An adapter and, for the owner of a fused module, the adapters of its other parts, by part.
template <Backend B> std::vector<const LoraAdapter<B>*> parts_of(const std::vector<Wrapped<B>>& ws, const LoraAdapter<B>& owner) {
  std::vector<const LoraAdapter<B>*> out{&owner};
  if (owner.parts == 1) return out;
  for (const auto& w : ws)
    if (w.adapter->owner() == &owner) out.push_back(w.adapter);
  std::sort(out.begin(), out.end(), [](const auto* x, const auto* y) { return x->part < y->part; });
  return out;
}

// lora_B between kiln's rows and PEFT's: each part's rows (its RoPE rows re-ordered, hf::rope_rows_order).
template <Backend B> Tensor<B> peft_rows(const std::vector<const LoraAdapter<B>*>& parts, const Tensor<B>& b, bool to_kiln) {
  const auto turn = [&](const LoraAdapter<B>& a, const Tensor<B>& t) {
    return a.rope_heads ? hf::rope_rows_order(t, a.rope_heads, a.rope_rotary, to_kiln) : t;
  };
  if (parts.size() == 1) return turn(*parts[0], b);
  std::vector<Tensor<B>> rows;
  for (const LoraAdapter<B>* a : parts) rows.push_back(turn(*a, b.narrow(0, a->row0, a->rows)));
  return Tensor<B>::cat(rows, 0);
}

template <Backend B> std::vector<std::pair<std::string, Tensor<B>>> lora_state_dict(const Module<B>& model) {
  std::vector<std::pair<std::string, Tensor<B>>> out;
  const auto ws = wrapped(model);
  for (const auto& w : ws) {
    const LoraAdapter<B>& a = *w.adapter;
    if (a.owner() != nullptr) continue;  // a later part of a fused module: its owner holds the tensors
    out.emplace_back(saved_name(a.peft_path(), "lora_A"), a.lora_A().weight().value());
    out.emplace_back(saved_name(a.peft_path(), "lora_B"), peft_rows(parts_of(ws, a), a.lora_B().weight().value(), false));
  }
  return out;
}

template <Backend B> void save_lora(const Module<B>& model, const std::string& dir) {
  const auto ws = wrapped(model);
  KILN_CHECK(!ws.empty(), "save_lora: the model has no LoRA adapter (apply_lora or load_lora first); nothing written to '{}'", dir);
  const LoraOptions& o = ws.front().adapter->options();
  bool fan_in_fan_out = false;
  for (const auto& w : ws) {
    fan_in_fan_out = fan_in_fan_out || w.adapter->fan_in_fan_out;
    const LoraOptions& p = w.adapter->options();
    // One adapter_config.json holds one r, alpha, dropout and target list (PEFT's per-module
    // rank_pattern/alpha_pattern are not implemented).
    KILN_CHECK(p.r == o.r && p.alpha == o.alpha && p.dropout == o.dropout && p.use_rslora == o.use_rslora &&
                   p.target_modules == o.target_modules && p.target_regex == o.target_regex,
               "save_lora: the adapters of '{}' (r {}, alpha {}, target {}) and '{}' (r {}, alpha {}, target {}) come from different "
               "apply_lora options; one adapter_config.json holds one set (apply_lora once with every target)",
               ws.front().path, o.r, o.alpha, patterns_str(o), w.path, p.r, p.alpha, patterns_str(p));
  }
  json c;
  c["peft_type"] = "LORA";
  c["task_type"] = "CAUSAL_LM";
  c["base_model_name_or_path"] = o.base_model_name_or_path.empty() ? json(nullptr) : json(o.base_model_name_or_path);
  c["r"] = o.r;
  c["lora_alpha"] = o.alpha;
  c["lora_dropout"] = o.dropout;
  bool glob = false;
  for (const auto& p : o.target_modules) glob = glob || is_glob(p);
  // PEFT reads a list as names and a string as a regex: globs go as the equivalent regex.
  if (!o.target_regex.empty())
    c["target_modules"] = o.target_regex;
  else if (glob)
    c["target_modules"] = glob_regex(o.target_modules);
  else
    c["target_modules"] = o.target_modules;
  c["bias"] = o.bias;
  c["use_rslora"] = o.use_rslora;
  c["fan_in_fan_out"] = fan_in_fan_out;
  c["inference_mode"] = true;
  c["init_lora_weights"] = true;
  c["modules_to_save"] = nullptr;
  c["use_dora"] = false;
  c["rank_pattern"] = json::object();
  c["alpha_pattern"] = json::object();
  std::filesystem::create_directories(dir);
  safetensors::save<B>(dir + "/adapter_model.safetensors", lora_state_dict(model), {{"format", "pt"}});
  const std::string text = c.dump(2) + "\n";
  safetensors::write_atomically(dir + "/adapter_config.json", {{text.data(), text.size()}});
}

// ------------------------------------------------------------------------------------------ load

LoraOptions read_lora_config(const std::string& path) {
  std::ifstream f(path);
  KILN_CHECK(f.good(), "load_lora: cannot open '{}'", path);
  json c;
  try {
    c = json::parse(f);
  } catch (const json::exception& e) {
    fail("load_lora: '{}' is not valid JSON: {}", path, e.what());
  }
  KILN_CHECK(c.is_object(), "load_lora: '{}' must hold a JSON object", path);
  LoraOptions o;
  auto num = [&](const char* k, double def) {
    if (!c.contains(k) || c[k].is_null()) return def;
    KILN_CHECK(c[k].is_number(), "load_lora: {}: '{}' must be a number, got {}", path, k, c[k].dump());
    return c[k].get<double>();
  };
  KILN_CHECK(c.value("peft_type", json()) == "LORA", "load_lora: {}: peft_type must be \"LORA\", got {}", path,
             c.value("peft_type", json()).dump());
  KILN_CHECK(c.contains("r") && c["r"].is_number_integer(), "load_lora: {}: 'r' must be an integer", path);
  o.r = c["r"].get<int64_t>();
  o.alpha = num("lora_alpha", 8.0);
  o.dropout = num("lora_dropout", 0.0);
  const json t = c.value("target_modules", json());
  if (t.is_string()) {
    o.target_regex = t.get<std::string>();
  } else {
    KILN_CHECK(t.is_array() && !t.empty(), "load_lora: {}: 'target_modules' must be a list of names or a regex string, got {}", path,
               t.dump());
    for (const auto& n : t) {
      KILN_CHECK(n.is_string(), "load_lora: {}: 'target_modules' entries must be strings, got {}", path, n.dump());
      o.target_modules.push_back(n.get<std::string>());
    }
  }
  o.bias = c.value("bias", std::string("none"));
  o.use_rslora = c.value("use_rslora", false);
  if (c.contains("base_model_name_or_path") && c["base_model_name_or_path"].is_string())
    o.base_model_name_or_path = c["base_model_name_or_path"];
  // Fields with no effect on a loaded adapter's math; fan_in_fan_out follows each module's type, as in PEFT;
  // qalora_group_size acts only with use_qalora (refused below when true), and PEFT 0.21 writes 16 either way.
  static const std::set<std::string> read = {"peft_type",        "r",
                                             "lora_alpha",       "lora_dropout",
                                             "target_modules",   "bias",
                                             "use_rslora",       "base_model_name_or_path",
                                             "fan_in_fan_out",   "task_type",
                                             "inference_mode",   "init_lora_weights",
                                             "revision",         "auto_mapping",
                                             "megatron_core",    "peft_version",
                                             "qalora_group_size"};
  for (const auto& [k, v] : c.items()) {
    if (read.count(k)) continue;
    const bool unset = v.is_null() || v == false || (v.is_object() && v.empty()) || (v.is_array() && v.empty());
    KILN_CHECK(unset, "load_lora: {}: field '{}' = {} is not implemented by kiln", path, k, v.dump());
  }
  return o;
}

template <Backend B> std::vector<std::string> load_lora(Module<B>& model, const std::string& dir) {
  const LoraOptions o = read_lora_config(dir + "/adapter_config.json");
  const std::string file = dir + "/adapter_model.safetensors";
  KILN_CHECK(std::filesystem::exists(file), "load_lora: '{}' does not exist", file);
  std::map<std::string, Tensor<B>> loaded = safetensors::load<B>(file);
  // Remember what apply_lora changes, so a failed load leaves the model as it was.
  std::vector<std::pair<Var<B>, bool>> grads;
  for (auto& [n, p] : model.named_parameters()) grads.emplace_back(p, p.requires_grad());
  const std::vector<std::string> paths = apply_lora(model, o);
  try {
    std::vector<std::string> problems;
    std::vector<std::pair<Tensor<B>, Tensor<B>>> copies;
    const auto ws = wrapped(model);
    for (const auto& w : ws) {
      const LoraAdapter<B>& a = *w.adapter;
      if (a.owner() != nullptr) continue;  // a later part of a fused module: loaded through its owner
      for (const char* which : {"lora_A", "lora_B"}) {
        const std::string name = saved_name(a.peft_path(), which);
        Tensor<B> dst = (std::string_view(which) == "lora_A" ? a.lora_A() : a.lora_B()).weight().value();
        const auto it = loaded.find(name);
        if (it == loaded.end()) {
          problems.push_back(fmt::format("missing '{}' {}", name, shape_str(dst.shape())));
          continue;
        }
        Tensor<B> src = it->second;
        loaded.erase(it);
        if (src.shape() != dst.shape()) {
          problems.push_back(fmt::format("'{}' is {}, the model's is {}", name, shape_str(src.shape()), shape_str(dst.shape())));
          continue;
        }
        if (std::string_view(which) == "lora_B") src = peft_rows(parts_of(ws, a), src, true);
        copies.emplace_back(dst, src);
      }
      // PEFT's save_embedding_layers (on by default where lm_head is a target) stores the base weight
      // beside the adapter, and PeftModel.from_pretrained loads it into the model: so does kiln.
      const std::string base = saved_name(a.peft_path(), "base_layer");
      if (const auto it = loaded.find(base); it != loaded.end()) {
        Tensor<B> dst = w.linear->weight().value();
        if (a.parts > 1 || a.rope_heads || a.fan_in_fan_out)
          problems.push_back(fmt::format("'{}': kiln takes a base layer's weight for a plain Linear only", base));
        else if (it->second.shape() != dst.shape())
          problems.push_back(fmt::format("'{}' is {}, the model's is {}", base, shape_str(it->second.shape()), shape_str(dst.shape())));
        else
          copies.emplace_back(dst, it->second);
        loaded.erase(it);
      }
    }
    for (const auto& [name, t] : loaded) problems.push_back(fmt::format("unexpected '{}' {}", name, shape_str(t.shape())));
    KILN_CHECK(problems.empty(), "load_lora: {} does not fit the model (target {}): {}", file, patterns_str(o), fmt::join(problems, "; "));
    for (auto& [dst, src] : copies) dst.copy_(src);
  } catch (...) {
    for (const auto& w : wrapped(model))  // only what this call applied: adapters from before stay
      if (std::find(paths.begin(), paths.end(), w.path) != paths.end()) w.linear->remove_adapter();
    for (auto& [p, on] : grads) p.requires_grad_(on);
    throw;
  }
  return paths;
}

// ------------------------------------------------------------------------------------------ merge

template <Backend B> void merge_lora(Module<B>& model) {
  const auto ws = wrapped(model);
  KILN_CHECK(!ws.empty(), "merge_lora: the model has no LoRA adapter");
  NoGrad no_grad;
  for (const auto& w : ws) {
    const LoraAdapter<B>& a = *w.adapter;
    const Tensor<B>& A = a.lora_A().weight().value();
    Tensor<B> Bw = a.lora_B().weight().value();  // the owner's, for a part of a fused module
    Tensor<B> W = w.linear->weight().value();
    if (a.parts > 1) Bw = Bw.narrow(0, a.row0, a.rows);
    // In the weight's dtype, as PEFT's merge (the product in f32 for f32 weights).
    W.add_(Bw.matmul(A).mul(a.scaling()).to(W.dtype()));
    w.linear->remove_adapter();
  }
}

#define KILN_INST(B)                                                                                \
  template class LoraAdapter<B>;                                                                    \
  template std::vector<std::string> default_lora_targets<B>(const Module<B>&);                      \
  template std::vector<std::string> apply_lora<B>(Module<B>&, const LoraOptions&);                  \
  template std::vector<std::pair<std::string, LoraAdapter<B>*>> lora_adapters<B>(const Module<B>&); \
  template std::vector<std::pair<std::string, Tensor<B>>> lora_state_dict<B>(const Module<B>&);     \
  template void save_lora<B>(const Module<B>&, const std::string&);                                 \
  template std::vector<std::string> load_lora<B>(Module<B>&, const std::string&);                   \
  template void merge_lora<B>(Module<B>&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
