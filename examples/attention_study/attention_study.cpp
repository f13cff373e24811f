// A small, honest comparison of the GPT family's attention and residual variants at equal parameter
// count: MHA vs Differential attention (docs/specs.md §1), each with standard residuals or Block Attention
// Residuals (docs/specs.md §2). Every variant sees the same seed, the same batches in the same order and the
// same optimizer and schedule. Two tasks:
//
//   lm      character-level language modelling on Debian's fortunes corpus (assembled as
//           scripts/train_demo.sh does; the last 5% held out); metric: held-out loss, nats/char.
//   recall  synthetic multi-query associative recall: K key→value pairs (distinct keys from one vocab
//           range, values from another) scattered among distractor tokens, then Q queries, each a key
//           followed by its value. The loss is taken only where the next token is a queried value
//           (ignore_index = -100 elsewhere); metric: retrieval accuracy (argmax at the query
//           positions) on a held-out set generated from another seed.
//
//   example_attention_study [--task all|lm|recall] [--variants mha,diff,mha+attnres_block,...]
//       [--seeds 0,1] [--lm-seeds 0] [--out DIR] [--corpus FILE] and the sizes below (--help lists them)
//
// Writes DIR/curves.csv (task,variant,seed,step,metric,value), DIR/summary.csv and DIR/summary.json
// (one row per run: parameters, final metric, step time) and DIR/configs.json (the model configs).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <kiln/autograd/var.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/optimizer.hpp>
#include <kiln/optim/schedule.hpp>
#include <kiln/train/data.hpp>
#include <kiln/train/text.hpp>
#include <kiln/train/trainer.hpp>

using namespace kiln;
namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------------------------------------
// Options

struct TaskSizes {
  int64_t d_model, n_layers, mha_heads, ffn_hidden, seq_len, batch, steps, warmup, eval_every, block_size;
  double lr;
};

