#include "kiln/train/config.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/autograd/loss_ops.hpp"
#include "kiln/core/error.hpp"
#include "kiln/formats/json_fields.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/train/loop.hpp"

namespace kiln {

using json = nlohmann::json;
using detail::Fields;
using detail::one_of;

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
  f.get("eval_at_start", c.eval_at_start);
  f.get("checkpoint_every", c.checkpoint_every);
  f.get("grad_accum", c.grad_accum);
  f.get("on_nonfinite", c.on_nonfinite);
  f.get("precision", c.precision);
  f.get("zero_stage", c.zero_stage);
  f.get("bucket_mb", c.bucket_mb);
  f.get("activation_checkpointing", c.activation_checkpointing);
  f.get("loss_chunk_rows", c.loss_chunk_rows);
  f.get("shuffle", c.shuffle);
  f.get("time_limit_s", c.time_limit_s);
  one_of(where, "on_nonfinite", c.on_nonfinite, {"error", "skip"});
  one_of(where, "precision", c.precision, {"f32", "bf16", "f16"});
  if (const json* o = f.object("optimizer")) {
    OptimizerConfig& oc = c.optimizer;
    oc = OptimizerConfig{};
    Fields g(*o, where + ": optimizer");
    // "type" is a synonym of "name" (one of the two)
    std::string type;
    g.get("type", type);
    KILN_CHECK(type.empty() || !o->contains("name"), "{}: give 'name' or 'type', not both", g.where());
    if (!type.empty()) oc.name = type;
    g.get("name", oc.name);
    one_of(g.where(), o->contains("type") ? "type" : "name", oc.name, {"adamw", "adam", "sgd", "rmsprop", "adagrad", "lion", "adafactor"});
    // Defaults inside a given optimizer object are the reference's (torch's) defaults.
    oc.beta1 = 0.9;
    oc.beta2 = oc.name == "lion" ? 0.99 : 0.999;
    oc.weight_decay = 0.0;
    if (oc.name == "rmsprop" || oc.name == "adagrad" || oc.name == "adafactor") oc.lr = 1e-2;
    if (oc.name == "lion") oc.lr = 1e-4;
    if (oc.name == "adagrad") oc.eps = 1e-10;
    g.get("lr", oc.lr);
    if (oc.name == "rmsprop") {
      g.get("alpha", oc.alpha);
      g.get("eps", oc.eps);
      g.get("momentum", oc.momentum);
      g.get("centered", oc.centered);
    } else if (oc.name == "adagrad") {
      g.get("lr_decay", oc.lr_decay);
      g.get("initial_accumulator_value", oc.initial_accumulator_value);
      g.get("eps", oc.eps);
    } else if (oc.name == "adafactor") {
      g.get("beta2_decay", oc.beta2_decay);
      double eps1 = -1;
      g.get("eps1", eps1);
      if (o->contains("eps1")) oc.eps1 = eps1;
      g.get("eps2", oc.eps2);
      g.get("d", oc.d);
    } else if (oc.name == "sgd") {
      g.get("momentum", oc.momentum);
      g.get("dampening", oc.dampening);
      g.get("nesterov", oc.nesterov);
    } else {
      std::vector<double> betas;
      if (const json* b = g.object("betas")) {
        KILN_CHECK(b->is_array() && b->size() == 2 && (*b)[0].is_number() && (*b)[1].is_number(), "{}: 'betas' must be two numbers, got {}",
                   g.where(), b->dump());
        oc.beta1 = (*b)[0].get<double>();
        oc.beta2 = (*b)[1].get<double>();
      }
      if (oc.name != "lion") g.get("eps", oc.eps);
    }
    g.get("weight_decay", oc.weight_decay);
    g.finish();
  }
  if (const json* s = f.object("scheduler")) {
    KILN_CHECK(!j.contains("schedule"), "{}: give 'schedule' or 'scheduler', not both", where);
    SchedulerConfig sc;
    Fields g(*s, where + ": scheduler");
    g.get("type", sc.type);
    one_of(g.where(), "type", sc.type, {"step", "multistep", "exponential", "cosine", "cosine_warm_restarts", "linear", "onecycle"});
    const std::string& t = sc.type;
    if (t == "step") {
      g.get("step_size", sc.step_size);
      KILN_CHECK(s->contains("step_size"), "{}: step needs 'step_size'", g.where());
    }
    if (t == "multistep") {
      if (const json* m = g.object("milestones")) {
        KILN_CHECK(m->is_array(), "{}: 'milestones' must be an array of integers, got {}", g.where(), m->dump());
        for (const json& v : *m) {
          KILN_CHECK(v.is_number_integer(), "{}: 'milestones' must be an array of integers, got {}", g.where(), m->dump());
          sc.milestones.push_back(v.get<int64_t>());
        }
      }
    }
    if (t == "step" || t == "multistep" || t == "exponential") g.get("gamma", sc.gamma);
    if (t == "exponential") KILN_CHECK(s->contains("gamma"), "{}: exponential needs 'gamma'", g.where());
    if (t == "cosine") g.get("T_max", sc.T_max);
    if (t == "cosine_warm_restarts") {
      g.get("T_0", sc.T_0);
      g.get("T_mult", sc.T_mult);
      KILN_CHECK(s->contains("T_0"), "{}: cosine_warm_restarts needs 'T_0'", g.where());
    }
    if (t == "cosine" || t == "cosine_warm_restarts") g.get("eta_min", sc.eta_min);
    if (t == "linear") {
      g.get("start_factor", sc.start_factor);
      g.get("end_factor", sc.end_factor);
      g.get("total_iters", sc.total_iters);
    }
    if (t == "onecycle") {
      g.get("max_lr", sc.max_lr);
      g.get("total_steps", sc.total_steps);
      g.get("pct_start", sc.pct_start);
      g.get("anneal_strategy", sc.anneal_strategy);
      g.get("div_factor", sc.div_factor);
      g.get("final_div_factor", sc.final_div_factor);
      g.get("three_phase", sc.three_phase);
      g.get("cycle_momentum", sc.cycle_momentum);
      g.get("base_momentum", sc.base_momentum);
      g.get("max_momentum", sc.max_momentum);
    }
    g.finish();
    c.scheduler = sc;
  }
  if (const json* e = f.object("ema")) {
    EmaConfig ec;
    Fields g(*e, where + ": ema");
    g.get("decay", ec.decay);
    g.get("warmup", ec.warmup);
    g.finish();
    c.ema = ec;
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
  if (const json* l = f.object("lora")) {
    Fields g(*l, where + ": lora");
    g.get("r", c.lora.r);
    g.get("alpha", c.lora.alpha);
    g.get("dropout", c.lora.dropout);
    if (const json* t = g.object("target_modules")) {
      KILN_CHECK(t->is_array() && !t->empty(), "{}: 'target_modules' must be a non-empty list of names, got {}", g.where(), t->dump());
      c.lora.target_modules.clear();
      for (const auto& n : *t) {
        KILN_CHECK(n.is_string(), "{}: 'target_modules' entries must be strings, got {}", g.where(), n.dump());
        c.lora.target_modules.push_back(n.get<std::string>());
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

int64_t TrainConfig::loss_chunk(int64_t tokens, int64_t vocab) const {
  const bool fused = loss_chunk_rows > 0 || (loss_chunk_rows == 0 && nn::logits_exceed_chunk(tokens, vocab));
  return fused ? nn::linear_cross_entropy_chunk(vocab, loss_chunk_rows) : 0;
}

std::string TrainConfig::loss_chunk_note(int64_t tokens, int64_t vocab) const {
  const int64_t chunk = loss_chunk(tokens, vocab);
  if (chunk == 0) return {};
  return fmt::format(
      "kiln train: LM head and cross-entropy fused, {} of the step's {} token rows per chunk (the [{}, {}] logits never made whole)\n",
      autograd::balanced_chunk_rows(tokens, chunk), tokens, tokens, vocab);
}

std::string TrainConfig::time_limit_note() const {
  if (time_limit_s <= 0) return {};
  return fmt::format("kiln train: time limit {:g} s: after {} steps the run plans the steps that fit, its schedule ending with them\n",
                     time_limit_s, kTimePlanSkip + kTimePlanSteps);
}

void TrainConfig::validate() const {
  KILN_CHECK(batch_size >= 1, "batch_size must be >= 1, got {}", batch_size);
  KILN_CHECK(seq_len >= 1, "seq_len must be >= 1, got {}", seq_len);
  KILN_CHECK(steps >= 1, "steps must be >= 1, got {}", steps);
  KILN_CHECK(grad_accum >= 1, "grad_accum must be >= 1, got {}", grad_accum);
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
  KILN_CHECK(std::isfinite(schedule.gamma) && schedule.gamma >= 0,
             "schedule gamma must be >= 0 (a negative one gives negative learning rates), got {}", schedule.gamma);
  KILN_CHECK(loss_chunk_rows >= -1, "loss_chunk_rows must be -1 (never fused), 0 (automatic) or a row count, got {}", loss_chunk_rows);
  KILN_CHECK(std::isfinite(time_limit_s) && time_limit_s >= 0, "time_limit_s must be >= 0 seconds (0 = none), got {}", time_limit_s);
  KILN_CHECK(zero_stage == 0 || zero_stage == 1, "zero_stage must be 0 or 1 (ZeRO-1: sharded optimizer state), got {}", zero_stage);
  KILN_CHECK(zero_stage == 0 || optimizer.name == "adamw" || optimizer.name == "adam" || optimizer.name == "sgd",
             "zero_stage 1 shards adamw, adam or sgd, not optimizer '{}'", optimizer.name);
  if (ema) KILN_CHECK(ema->decay >= 0 && ema->decay <= 1, "ema decay must be in [0, 1], got {}", ema->decay);
  KILN_CHECK(bucket_mb > 0 && std::isfinite(bucket_mb), "bucket_mb must be > 0, got {}", bucket_mb);
  KILN_CHECK(eval_every >= 0 && eval_batches >= 1 && checkpoint_every >= 0,
             "eval_every/checkpoint_every must be >= 0 and eval_batches >= 1");
  KILN_CHECK(lora.r >= 0, "lora r must be >= 0 (0 = no adapters), got {}", lora.r);
  KILN_CHECK(lora.dropout >= 0 && lora.dropout < 1, "lora dropout must be in [0, 1), got {}", lora.dropout);
  KILN_CHECK(std::isfinite(lora.alpha), "lora alpha must be finite, got {}", lora.alpha);
}

json TrainConfig::to_json() const {
  json o = {{"name", optimizer.name}, {"lr", optimizer.lr}, {"weight_decay", optimizer.weight_decay}};
  if (optimizer.name == "rmsprop") {
    o["alpha"] = optimizer.alpha;
    o["eps"] = optimizer.eps;
    o["momentum"] = optimizer.momentum;
    o["centered"] = optimizer.centered;
  } else if (optimizer.name == "adagrad") {
    o["lr_decay"] = optimizer.lr_decay;
    o["initial_accumulator_value"] = optimizer.initial_accumulator_value;
    o["eps"] = optimizer.eps;
  } else if (optimizer.name == "adafactor") {
    o["beta2_decay"] = optimizer.beta2_decay;
    if (optimizer.eps1) o["eps1"] = *optimizer.eps1;
    o["eps2"] = optimizer.eps2;
    o["d"] = optimizer.d;
  } else if (optimizer.name == "lion") {
    o["betas"] = {optimizer.beta1, optimizer.beta2};
  } else if (optimizer.name == "sgd") {
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
  json out = {{"batch_size", batch_size},
              {"seq_len", seq_len},
              {"steps", steps},
              {"grad_clip", grad_clip},
              {"optimizer", o},
              {"schedule", s},
              {"eval_every", eval_every},
              {"eval_batches", eval_batches},
              {"eval_at_start", eval_at_start},
              {"checkpoint_every", checkpoint_every},
              {"grad_accum", grad_accum},
              {"on_nonfinite", on_nonfinite},
              {"precision", precision},
              {"zero_stage", zero_stage},
              {"bucket_mb", bucket_mb},
              {"activation_checkpointing", activation_checkpointing},
              {"loss_chunk_rows", loss_chunk_rows},
              {"shuffle", shuffle},
              {"time_limit_s", time_limit_s}};
  if (lora.r > 0) {
    out["lora"] = {{"r", lora.r}, {"alpha", lora.alpha}, {"dropout", lora.dropout}};
    if (!lora.target_modules.empty()) out["lora"]["target_modules"] = lora.target_modules;  // absent: the model's default
  }
  if (ema) out["ema"] = {{"decay", ema->decay}, {"warmup", ema->warmup}};
  if (scheduler) {
    const SchedulerConfig& sc = *scheduler;
    const std::string& t = sc.type;
    json j = {{"type", t}};
    if (t == "step") j["step_size"] = sc.step_size;
    if (t == "multistep") j["milestones"] = sc.milestones;
    if (t == "step" || t == "multistep" || t == "exponential") j["gamma"] = sc.gamma;
    if (t == "cosine") j["T_max"] = sc.T_max;
    if (t == "cosine_warm_restarts") {
      j["T_0"] = sc.T_0;
      j["T_mult"] = sc.T_mult;
    }
    if (t == "cosine" || t == "cosine_warm_restarts") j["eta_min"] = sc.eta_min;
    if (t == "linear") j.update({{"start_factor", sc.start_factor}, {"end_factor", sc.end_factor}, {"total_iters", sc.total_iters}});
    if (t == "onecycle")
      j.update({{"max_lr", sc.max_lr},
                {"total_steps", sc.total_steps},
                {"pct_start", sc.pct_start},
                {"anneal_strategy", sc.anneal_strategy},
                {"div_factor", sc.div_factor},
                {"final_div_factor", sc.final_div_factor},
                {"three_phase", sc.three_phase},
                {"cycle_momentum", sc.cycle_momentum},
                {"base_momentum", sc.base_momentum},
                {"max_momentum", sc.max_momentum}});
    out["scheduler"] = j;
    out.erase("schedule");  // one or the other
  }
  return out;
}

}  // namespace kiln
