#include "kiln/nn/hf/export.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/formats/safetensors.hpp"
#include "kiln/nn/hf/architecture.hpp"

namespace kiln::hf {

namespace fs = std::filesystem;

namespace {

// The files a Hugging Face tokenizer may consist of (transformers' tokenizer save_pretrained).
const char* const kTokenizerFiles[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
    "merges.txt",     "added_tokens.json"};

const char* torch_dtype_name(DType d) {
  switch (d) {
    case DType::f32:
      return "float32";
    case DType::bf16:
      return "bfloat16";
    case DType::f16:
      return "float16";
    default:
      fail("hf::save_pretrained: the stored dtype must be f32, bf16 or f16, got {}", d);
  }
}

// The first field in which two Specs differ ("" when none): the export's read-back check.
std::string spec_difference(const Spec& a, const Spec& b) {
  const std::pair<const char*, bool> same[] = {
      {"architecture", a.architecture == b.architecture},
      {"vocab", a.vocab == b.vocab},
      {"hidden", a.hidden == b.hidden},
      {"layers", a.layers == b.layers},
      {"heads", a.heads == b.heads},
      {"kv_heads", a.kv_heads == b.kv_heads},
      {"head_dim", a.head_dim == b.head_dim},
      {"intermediate", a.intermediate == b.intermediate},
      {"max_positions", a.max_positions == b.max_positions},
      {"norm", a.norm == b.norm},
      {"norm_eps", a.norm_eps == b.norm_eps},
      {"mlp", a.mlp == b.mlp},
      {"act", a.act == b.act},
      {"qkv_bias", a.qkv_bias == b.qkv_bias},
      {"o_bias", a.o_bias == b.o_bias},
      {"mlp_bias", a.mlp_bias == b.mlp_bias},
      {"learned_positions", a.learned_positions == b.learned_positions},
      {"inv_freq", a.inv_freq == b.inv_freq},
      {"rope attention_factor", a.rope.attention_factor == b.rope.attention_factor},
      {"local inv_freq", a.local_inv_freq == b.local_inv_freq && a.local_rope.attention_factor == b.local_rope.attention_factor},
      {"long inv_freq",
       a.long_inv_freq == b.long_inv_freq && a.rope.original_max_position_embeddings == b.rope.original_max_position_embeddings},
      {"norm_offset", a.norm_offset == b.norm_offset},
      {"embed_scale", a.embed_scale == b.embed_scale},
      {"post_norms", a.post_norms == b.post_norms},
      {"qk_norm", a.qk_norm == b.qk_norm},
      {"attn_scalar", a.attn_scalar == b.attn_scalar},
      {"attn_softcap", a.attn_softcap == b.attn_softcap},
      {"final_softcap", a.final_softcap == b.final_softcap},
      {"sliding_window", a.sliding_window == b.sliding_window && a.sliding_layers == b.sliding_layers},
      {"tie_embeddings", a.tie_embeddings == b.tie_embeddings},
      {"padding_idx", a.padding_idx == b.padding_idx},
  };
  for (const auto& [name, eq] : same)
    if (!eq) return name;
  return "";
}

void write_text(const std::string& path, const std::string& text) { safetensors::write_atomically(path, {{text.data(), text.size()}}); }

// config.json: the architecture's fields from the Spec, then the source's other fields (token ids,
// names, dropout, ...). The dtype and RoPE fields are spelled as the source spells them (transformers 5
// writes "dtype" and "rope_parameters" where 4.x writes "torch_dtype", "rope_theta" and "rope_scaling";
// each reads both), and the source's RoPE fields are kept as they are (the read-back in
// write_model_dir_unchecked checks that they give this Spec's frequencies), so a re-export changes no field.
nlohmann::json make_config(const Architecture& a, const Spec& s, const ExportOptions& o) {
  nlohmann::json j = a.config(s);
  const auto source_has = [&](const char* k) { return s.source_config && s.source_config->contains(k); };
  j[source_has("dtype") && !source_has("torch_dtype") ? "dtype" : "torch_dtype"] = torch_dtype_name(o.dtype);
  const char* const rope_fields[] = {"rope_parameters", "rope_theta", "rope_scaling", "rope_local_base_freq", "partial_rotary_factor"};
  if (j.contains("rope_theta") && (source_has("rope_parameters") || source_has("rope_theta") || source_has("rope_scaling"))) {
    for (const char* k : rope_fields) j.erase(k);
    for (const char* k : rope_fields)
      if (source_has(k)) j[k] = s.source_config->at(k);
  }
  const std::set<std::string> replaced = {"rope_parameters",       "rope_theta", "rope_scaling", "rope_local_base_freq",
                                          "partial_rotary_factor", "dtype",      "torch_dtype"};
  if (s.source_config) {
    for (auto it = s.source_config->begin(); it != s.source_config->end(); ++it)
      if (!j.contains(it.key()) && !replaced.count(it.key())) j[it.key()] = it.value();
  }
  if (o.bos_token_id) j["bos_token_id"] = *o.bos_token_id;
  if (o.eos_token_id) j["eos_token_id"] = *o.eos_token_id;
  return j;
}

// generation_config.json: the source's as is, else what transformers derives from the config.
nlohmann::json make_generation_config(const Spec& s, const nlohmann::json& config, const ExportOptions& o) {
  if (s.source_generation_config && !o.bos_token_id && !o.eos_token_id) return *s.source_generation_config;
  nlohmann::json g = s.source_generation_config ? *s.source_generation_config : nlohmann::json{{"_from_model_config", true}};
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id", "transformers_version"})
    if (config.contains(k) && !config[k].is_null() && !g.contains(k)) g[k] = config[k];
  if (o.bos_token_id) g["bos_token_id"] = *o.bos_token_id;
  if (o.eos_token_id) g["eos_token_id"] = *o.eos_token_id;
  return g;
}

// One checkpoint tensor to write: the model's parameters it is made of (a fused tensor has several).
template <Backend B> struct Planned {
  std::string name;
  const TensorSource* src = nullptr;
  std::vector<std::pair<const TensorSource*, Tensor<B>>> parts;  // by part
  int64_t bytes = 0;                                             // stored
};

// The checkpoint tensors of a model, in the order of the parameters: the architecture's table read
// backwards. Nothing is computed yet (materialize does it, a shard at a time).
template <Backend B> std::vector<Planned<B>> plan_tensors(const std::map<std::string, TensorSource>& table, const Spec& s,
                                                          const std::vector<std::pair<std::string, Tensor<B>>>& params, DType dtype) {
  std::map<std::string, Tensor<B>> by_name;
  std::vector<std::string> order;  // checkpoint names, first use first
  for (const auto& [name, t] : params) {
    const auto it = table.find(name);
    KILN_CHECK(it != table.end(), "hf::save_pretrained({}): parameter '{}' has no place in the checkpoint", s.architecture, name);
    KILN_CHECK(by_name.emplace(name, t).second, "hf::save_pretrained({}): parameter '{}' given twice", s.architecture, name);
    if (std::find(order.begin(), order.end(), it->second.name) == order.end()) order.push_back(it->second.name);
  }
  std::map<std::string, std::vector<std::pair<const TensorSource*, Tensor<B>>>> parts;
  for (const auto& [name, src] : table) {
    const auto p = by_name.find(name);
    if (p == by_name.end()) {
      KILN_CHECK(name == "lm_head.weight" && s.tie_embeddings, "hf::save_pretrained({}): the model has no parameter '{}' (for '{}')",
                 s.architecture, name, src.name);
      continue;  // a tied head is the embedding: transformers saves it once
    }
    parts[src.name].push_back({&src, p->second});
  }
  std::vector<Planned<B>> out;
  for (const std::string& ck : order) {
    Planned<B> t{ck, nullptr, std::move(parts[ck]), 0};
    std::sort(t.parts.begin(), t.parts.end(), [](const auto& x, const auto& y) { return x.first->part < y.first->part; });
    t.src = t.parts[0].first;
    KILN_CHECK(static_cast<int64_t>(t.parts.size()) == t.src->parts, "hf::save_pretrained({}): '{}' needs {} parts, the model has {}",
               s.architecture, ck, t.src->parts, t.parts.size());
    t.bytes = numel(t.src->shape) * static_cast<int64_t>(dtype_size(dtype));
    out.push_back(std::move(t));
  }
  return out;
}

// The inverse of causal_lm.cpp's transform: the parts of a fused tensor concatenated, rope rows back
// to rotate-half, a Conv1D weight transposed back to [in, out]; in the stored dtype.
template <Backend B> Tensor<B> materialize(const Planned<B>& p, const Spec& s, DType dtype) {
  std::vector<Tensor<B>> rows;
  for (const auto& [part, t] : p.parts) {
    // kiln's rows (2i, 2i+1) of each head back to (i, i + hd/2)
    rows.push_back(part->op == TensorSource::Op::rope_rows ? rope_rows_order(t, part->heads, part->rotary, /*to_kiln=*/false) : t);
  }
  Tensor<B> t = rows.size() == 1 ? rows[0] : Tensor<B>::cat(rows, 0);
  if (p.src->op == TensorSource::Op::transpose) t = t.transpose(0, 1);
  KILN_CHECK(t.shape() == p.src->shape, "hf::save_pretrained({}): '{}' comes out {}, the config makes it {}", s.architecture, p.name,
             shape_str(t.shape()), shape_str(p.src->shape));
  return t.to(dtype).contiguous();
}

// Files of at most max_bytes of weights each (a tensor larger than that alone in its file), in order,
// as transformers' shard_checkpoint splits a state dict.
template <Backend B> std::vector<std::vector<const Planned<B>*>> shard(const std::vector<Planned<B>>& ts, int64_t max_bytes) {
  std::vector<std::vector<const Planned<B>*>> shards(1);
  int64_t size = 0;
  for (const Planned<B>& t : ts) {
    if (max_bytes > 0 && !shards.back().empty() && size + t.bytes > max_bytes) {
      shards.emplace_back();
      size = 0;
    }
    shards.back().push_back(&t);
    size += t.bytes;
  }
  return shards;
}

// Writes one file, computing its tensors only now: the export holds at most one shard's converted
// copies besides the model.
template <Backend B> void write_shard(const std::string& path, const std::vector<const Planned<B>*>& shard, const Spec& s, DType dtype) {
  std::vector<std::pair<std::string, Tensor<B>>> ts;
  for (const Planned<B>* p : shard) ts.push_back({p->name, materialize(*p, s, dtype)});
  safetensors::save<B>(path, ts, {{"format", "pt"}});
}

void copy_tokenizer(const std::string& from, const std::string& to) {
  KILN_CHECK(fs::is_directory(from), "hf::save_pretrained: tokenizer_from {} is not a directory", from);
  int copied = 0;
  for (const char* f : kTokenizerFiles) {
    const fs::path src = fs::path(from) / f;
    if (!fs::exists(src)) continue;
    fs::copy_file(src, fs::path(to) / f);
    ++copied;
  }
  KILN_CHECK(copied > 0, "hf::save_pretrained: tokenizer_from {} holds no tokenizer file (looked for {})", from,
             fmt::join(kTokenizerFiles, ", "));
}

// Writes the directory under a temporary name, reads it back, then renames it into place.
template <Backend B> void write_model_dir_unchecked(const Spec& s, const std::vector<std::pair<std::string, Tensor<B>>>& params,
                                                    const std::string& dir_in, const ExportOptions& o) {
  torch_dtype_name(o.dtype);  // checks the dtype
  KILN_CHECK(o.max_shard_bytes >= 0, "hf::save_pretrained: max_shard_bytes must be >= 0 (0: one file), got {}", o.max_shard_bytes);
  const Architecture* a = find_architecture(s.architecture);
  require_writable(s);
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  KILN_CHECK(!dir.empty(), "hf::save_pretrained: the output directory is empty");
  std::error_code ec;
  const bool existed = fs::exists(dir, ec);
  if (existed) {
    KILN_CHECK(fs::is_directory(dir), "hf::save_pretrained: {} exists and is not a directory", dir);
    KILN_CHECK(fs::is_empty(dir) || o.overwrite, "hf::save_pretrained: {} exists and is not empty (overwrite / --force replaces it)", dir);
  }
  const fs::path parent = fs::absolute(dir).parent_path();
  fs::create_directories(parent);

  NoGrad no_grad;
  const std::map<std::string, TensorSource> table = a->tensors(s, nullptr);
  const std::vector<Planned<B>> tensors = plan_tensors<B>(table, s, params, o.dtype);
  const nlohmann::json config = make_config(*a, s, o);
  const nlohmann::json generation = make_generation_config(s, config, o);

  const std::string tmp = fmt::format("{}.tmp-{}", dir, ::getpid());
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  try {
    const auto shards = shard<B>(tensors, o.max_shard_bytes);
    if (shards.size() == 1) {
      write_shard<B>(tmp + "/model.safetensors", shards[0], s, o.dtype);
    } else {
      nlohmann::json index;
      int64_t total = 0;
      for (size_t i = 0; i < shards.size(); ++i) {
        const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
        write_shard<B>(tmp + "/" + file, shards[i], s, o.dtype);
        for (const Planned<B>* p : shards[i]) {
          index["weight_map"][p->name] = file;
          total += p->bytes;
        }
      }
      index["metadata"] = {{"total_size", total}};
      write_text(tmp + "/model.safetensors.index.json", index.dump(2) + "\n");
    }
    write_text(tmp + "/config.json", config.dump(2) + "\n");
    write_text(tmp + "/generation_config.json", generation.dump(2) + "\n");
    if (!o.tokenizer_from.empty()) copy_tokenizer(o.tokenizer_from, tmp);

    // Read back: the import's reader must see this very model and exactly these tensors.
    {
      const ModelDir back = ModelDir::open(tmp);
      const std::string diff = spec_difference(a->spec(back), s);
      KILN_CHECK(diff.empty(), "hf::save_pretrained({}): the config.json written reads back with another '{}' (a bug in nn/hf)",
                 s.architecture, diff);
      std::vector<std::string> want;
      for (const Planned<B>& p : tensors) want.push_back(p.name);
      std::sort(want.begin(), want.end());
      KILN_CHECK(back.tensor_names() == want, "hf::save_pretrained({}): the files written hold other tensors than those meant (a bug)",
                 s.architecture);
    }
    if (existed) {
      const std::string old = fmt::format("{}.old-{}", dir, ::getpid());
      fs::rename(dir, old);
      fs::rename(tmp, dir);
      fs::remove_all(old);
    } else {
      fs::rename(tmp, dir);
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

// The same, with the file system's own errors (no space, no permission) as kiln::Errors naming DIR.
template <Backend B> void write_model_dir(const Spec& s, const std::vector<std::pair<std::string, Tensor<B>>>& params,
                                          const std::string& dir, const ExportOptions& o) {
  try {
    write_model_dir_unchecked<B>(s, params, dir, o);
  } catch (const fs::filesystem_error& e) {
    fail("hf::save_pretrained: writing {}: {}", dir, e.what());
  }
}

}  // namespace

Spec llama_spec_of(const ModelConfig& config) {
  const ModelConfig c = config.resolved();
  std::vector<std::string> none;
  if (c.attention == "diff")
    none.push_back(
        "attention \"diff\" (differential attention: two softmax maps subtracted and a per-head norm; no transformers model has it)");
  if (c.residual != "standard")
    none.push_back(fmt::format(
        "residual \"{}\" (attention residuals: each sublayer reads a depth attention over earlier outputs; no transformers model has it)",
        c.residual));
  if (!c.rope) none.push_back("rope = false (no positional encoding; LlamaForCausalLM always applies RoPE)");
  KILN_CHECK(none.empty(),
             "hf::save_pretrained: this kiln GPT has no Hugging Face architecture: {}. Only the Llama shape exports (attention \"mha\", "
             "residual \"standard\", rope = true)",
             fmt::join(none, "; "));
  Spec s;
  s.architecture = "LlamaForCausalLM";
  s.vocab = c.vocab_size;
  s.hidden = c.d_model;
  s.layers = c.n_layers;
  s.heads = c.n_heads;
  s.kv_heads = c.n_kv_heads;
  s.head_dim = c.d_model / c.n_heads;
  s.intermediate = c.ffn_hidden;
  s.max_positions = c.max_seq_len;
  s.norm = NormKind::rms;
  s.norm_eps = c.norm_eps;
  s.mlp = MlpKind::gated;
  s.act = Act::silu;
  s.rope = RopeSpec{.type = "default", .theta = c.rope_theta};
  s.inv_freq = detail::rope_inv_freq(s.rope, s.head_dim);
  s.tie_embeddings = c.tie_embeddings;
  return s;
}

void require_writable(const Spec& s) {
  const Architecture* a = find_architecture(s.architecture);
  KILN_CHECK(a != nullptr && a->config, "hf::save_pretrained: architecture '{}' cannot be written (kiln writes: {})", s.architecture,
             fmt::join(architectures(), ", "));
  KILN_CHECK(a->read_only.empty(), "hf::save_pretrained: {} cannot be written: {}", s.architecture, a->read_only);
}

bool has_tokenizer_files(const std::string& dir) {
  std::error_code ec;
  for (const char* f : kTokenizerFiles)
    if (fs::exists(fs::path(dir) / f, ec)) return true;
  return false;
}

int64_t parse_byte_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit = text.substr(i);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  static const std::map<std::string, int64_t> units = {{"", 1},
                                                       {"B", 1},
                                                       {"KB", 1'000},
                                                       {"MB", 1'000'000},
                                                       {"GB", 1'000'000'000},
                                                       {"KIB", int64_t{1} << 10},
                                                       {"MIB", int64_t{1} << 20},
                                                       {"GIB", int64_t{1} << 30}};
  const auto u = units.find(unit);
  KILN_CHECK(i > 0 && i <= 15 && u != units.end(),
             "max shard size '{}': expected a number of bytes with an optional unit (KB, MB, GB, KiB, MiB, GiB)", text);
  return std::stoll(text.substr(0, i)) * u->second;
}

template <Backend B> void save_pretrained(const CausalLM<B>& model, const std::string& dir, const ExportOptions& o) {
  std::vector<std::pair<std::string, Tensor<B>>> params;
  for (const auto& [name, v] : model.named_parameters()) params.push_back({name, v.value()});
  write_model_dir<B>(model.spec(), params, dir, o);
}

template <Backend B> void save_pretrained(const nn::GPT<B>& model, const std::string& dir, const ExportOptions& o) {
  const Spec s = llama_spec_of(model.config());
  // kiln's GPT names -> the decoder's (nn/hf/causal_lm.hpp); the rest are the same names. kiln's GPT
  // turns interleaved RoPE pairs as the decoder does, so the table's rope_rows apply as they are.
  std::vector<std::pair<std::string, Tensor<B>>> params;
  for (const auto& [name, v] : model.named_parameters()) {
    std::string n = name;
    if (n.rfind("tok_emb.", 0) == 0) n = "embed." + n.substr(8);
    if (const auto at = n.find(".attn.out_proj."); at != std::string::npos) n.replace(at, 15, ".attn.o_proj.");
    params.push_back({n, v.value()});
  }
  write_model_dir<B>(s, params, dir, o);
}

#define KILN_INST(B)                                                                              \
  template void save_pretrained<B>(const CausalLM<B>&, const std::string&, const ExportOptions&); \
  template void save_pretrained<B>(const nn::GPT<B>&, const std::string&, const ExportOptions&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::hf