struct Options {
  std::string task = "all";
  std::vector<std::string> variants = {"mha", "diff", "mha+attnres_block", "diff+attnres_block"};
  std::vector<int64_t> seeds = {0, 1};  // recall
  std::vector<int64_t> lm_seeds = {0};
  std::string out = "examples/attention_study/results";
  std::string corpus;  // "" = the fortunes corpus
  // lm: d 128, 4 layers, MHA 8 heads (head width 16) vs Diff 4 heads (sub-head width 16).
  TaskSizes lm{128, 4, 8, 0, 128, 16, 200, 20, 25, 2, 3e-3};
  // recall: d 64, 2 layers, MHA 4 heads vs Diff 2 heads, T 32.
  TaskSizes rc{64, 2, 4, 0, 32, 32, 1000, 50, 100, 2, 5e-3};
  int64_t lm_eval_batches = 8;
  // recall data
  int64_t n_pairs = 4, n_queries = 4, n_keys = 16, n_values = 16, n_distractors = 8, n_eval = 512;
  int64_t eval_data_seed = 12345;
  int64_t log_every = 50;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

int64_t parse_int(const std::string& flag, const std::string& v, int64_t min) {
  size_t pos = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  KILN_CHECK(pos == v.size() && !v.empty(), "attention_study: {} wants an integer, got '{}'", flag, v);
  KILN_CHECK(x >= min, "attention_study: {} must be ≥ {}, got {}", flag, min, x);
  return x;
}

double parse_double(const std::string& flag, const std::string& v) {
  size_t pos = 0;
  double x = 0;
  try {
    x = std::stod(v, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  KILN_CHECK(pos == v.size() && !v.empty() && std::isfinite(x) && x > 0, "attention_study: {} wants a positive number, got '{}'", flag, v);
  return x;
}

const char* kHelp = R"(example_attention_study: MHA vs Diff attention, standard vs Block AttnRes residuals, at equal size.
  --task all|lm|recall        which task(s) (default all)
  --variants LIST             comma-separated, each ATTN[+RESIDUAL] with ATTN mha|diff and RESIDUAL
                              standard|attnres_block|attnres_full
                              (default mha,diff,mha+attnres_block,diff+attnres_block)
  --seeds LIST                recall seeds (model init and data order; default 0,1)
  --lm-seeds LIST             lm seeds (default 0)
  --out DIR                   results folder (default examples/attention_study/results)
  --corpus FILE               lm text (default: the fortunes corpus in /usr/share/games/fortunes)
  --{lm,recall}-steps N       training steps (200 / 1000)
  --{lm,recall}-d-model N     (128 / 64)        --{lm,recall}-layers N     (4 / 2)
  --{lm,recall}-heads N       MHA heads; Diff gets N/2 (8 / 4)
  --{lm,recall}-ffn N         SwiGLU hidden width, 0 = ceil64(8d/3) (0 / 0)
  --{lm,recall}-seq N         sequence length (128 / 32)
  --{lm,recall}-batch N       batch size (16 / 32)
  --{lm,recall}-lr X          peak AdamW learning rate (3e-3 / 5e-3)
  --{lm,recall}-warmup N      warmup steps of the cosine schedule (20 / 50)
  --{lm,recall}-eval-every N  evaluation interval in steps (25 / 100)
  --{lm,recall}-block-size N  attnres_block_size (2 / 2)
  --lm-eval-batches N         held-out batches per evaluation (8)
  --pairs N --queries N --keys N --values N --distractors N --eval-seqs N --eval-data-seed N
                              recall data (4, 4, 16, 16, 8, 512, 12345)
)";

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--help" || f == "-h") {
      std::fputs(kHelp, stdout);
      std::exit(0);
    }
    KILN_CHECK(i + 1 < argc, "attention_study: {} needs a value (see --help)", f);
    const std::string v = argv[++i];
    auto sizes = [&](const std::string& prefix, TaskSizes& t) -> bool {
      if (!f.starts_with(prefix)) return false;
      const std::string k = f.substr(prefix.size());
      if (k == "steps")
        t.steps = parse_int(f, v, 1);
      else if (k == "d-model")
        t.d_model = parse_int(f, v, 1);
      else if (k == "layers")
        t.n_layers = parse_int(f, v, 1);
      else if (k == "heads")
        t.mha_heads = parse_int(f, v, 2);
      else if (k == "ffn")
        t.ffn_hidden = parse_int(f, v, 0);
      else if (k == "seq")
        t.seq_len = parse_int(f, v, 2);
      else if (k == "batch")
        t.batch = parse_int(f, v, 1);
      else if (k == "lr")
        t.lr = parse_double(f, v);
      else if (k == "warmup")
        t.warmup = parse_int(f, v, 0);
      else if (k == "eval-every")
        t.eval_every = parse_int(f, v, 1);
      else if (k == "block-size")
        t.block_size = parse_int(f, v, 1);
      else
        return false;
      return true;
    };
    auto int_list = [&](std::vector<int64_t>& dst) {
      dst.clear();
      for (const auto& s : split(v, ',')) dst.push_back(parse_int(f, s, 0));
    };
    if (f == "--task") {
      KILN_CHECK(v == "all" || v == "lm" || v == "recall", "attention_study: --task is all, lm or recall, got '{}'", v);
      o.task = v;
    } else if (f == "--variants") {
      o.variants = split(v, ',');
    } else if (f == "--seeds") {
      int_list(o.seeds);
    } else if (f == "--lm-seeds") {
      int_list(o.lm_seeds);
    } else if (f == "--out") {
      o.out = v;
    } else if (f == "--corpus") {
      o.corpus = v;
    } else if (f == "--lm-eval-batches") {
      o.lm_eval_batches = parse_int(f, v, 1);
    } else if (f == "--pairs") {
      o.n_pairs = parse_int(f, v, 1);
    } else if (f == "--queries") {
      o.n_queries = parse_int(f, v, 1);
    } else if (f == "--keys") {
      o.n_keys = parse_int(f, v, 1);
    } else if (f == "--values") {
      o.n_values = parse_int(f, v, 1);
    } else if (f == "--distractors") {
      o.n_distractors = parse_int(f, v, 1);
    } else if (f == "--eval-seqs") {
      o.n_eval = parse_int(f, v, 1);
    } else if (f == "--eval-data-seed") {
      o.eval_data_seed = parse_int(f, v, 0);
    } else if (!sizes("--lm-", o.lm) && !sizes("--recall-", o.rc)) {
      throw Error(fmt::format("attention_study: unknown flag '{}' (see --help)", f));
    }
  }
  KILN_CHECK(o.n_queries <= o.n_pairs, "attention_study: --queries ({}) must be ≤ --pairs ({})", o.n_queries, o.n_pairs);
  KILN_CHECK(o.n_pairs <= o.n_keys, "attention_study: --pairs ({}) must be ≤ --keys ({})", o.n_pairs, o.n_keys);
  KILN_CHECK(o.rc.seq_len >= 2 * o.n_pairs + 2 * o.n_queries,
             "attention_study: --recall-seq ({}) must hold 2·pairs + 2·queries = {} tokens", o.rc.seq_len, 2 * o.n_pairs + 2 * o.n_queries);
  KILN_CHECK(!o.seeds.empty() && !o.lm_seeds.empty(), "attention_study: empty seed list");
  return o;
}

