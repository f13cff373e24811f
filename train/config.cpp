#include "train/config.hpp"

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"

namespace kiln {

namespace {

using json = nlohmann::json;

// Reads the keys of one JSON object into typed fields, then rejects whatever key was not asked for.
class Fields {
 public:
  Fields(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    KILN_CHECK(j.is_object(), "{}: expected a JSON object, got {}", where_, j.dump());
  }

  template <class T> void get(const char* key, T& out) {
    keys_.emplace_back(key);
    const auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return;
    const json& v = *it;
    if constexpr (std::is_same_v<T, bool>) {
      KILN_CHECK(v.is_boolean(), "{}: '{}' must be true or false, got {}", where_, key, v.dump());
      out = v.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      KILN_CHECK(v.is_number_integer() || (v.is_number_float() && v.get<double>() == static_cast<double>(v.get<int64_t>())),
                 "{}: '{}' must be an integer, got {}", where_, key, v.dump());
      out = static_cast<T>(v.get<int64_t>());
    } else if constexpr (std::is_floating_point_v<T>) {
      KILN_CHECK(v.is_number(), "{}: '{}' must be a number, got {}", where_, key, v.dump());
      out = v.get<T>();
    } else {
      KILN_CHECK(v.is_string(), "{}: '{}' must be a string, got {}", where_, key, v.dump());
      out = v.get<std::string>();
    }
  }
  const json* object(const char* key) {
    keys_.emplace_back(key);
    const auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  void finish() const {
    std::vector<std::string> unknown;
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (std::find(keys_.begin(), keys_.end(), it.key()) == keys_.end()) unknown.push_back("'" + it.key() + "'");
    KILN_CHECK(unknown.empty(), "{}: unknown key{} {} (valid keys: {})", where_, unknown.size() > 1 ? "s" : "",
               fmt::join(unknown, ", "), fmt::join(keys_, ", "));
  }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  std::string where_;
  std::vector<std::string> keys_;
};

void one_of(const std::string& where, const char* key, const std::string& v, std::initializer_list<const char*> valid) {
  for (const char* s : valid)
    if (v == s) return;
  fail("{}: '{}' is \"{}\"; valid values: {}", where, key, v, fmt::join(valid, ", "));
}

}  // namespace

json read_json_file(const std::string& path) {
  std::ifstream f(path);
  KILN_CHECK(f.good(), "cannot read '{}': no such file or not readable", path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::parse_error& e) {
    fail("'{}' is not valid JSON: {}", path, e.what());
  }
}

// ---------------------------------------------------------------------------------------- model
ModelConfig ModelConfig::from_json(const json& j, const std::string& where) {
  ModelConfig c;
  Fields f(j, where);
  f.get("vocab_size", c.vocab_size);
  f.get("d_model", c.d_model);
  f.get("n_layers", c.n_layers);
  f.get("n_heads", c.n_heads);
  f.get("n_kv_heads", c.n_kv_heads);
  f.get("ffn_hidden", c.ffn_hidden);
  f.get("max_seq_len", c.max_seq_len);
  f.get("attention", c.attention);
  f.get("residual", c.residual);
  f.get("attnres_block_size", c.attnres_block_size);
  f.get("rope", c.rope);
  f.get("rope_theta", c.rope_theta);
  f.get("tie_embeddings", c.tie_embeddings);
  f.get("norm_eps", c.norm_eps);
  f.get("diff_subln_affine", c.diff_subln_affine);
  f.get("attnres_key_norm_affine", c.attnres_key_norm_affine);
  f.finish();
  (void)c.resolved();  // validate now, so the error names the file
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  if (path.empty()) return ModelConfig{};
  return from_json(read_json_file(path), path);
}

ModelConfig ModelConfig::resolved() const {
  ModelConfig c = *this;
  if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
  if (c.ffn_hidden == 0) c.ffn_hidden = ((8 * c.d_model / 3) + 63) / 64 * 64;
  const char* w = "model config";
  one_of(w, "attention", c.attention, {"mha", "diff"});
  one_of(w, "residual", c.residual, {"standard", "attnres_full", "attnres_block"});
  KILN_CHECK(c.vocab_size >= 1, "{}: vocab_size must be >= 1, got {}", w, c.vocab_size);
  KILN_CHECK(c.d_model >= 1, "{}: d_model must be >= 1, got {}", w, c.d_model);
  KILN_CHECK(c.n_layers >= 0, "{}: n_layers must be >= 0, got {}", w, c.n_layers);
  KILN_CHECK(c.n_heads >= 1, "{}: n_heads must be >= 1, got {}", w, c.n_heads);
  KILN_CHECK(c.n_kv_heads >= 1 && c.n_heads % c.n_kv_heads == 0,
             "{}: n_heads ({}) must be a multiple of n_kv_heads ({})", w, c.n_heads, c.n_kv_heads);
  KILN_CHECK(c.ffn_hidden >= 1, "{}: ffn_hidden must be >= 1, got {}", w, c.ffn_hidden);
  KILN_CHECK(c.max_seq_len >= 1, "{}: max_seq_len must be >= 1, got {}", w, c.max_seq_len);
  KILN_CHECK(c.norm_eps > 0, "{}: norm_eps must be > 0, got {}", w, c.norm_eps);
  KILN_CHECK(c.rope_theta > 0, "{}: rope_theta must be > 0, got {}", w, c.rope_theta);
  KILN_CHECK(c.attnres_block_size >= 1, "{}: attnres_block_size must be >= 1, got {}", w, c.attnres_block_size);
  if (c.attention == "diff") {
    KILN_CHECK(c.d_model % (2 * c.n_heads) == 0, "{}: attention \"diff\" needs d_model ({}) divisible by 2·n_heads ({})", w,
               c.d_model, 2 * c.n_heads);
    if (c.rope)
      KILN_CHECK((c.d_model / c.n_heads / 2) % 2 == 0,
                 "{}: RoPE needs an even sub-head width; d_model / n_heads / 2 = {} is odd", w, c.d_model / c.n_heads / 2);
  } else {
    KILN_CHECK(c.d_model % c.n_heads == 0, "{}: d_model ({}) must be divisible by n_heads ({})", w, c.d_model, c.n_heads);
    if (c.rope)
      KILN_CHECK((c.d_model / c.n_heads) % 2 == 0, "{}: RoPE needs an even head width; d_model / n_heads = {} is odd", w,
                 c.d_model / c.n_heads);
  }
  return c;
}

json ModelConfig::to_json() const {
  const ModelConfig c = resolved();
  return {{"vocab_size", c.vocab_size}, {"d_model", c.d_model}, {"n_layers", c.n_layers}, {"n_heads", c.n_heads},
          {"n_kv_heads", c.n_kv_heads}, {"ffn_hidden", c.ffn_hidden}, {"max_seq_len", c.max_seq_len},
          {"attention", c.attention}, {"residual", c.residual}, {"attnres_block_size", c.attnres_block_size},
          {"rope", c.rope}, {"rope_theta", c.rope_theta}, {"tie_embeddings", c.tie_embeddings}, {"norm_eps", c.norm_eps},
          {"diff_subln_affine", c.diff_subln_affine}, {"attnres_key_norm_affine", c.attnres_key_norm_affine}};
}

// ---------------------------------------------------------------------------------------- train
TrainConfig TrainConfig::from_json(const json& j, const std::string& where) {
  TrainConfig c;
  Fields f(j, where);
  f.get("batch_size", c.batch_size);
  f.get("seq_len", c.seq_len);
  f.get("steps", c.steps);
  f.get("grad_clip", c.grad_clip);
  f.get("eval_every", c.eval_every);
  f.get("eval_batches", c.eval_batches);
  f.get("checkpoint_every", c.checkpoint_every);
  if (const json* o = f.object("optimizer")) {
    OptimizerConfig& oc = c.optimizer;
    oc = OptimizerConfig{};
    Fields g(*o, where + ": optimizer");
    g.get("name", oc.name);
    one_of(g.where(), "name", oc.name, {"adamw", "adam", "sgd"});
    // Defaults inside a given optimizer object are the reference's (torch's) defaults.
    oc.beta1 = 0.9;
    oc.beta2 = 0.999;
    oc.weight_decay = 0.0;
    g.get("lr", oc.lr);
    if (oc.name == "sgd") {
      g.get("momentum", oc.momentum);
      g.get("dampening", oc.dampening);
      g.get("nesterov", oc.nesterov);
    } else {
      std::vector<double> betas;
      if (const json* b = g.object("betas")) {
        KILN_CHECK(b->is_array() && b->size() == 2 && (*b)[0].is_number() && (*b)[1].is_number(),
                   "{}: 'betas' must be two numbers, got {}", g.where(), b->dump());
        oc.beta1 = (*b)[0].get<double>();
        oc.beta2 = (*b)[1].get<double>();
      }
      g.get("eps", oc.eps);
    }
    g.get("weight_decay", oc.weight_decay);
    g.finish();
  }
  if (const json* s = f.object("schedule")) {
    ScheduleConfig& sc = c.schedule;
    sc = ScheduleConfig{};
    Fields g(*s, where + ": schedule");
    g.get("name", sc.name);
    one_of(g.where(), "name", sc.name, {"constant", "linear", "cosine", "step"});
    if (sc.name != "constant") {
      g.get("warmup_steps", sc.warmup_steps);
      if (sc.name == "step") {
        g.get("step_size", sc.step_size);
        g.get("gamma", sc.gamma);
      } else {
        g.get("min_lr_ratio", sc.min_lr_ratio);
      }
    }
    g.finish();
  }
  f.finish();
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  return c;
}

TrainConfig TrainConfig::load(const std::string& path) {
  if (path.empty()) return TrainConfig{};
  return from_json(read_json_file(path), path);
}

void TrainConfig::validate() const {
  KILN_CHECK(batch_size >= 1, "batch_size must be >= 1, got {}", batch_size);
  KILN_CHECK(seq_len >= 1, "seq_len must be >= 1, got {}", seq_len);
  KILN_CHECK(steps >= 0, "steps must be >= 0, got {}", steps);
  KILN_CHECK(grad_clip >= 0, "grad_clip must be >= 0 (0 = off), got {}", grad_clip);
  KILN_CHECK(optimizer.lr >= 0, "optimizer lr must be >= 0, got {}", optimizer.lr);
  KILN_CHECK(optimizer.beta1 >= 0 && optimizer.beta1 < 1 && optimizer.beta2 >= 0 && optimizer.beta2 < 1,
             "optimizer betas must be in [0, 1), got [{}, {}]", optimizer.beta1, optimizer.beta2);
  KILN_CHECK(optimizer.eps >= 0, "optimizer eps must be >= 0, got {}", optimizer.eps);
  KILN_CHECK(optimizer.weight_decay >= 0, "optimizer weight_decay must be >= 0, got {}", optimizer.weight_decay);
  KILN_CHECK(optimizer.momentum >= 0, "optimizer momentum must be >= 0, got {}", optimizer.momentum);
  KILN_CHECK(!optimizer.nesterov || (optimizer.momentum > 0 && optimizer.dampening == 0),
             "optimizer nesterov needs momentum > 0 and dampening 0");
  KILN_CHECK(schedule.warmup_steps >= 0, "schedule warmup_steps must be >= 0, got {}", schedule.warmup_steps);
  KILN_CHECK(schedule.min_lr_ratio >= 0, "schedule min_lr_ratio must be >= 0, got {}", schedule.min_lr_ratio);
  KILN_CHECK(schedule.step_size >= 1, "schedule step_size must be >= 1, got {}", schedule.step_size);
  KILN_CHECK(eval_every >= 0 && eval_batches >= 1 && checkpoint_every >= 0,
             "eval_every/checkpoint_every must be >= 0 and eval_batches >= 1");
}

json TrainConfig::to_json() const {
  json o = {{"name", optimizer.name}, {"lr", optimizer.lr}, {"weight_decay", optimizer.weight_decay}};
  if (optimizer.name == "sgd") {
    o["momentum"] = optimizer.momentum;
    o["dampening"] = optimizer.dampening;
    o["nesterov"] = optimizer.nesterov;
  } else {
    o["betas"] = {optimizer.beta1, optimizer.beta2};
    o["eps"] = optimizer.eps;
  }
  json s = {{"name", schedule.name}};
  if (schedule.name != "constant") s["warmup_steps"] = schedule.warmup_steps;
  if (schedule.name == "step") {
    s["step_size"] = schedule.step_size;
    s["gamma"] = schedule.gamma;
  } else if (schedule.name != "constant") {
    s["min_lr_ratio"] = schedule.min_lr_ratio;
  }
  return {{"batch_size", batch_size}, {"seq_len", seq_len}, {"steps", steps}, {"grad_clip", grad_clip},
          {"optimizer", o}, {"schedule", s}, {"eval_every", eval_every}, {"eval_batches", eval_batches},
          {"checkpoint_every", checkpoint_every}};
}

}  // namespace kiln