// ---------------------------------------------------------------------------------------------
// Variants and configs

struct Variant {
  std::string name, attention, residual;
};

Variant parse_variant(const std::string& s) {
  const auto parts = split(s, '+');
  KILN_CHECK(parts.size() <= 2 && (parts[0] == "mha" || parts[0] == "diff"),
             "attention_study: variant '{}' is not ATTN[+RESIDUAL] with ATTN mha|diff", s);
  Variant v{s, parts[0], parts.size() == 2 ? parts[1] : "standard"};
  KILN_CHECK(v.residual == "standard" || v.residual == "attnres_block" || v.residual == "attnres_full",
             "attention_study: variant '{}': residual is standard, attnres_block or attnres_full", s);
  return v;
}

// A Diff model with h heads has the projections of an MHA model with 2h heads (docs/specs.md §1).
ModelConfig make_config(const TaskSizes& t, const Variant& v, int64_t vocab) {
  KILN_CHECK(t.mha_heads % 2 == 0, "attention_study: MHA heads must be even (Diff gets half), got {}", t.mha_heads);
  ModelConfig c;
  c.vocab_size = vocab;
  c.d_model = t.d_model;
  c.n_layers = t.n_layers;
  c.n_heads = v.attention == "diff" ? t.mha_heads / 2 : t.mha_heads;
  c.ffn_hidden = t.ffn_hidden;
  c.max_seq_len = t.seq_len;
  c.attention = v.attention;
  c.residual = v.residual;
  c.attnres_block_size = t.block_size;
  c.rope = true;
  c.tie_embeddings = false;
  return c.resolved();
}

// ---------------------------------------------------------------------------------------------
// Data

// splitmix64: a small portable generator, so the data are the same on every platform.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  template <class T> void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<size_t>(below(static_cast<int64_t>(i)))]);
  }
};

// Token ranges: distractors [0, nd), keys [nd, nd+nk), values [nd+nk, nd+nk+nv).
struct RecallBatch {
  std::vector<int64_t> x, y;  // [n, T]; y = -100 except at query keys, where it is the value
};

RecallBatch recall_batch(const Options& o, int64_t n, uint64_t seed) {
  const int64_t T = o.rc.seq_len, nd = o.n_distractors, nk = o.n_keys, K = o.n_pairs, Q = o.n_queries;
  const int64_t ctx = T - 2 * Q;  // context: K pairs and ctx − 2K distractors; then Q (key, value) queries
  Rng rng{seed};
  RecallBatch b;
  b.x.reserve(static_cast<size_t>(n * T));
  b.y.assign(static_cast<size_t>(n * T), -100);
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int64_t> keys(static_cast<size_t>(nk));
    for (int64_t i = 0; i < nk; ++i) keys[static_cast<size_t>(i)] = nd + i;
    rng.shuffle(keys);
    keys.resize(static_cast<size_t>(K));
    std::vector<int64_t> vals(static_cast<size_t>(K));
    for (auto& v : vals) v = nd + nk + rng.below(o.n_values);  // values may repeat
    // Items: pair i as −(i+1), a distractor as its token; shuffled so pairs land at any offset.
    std::vector<int64_t> items;
    for (int64_t i = 0; i < K; ++i) items.push_back(-(i + 1));
    for (int64_t i = 0; i < ctx - 2 * K; ++i) items.push_back(rng.below(nd));
    rng.shuffle(items);
    for (int64_t it : items) {
      if (it < 0) {
        b.x.push_back(keys[static_cast<size_t>(-it - 1)]);
        b.x.push_back(vals[static_cast<size_t>(-it - 1)]);
      } else {
        b.x.push_back(it);
      }
    }
    std::vector<int64_t> order(static_cast<size_t>(K));
    for (int64_t i = 0; i < K; ++i) order[static_cast<size_t>(i)] = i;
    rng.shuffle(order);
    for (int64_t q = 0; q < Q; ++q) {
      const auto i = static_cast<size_t>(order[static_cast<size_t>(q)]);
      b.y[b.x.size()] = vals[i];  // the key at this position predicts its value
      b.x.push_back(keys[i]);
      b.x.push_back(vals[i]);
    }
  }
  return b;
}

uint64_t mix(uint64_t a, uint64_t b) {
  Rng r{a * 0x100000001B3ULL ^ (b + 0x51ED270B27A4B3C5ULL)};
  return r.next();
}

// ---------------------------------------------------------------------------------------------
// Training

struct Curves {
  std::ofstream csv;
  void add(const std::string& task, const std::string& variant, int64_t seed, int64_t step, const std::string& metric, double value) {
    csv << task << ',' << variant << ',' << seed << ',' << step << ',' << metric << ',' << fmt::format("{:.6g}", value) << '\n';
    csv.flush();
  }
};

struct RunResult {
  std::string task, variant;
  int64_t seed = 0, params = 0, steps = 0;
  double final_metric = 0, final_train_loss = 0, ms_per_step = 0, wall_s = 0;
  std::string metric;
};

template <Backend B> struct Trainer {
  nn::GPT<B>& model;
  const TaskSizes& t;
  optim::Adam<B> opt;
  LrSchedule schedule;
  std::vector<Var<B>> params;
  Trainer(nn::GPT<B>& m, const TaskSizes& sizes)
      : model(m),
        t(sizes),
        opt(optim::decay_groups(m.named_parameters(), sizes.lr, 0.1),
            {.lr = sizes.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .decoupled = true}),
        schedule{.name = "cosine", .warmup_steps = sizes.warmup, .min_lr_ratio = 0.1},
        params(m.parameters()) {}
  // One step; returns the loss.
  double step(int64_t s, const Tensor<B>& x, const Tensor<B>& y) {
    opt.set_lr(schedule.at(t.lr, s, t.steps));
    opt.zero_grad();
    const Var<B> logits = model(x);
    const Var<B> loss = nn::cross_entropy(logits.reshape({-1, model.config().vocab_size}), y.reshape({-1}));
    loss.backward();
    optim::clip_grad_norm(params, 1.0);
    opt.step();
    return loss.template item<double>();
  }
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

template <Backend B> RunResult run_lm(const Options& o, const Variant& v, int64_t seed, int64_t vocab, const TokenData& train,
                                      const TokenData& eval, Curves& curves, nlohmann::json& configs) {
  const TaskSizes& t = o.lm;
  const ModelConfig cfg = make_config(t, v, vocab);
  configs["lm"][v.name] = cfg.to_json();
  nn::GPT<B> model(cfg);
  model.init_weights(static_cast<uint64_t>(seed));
  Trainer<B> tr(model, t);
  RunResult res;
  res.task = "lm";
  res.variant = v.name;
  res.seed = seed;
  res.params = model.num_parameters();
  res.steps = t.steps;
  res.metric = "val_loss";
  fmt::print("[lm] {:<20} seed {} params {}\n", v.name, seed, res.params);
  auto do_eval = [&](int64_t step) {
    model.eval();
    const double ev = evaluate(model, eval, o.lm_eval_batches, t.batch, t.seq_len);
    model.train();
    curves.add("lm", v.name, seed, step, "val_loss", ev);
    return ev;
  };
  const auto t0 = Clock::now();
  double train_s = 0, smooth = 0;
  // Data order: the seed offsets the batch stream (seed 0 is the corpus from the start).
  const int64_t offset = seed * 7919;
  for (int64_t s = 0; s < t.steps; ++s) {
    const auto [x, y] = train.batch<B>(s + offset, t.batch, t.seq_len);
    const auto ts = Clock::now();
    const double loss = tr.step(s, x, y);
    train_s += seconds_since(ts);
    KILN_CHECK(std::isfinite(loss), "attention_study: lm {} loss became {} at step {}", v.name, loss, s);
    smooth = s == 0 ? loss : 0.95 * smooth + 0.05 * loss;
    curves.add("lm", v.name, seed, s + 1, "train_loss", loss);
    if ((s + 1) % t.eval_every == 0 || s + 1 == t.steps) {
      const double ev = do_eval(s + 1);
      fmt::print("  step {:>5}  train(ema) {:.4f}  val {:.4f}  {:.0f} ms/step\n", s + 1, smooth, ev, 1000 * train_s / double(s + 1));
      std::fflush(stdout);
      if (s + 1 == t.steps) res.final_metric = ev;
    }
  }
  res.final_train_loss = smooth;
  res.ms_per_step = 1000 * train_s / double(t.steps);
  res.wall_s = seconds_since(t0);
  return res;
}

template <Backend B> double recall_accuracy(nn::GPT<B>& model, const Options& o, const RecallBatch& data, int64_t n) {
  NoGrad ng;
  model.eval();
  const int64_t T = o.rc.seq_len, chunk = 64;
  int64_t hit = 0, total = 0;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t m = std::min(chunk, n - r0);
    const auto off = static_cast<std::ptrdiff_t>(r0 * T), len = static_cast<std::ptrdiff_t>(m * T);
    const std::vector<int64_t> xs(data.x.begin() + off, data.x.begin() + off + len);
    const std::vector<int64_t> pred = model(Tensor<B>::from_vector(xs, {m, T})).argmax(-1).template to_vector<int64_t>();
    for (std::ptrdiff_t i = 0; i < len; ++i) {
      const int64_t target = data.y[static_cast<size_t>(off + i)];
      if (target < 0) continue;
      ++total;
      hit += pred[static_cast<size_t>(i)] == target;
    }
  }
  model.train();
  return double(hit) / double(total);
}

template <Backend B>
RunResult run_recall(const Options& o, const Variant& v, int64_t seed, const RecallBatch& eval, Curves& curves, nlohmann::json& configs) {
  const TaskSizes& t = o.rc;
  const int64_t vocab = o.n_distractors + o.n_keys + o.n_values;
  const ModelConfig cfg = make_config(t, v, vocab);
  configs["recall"][v.name] = cfg.to_json();
  nn::GPT<B> model(cfg);
  model.init_weights(static_cast<uint64_t>(seed));
  Trainer<B> tr(model, t);
  RunResult res;
  res.task = "recall";
  res.variant = v.name;
  res.seed = seed;
  res.params = model.num_parameters();
  res.steps = t.steps;
  res.metric = "accuracy";
  fmt::print("[recall] {:<20} seed {} params {}\n", v.name, seed, res.params);
  const auto t0 = Clock::now();
  double train_s = 0, smooth = 0;
  for (int64_t s = 0; s < t.steps; ++s) {
    // Batch s of seed `seed`: a pure function of (seed, s), identical for every variant.
    const RecallBatch b = recall_batch(o, t.batch, mix(static_cast<uint64_t>(seed), static_cast<uint64_t>(s)));
    const auto x = Tensor<B>::from_vector(b.x, {t.batch, t.seq_len});
    const auto y = Tensor<B>::from_vector(b.y, {t.batch, t.seq_len});
    const auto ts = Clock::now();
    const double loss = tr.step(s, x, y);
    train_s += seconds_since(ts);
    KILN_CHECK(std::isfinite(loss), "attention_study: recall {} loss became {} at step {}", v.name, loss, s);
    smooth = s == 0 ? loss : 0.95 * smooth + 0.05 * loss;
    curves.add("recall", v.name, seed, s + 1, "train_loss", loss);
    if ((s + 1) % t.eval_every == 0 || s + 1 == t.steps) {
      const double acc = recall_accuracy(model, o, eval, o.n_eval);
      curves.add("recall", v.name, seed, s + 1, "accuracy", acc);
      fmt::print("  step {:>5}  train(ema) {:.4f}  acc {:.4f}  {:.0f} ms/step\n", s + 1, smooth, acc, 1000 * train_s / double(s + 1));
      std::fflush(stdout);
      if (s + 1 == t.steps) res.final_metric = acc;
    }
  }
  res.final_train_loss = smooth;
  res.ms_per_step = 1000 * train_s / double(t.steps);
  res.wall_s = seconds_since(t0);
  return res;
}

void check_params(const std::vector<RunResult>& rs, const std::string& task) {
  int64_t lo = INT64_MAX, hi = 0;
  for (const auto& r : rs)
    if (r.task == task) lo = std::min(lo, r.params), hi = std::max(hi, r.params);
  if (hi == 0) return;
  const double spread = double(hi - lo) / double(lo);
  fmt::print("[{}] parameter counts {}..{} (spread {:.3f}%)\n", task, lo, hi, 100 * spread);
  if (spread > 0.01) fmt::print("WARNING: [{}] parameter counts differ by more than 1%\n", task);
}

template <Backend B> int study(const Options& o) {
  std::vector<Variant> variants;
  for (const auto& s : o.variants) variants.push_back(parse_variant(s));
  fs::create_directories(o.out);
  Curves curves;
  curves.csv.open(fs::path(o.out) / "curves.csv");
  KILN_CHECK(curves.csv.good(), "attention_study: cannot write '{}'", (fs::path(o.out) / "curves.csv").string());
  curves.csv << "task,variant,seed,step,metric,value\n";
  nlohmann::json configs;
  std::vector<RunResult> results;
  const auto t0 = Clock::now();

  if (o.task == "all" || o.task == "lm") {
    const std::string text = o.corpus.empty() ? fortunes_corpus("/usr/share/games/fortunes") : read_text_file(o.corpus);
    const CharTokenizer tok = CharTokenizer::fit(text);
    const std::vector<int64_t> ids = tok.encode(text);
    const auto cut = static_cast<std::ptrdiff_t>(static_cast<double>(ids.size()) * 0.95);
    const TokenData train(std::vector<int64_t>(ids.begin(), ids.begin() + cut), "train");
    const TokenData eval(std::vector<int64_t>(ids.begin() + cut, ids.end()), "eval");
    fmt::print("[lm] corpus {} characters (train {}, held out {}), vocabulary {}\n", ids.size(), train.size(), eval.size(),
               tok.vocab_size());
    configs["lm_data"] = {{"characters", ids.size()},
                          {"train", train.size()},
                          {"eval", eval.size()},
                          {"vocab", tok.vocab_size()},
                          {"eval_tokens_per_eval", o.lm_eval_batches * o.lm.batch * o.lm.seq_len}};
    for (int64_t seed : o.lm_seeds)
      for (const auto& v : variants) results.push_back(run_lm<B>(o, v, seed, tok.vocab_size(), train, eval, curves, configs));
  }
  if (o.task == "all" || o.task == "recall") {
    const RecallBatch eval = recall_batch(o, o.n_eval, static_cast<uint64_t>(o.eval_data_seed) ^ 0xE7A1ULL);
    configs["recall_data"] = {{"pairs", o.n_pairs},
                              {"queries", o.n_queries},
                              {"keys", o.n_keys},
                              {"values", o.n_values},
                              {"distractors", o.n_distractors},
                              {"eval_seqs", o.n_eval},
                              {"eval_data_seed", o.eval_data_seed},
                              {"chance", 1.0 / double(o.n_values)}};
    for (int64_t seed : o.seeds)
      for (const auto& v : variants) results.push_back(run_recall<B>(o, v, seed, eval, curves, configs));
  }

  auto sizes_json = [](const TaskSizes& t) {
    return nlohmann::json{{"d_model", t.d_model},
                          {"n_layers", t.n_layers},
                          {"mha_heads", t.mha_heads},
                          {"ffn_hidden", t.ffn_hidden},
                          {"seq_len", t.seq_len},
                          {"batch", t.batch},
                          {"steps", t.steps},
                          {"warmup", t.warmup},
                          {"eval_every", t.eval_every},
                          {"attnres_block_size", t.block_size},
                          {"lr", t.lr},
                          {"optimizer", "AdamW beta (0.9, 0.95) eps 1e-8 wd 0.1 on matrices, clip 1.0"},
                          {"schedule", "cosine to 0.1x after linear warmup"}};
  };
  configs["lm_sizes"] = sizes_json(o.lm);
  configs["recall_sizes"] = sizes_json(o.rc);
  {
    std::ofstream f(fs::path(o.out) / "configs.json");
    f << configs.dump(2) << '\n';
  }

  // Summary table.
  const double total_s = seconds_since(t0);
  nlohmann::json js = nlohmann::json::array();
  std::ofstream sum(fs::path(o.out) / "summary.csv");
  sum << "task,variant,seed,params,steps,metric,final,final_train_loss_ema,ms_per_step,wall_s\n";
  fmt::print("\n{:<7} {:<20} {:>4} {:>9} {:>6} {:>9} {:>10} {:>10} {:>8}\n", "task", "variant", "seed", "params", "steps", "metric",
             "final", "train_ema", "ms/step");
  for (const auto& r : results) {
    fmt::print("{:<7} {:<20} {:>4} {:>9} {:>6} {:>9} {:>10.4f} {:>10.4f} {:>8.0f}\n", r.task, r.variant, r.seed, r.params, r.steps,
               r.metric, r.final_metric, r.final_train_loss, r.ms_per_step);
    sum << fmt::format("{},{},{},{},{},{},{:.6f},{:.6f},{:.2f},{:.2f}\n", r.task, r.variant, r.seed, r.params, r.steps, r.metric,
                       r.final_metric, r.final_train_loss, r.ms_per_step, r.wall_s);
    js.push_back({{"task", r.task},
                  {"variant", r.variant},
                  {"seed", r.seed},
                  {"params", r.params},
                  {"steps", r.steps},
                  {"metric", r.metric},
                  {"final", r.final_metric},
                  {"final_train_loss_ema", r.final_train_loss},
                  {"ms_per_step", r.ms_per_step},
                  {"wall_s", r.wall_s}});
  }
  std::ofstream(fs::path(o.out) / "summary.json") << nlohmann::json{{"runs", js}, {"total_wall_s", total_s}}.dump(2) << '\n';
  check_params(results, "lm");
  check_params(results, "recall");
  fmt::print("study wall time {:.1f} s; results in {}\n", total_s, o.out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return study<Cpu>(parse(argc, argv));
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
