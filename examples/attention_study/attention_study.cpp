// The attention study (docs/attention_study.md): MHA, Differential attention (Diff, docs/specs.md §1) and
// Differential attention V2 (Diff V2, §1b), each with standard residuals or Block Attention Residuals
// (§2), at equal parameter count and equal training FLOPs, over several seeds. Three tasks:
//
//   lm      character-level language modelling on Debian's fortunes corpus (assembled as
//           scripts/train_demo.sh does; the last 5% held out). Held-out loss against training FLOPs
//           (nn::gpt_flops), the AttnRes "compute advantage", then on the trained models: activation
//           outliers (probe.hpp) and per-token generation time with the KV cache (nn::generate).
//   bpe     the same LM task on a byte-level BPE tokenization of the same split: the tokenizer is
//           trained by kiln (text::train_bpe_json) on the training part only; held-out loss per token
//           and per byte (= per character of the char task: the corpus is ASCII).
//   budgets the base variants (mha, diff, diff2) of the lm task trained again to several budgets
//           (--budgets, × the lm budget, each with its own full cosine schedule); the compute at which
//           a base reaches each model's final loss, interpolated linearly in log FLOPs between budgets.
//   recall  multi-query associative recall: K key→value pairs among distractor tokens, then Q < K
//           queries (a key, then its value); loss and accuracy only where a queried value is next.
//   needle  needle in context: one queried pair among decoy pairs at a random depth of a sequence of
//           distractors, at several context lengths (trained on all of them in turn, scored at each).
//
// Equal parameters: every variant's SwiGLU width is set so its parameter count is the plain MHA
// model's (to within one ffn unit, 3·D·layers parameters). Equal training FLOPs: every variant trains
// on budget / (its FLOPs per step) steps, the budget being the plain MHA model's steps × FLOPs per step.
//
//   example_attention_study [--scale full|reduced|tiny] [--task all|lm,recall,needle] [--variants ...]
//       [--seeds 0,1,2] [--out DIR] [--corpus FILE] and the sizes (--help lists them)
//   example_attention_study --self-test     checks the statistics on samples with known answers
//   example_attention_study --smoke         self-test, then every task at the tiny scale in a temporary
//                                           folder, checks the outputs are complete and consistent, removes it
//
// Writes to DIR: curves.csv (task,variant,seed,step,flops,metric,value; train loss every 10th step), runs.csv and summary.json (one
// row per run, every metric), aggregate.csv (task,variant,metric,n,mean,std over seeds), advantage.csv
// (compute advantage per seed), gen.csv (every generation timing) and configs.json (the exact configs);
// with budgets: budgets.csv (base, seed, scale, steps, FLOPs, final held-out loss) and
// budget_advantage.csv (the several-budget compute advantage per seed); with bpe: bpe_tokenizer.json.
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <kiln/autograd/var.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/core/atomic_file.hpp>
#include <kiln/nn/generate.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/optimizer.hpp>
#include <kiln/optim/schedule.hpp>
#include <kiln/text/bpe_trainer.hpp>
#include <kiln/text/tokenizer.hpp>
#include <kiln/train/data.hpp>
#include <kiln/train/text.hpp>
#include <kiln/train/trainer.hpp>

#include "probe.hpp"
#include "stats.hpp"

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
  std::string scale = "full";
  std::vector<std::string> tasks = {"lm", "bpe", "budgets", "recall", "needle"};
  std::vector<std::string> variants = {"mha", "diff", "diff2", "mha+attnres_block", "diff+attnres_block", "diff2+attnres_block"};
  std::vector<int64_t> seeds = {0, 1, 2};
  std::string out = "examples/attention_study/results";
  std::string corpus;  // "" = the fortunes corpus
  bool match_flops = true;
  // lm: d 128, 4 layers, MHA 8 heads of 16; steps are the plain MHA model's (the FLOPs budget).
  TaskSizes lm{128, 4, 8, 0, 128, 16, 300, 30, 50, 2, 3e-3};
  // bpe: the lm sizes (T 128 BPE tokens hold about 3.7× the text of 128 characters).
  TaskSizes bp = lm;
  int64_t bpe_vocab = 1024;
  // budgets: the lm base variants trained to these multiples of the lm budget (1 = the lm runs themselves)
  std::vector<double> budget_scales = {0.5, 0.75, 1.0, 1.5};
  // recall: d 64, 2 layers, MHA 4 heads, T 48 (8 pairs, 4 queries).
  TaskSizes rc{64, 2, 4, 0, 48, 32, 600, 50, 100, 2, 5e-3};
  // needle: d 64, 2 layers, MHA 4 heads; seq_len is the longest context length.
  TaskSizes nd{64, 2, 4, 0, 128, 32, 600, 50, 100, 2, 3e-3};
  int64_t lm_eval_batches = 8;
  // recall data
  int64_t n_pairs = 8, n_queries = 4, n_keys = 16, n_values = 16, n_distractors = 8, n_eval = 512;
  int64_t eval_data_seed = 12345;
  // needle data: the needle and its decoys (pairs), at these context lengths
  int64_t needle_pairs = 4;
  std::vector<int64_t> needle_lengths = {32, 64, 128};
  // outliers and generation (lm models)
  int64_t probe_seqs = 4, gen_prompt = 16, gen_tokens = 48, gen_rounds = 4;
};

// Presets. full is the default and the study docs/attention_study.md describes; reduced and tiny change
// only sizes and steps (flags after --scale override them).
void apply_scale(Options& o, const std::string& s) {
  KILN_CHECK(s == "full" || s == "reduced" || s == "tiny", "attention_study: --scale is full, reduced or tiny, got '{}'", s);
  o.scale = s;
  if (s == "reduced") {
    o.lm = {64, 2, 4, 0, 64, 16, 200, 20, 25, 2, 3e-3};
    o.bp = o.lm;
    o.rc = {64, 2, 4, 0, 48, 32, 300, 30, 50, 2, 5e-3};
    o.nd = {64, 2, 4, 0, 64, 32, 300, 30, 50, 2, 3e-3};
    o.needle_lengths = {24, 40, 64};
    o.lm_eval_batches = 4;
    o.n_eval = 256;
    o.gen_prompt = 8;
    o.gen_tokens = 32;
    o.gen_rounds = 4;
    o.probe_seqs = 4;
  } else if (s == "tiny") {
    o.lm = {32, 2, 4, 0, 16, 4, 6, 2, 3, 2, 3e-3};
    o.bp = o.lm;
    o.bpe_vocab = 300;
    o.budget_scales = {0.5, 1.0, 1.5};
    o.rc = {32, 2, 4, 0, 24, 4, 6, 2, 3, 2, 5e-3};
    o.nd = {32, 2, 4, 0, 16, 4, 6, 2, 3, 2, 3e-3};
    o.needle_lengths = {12, 16};
    o.needle_pairs = 2;
    o.lm_eval_batches = 1;
    o.n_eval = 16;
    o.gen_prompt = 4;
    o.gen_tokens = 4;
    o.gen_rounds = 2;
    o.probe_seqs = 2;
  }
}

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

const char* kHelp = R"(example_attention_study: MHA vs Diff vs Diff V2 attention, standard vs Block AttnRes residuals,
at equal parameters and equal training FLOPs, over seeds.
  --scale full|reduced|tiny   size preset (default full, the study of docs/attention_study.md); flags after it override
  --task LIST                 all, or a comma list of lm, bpe, budgets, recall, needle (default all; budgets runs lm too)
  --variants LIST             comma-separated, each ATTN[+RESIDUAL] with ATTN mha|diff|diff2 and RESIDUAL
                              standard|attnres_block|attnres_full (default: the three attentions × standard, attnres_block)
  --seeds LIST                seeds (model init and data order; default 0,1,2)
  --out DIR                   results folder (default examples/attention_study/results)
  --corpus FILE               lm text (default: the fortunes corpus in /usr/share/games/fortunes)
  --match MODE                flops (default: each variant trains budget/FLOPs-per-step steps) or steps (all the same steps)
  --{lm,recall,needle}-steps N       the plain MHA model's training steps, i.e. the FLOPs budget (300 / 600 / 600)
  --{lm,recall,needle}-d-model N     (128 / 64 / 64)      --{lm,recall,needle}-layers N   (4 / 2 / 2)
  --{lm,recall,needle}-heads N       MHA heads; Diff gets N/2 heads of two sub-heads, Diff V2 N heads of two query heads (8 / 4 / 4)
  --{lm,recall,needle}-ffn N         the plain MHA model's SwiGLU width, 0 = ceil64(8d/3) (0); others get the width that equalises parameters
  --{lm,recall}-seq N                sequence length (128 / 48)
  --{lm,recall,needle}-batch N       batch size (16 / 32 / 32)
  --{lm,recall,needle}-lr X          peak AdamW learning rate (3e-3 / 5e-3 / 3e-3)
  --{lm,recall,needle}-warmup N      warmup steps of the cosine schedule (30 / 50 / 50)
  --{lm,recall,needle}-eval-every N  evaluation interval in steps (50 / 100 / 100)
  --{lm,recall,needle}-block-size N  attnres_block_size (2)
  --lm-eval-batches N         held-out batches per evaluation (8; the bpe task's too)
  --bpe-vocab N               the bpe task's vocabulary size: 256 bytes + merges (1024)
  --bpe-STEPS... --bpe-d-model N ...  the bpe task's sizes, as --lm-* (default: the lm task's)
  --budgets LIST              the budgets task's multiples of the lm budget (0.5,0.75,1,1.5)
  --pairs N --queries N --keys N --values N --distractors N --eval-seqs N --eval-data-seed N
                              recall data (8, 4, 16, 16, 8, 512, 12345); --eval-seqs also sets the needle's per length
  --needle-lengths LIST       context lengths of the needle task (32,64,128)
  --needle-pairs N            the needle and its decoys (4)
  --probe-seqs N              held-out sequences the outlier probe reads (4)
  --gen-prompt N --gen-tokens N --gen-rounds N   generation timing: prompt length, tokens, interleaved rounds (16, 48, 4)
  --self-test                 check the statistics on known samples and exit
  --smoke                     self-test, then the whole study at --scale tiny in a temporary folder, check its outputs, remove it
)";

// The budgets task compares with the lm task's runs (its models' final losses, and its bases at 1×), so
// it runs the lm task too; the scales are sorted.
void check_budgets(Options& o) {
  std::sort(o.budget_scales.begin(), o.budget_scales.end());
  o.budget_scales.erase(std::unique(o.budget_scales.begin(), o.budget_scales.end()), o.budget_scales.end());
  KILN_CHECK(o.budget_scales.size() >= 2, "attention_study: --budgets needs at least two scales, got {}", o.budget_scales.size());
  const bool budgets = std::find(o.tasks.begin(), o.tasks.end(), "budgets") != o.tasks.end();
  if (budgets && std::find(o.tasks.begin(), o.tasks.end(), "lm") == o.tasks.end()) o.tasks.insert(o.tasks.begin(), "lm");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; ++i)  // the preset first, so that later flags override it
    if (std::string(argv[i]) == "--scale") apply_scale(o, argv[i + 1]);
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
      else if (k == "seq" && prefix != "--needle-")
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
    auto int_list = [&](std::vector<int64_t>& dst, int64_t min) {
      dst.clear();
      for (const auto& s : split(v, ',')) dst.push_back(parse_int(f, s, min));
    };
    if (f == "--scale") {
      // applied above
    } else if (f == "--task") {
      o.tasks = v == "all" ? std::vector<std::string>{"lm", "bpe", "budgets", "recall", "needle"} : split(v, ',');
      for (const auto& t : o.tasks)
        KILN_CHECK(t == "lm" || t == "bpe" || t == "budgets" || t == "recall" || t == "needle",
                   "attention_study: --task is all or a list of lm, bpe, budgets, recall, needle; got '{}'", v);
    } else if (f == "--variants") {
      o.variants = split(v, ',');
    } else if (f == "--seeds") {
      int_list(o.seeds, 0);
    } else if (f == "--out") {
      o.out = v;
    } else if (f == "--corpus") {
      o.corpus = v;
    } else if (f == "--match") {
      KILN_CHECK(v == "flops" || v == "steps", "attention_study: --match is flops or steps, got '{}'", v);
      o.match_flops = v == "flops";
    } else if (f == "--bpe-vocab") {
      o.bpe_vocab = parse_int(f, v, 256);
    } else if (f == "--budgets") {
      o.budget_scales.clear();
      for (const auto& x : split(v, ',')) o.budget_scales.push_back(parse_double(f, x));
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
    } else if (f == "--needle-lengths") {
      int_list(o.needle_lengths, 2);
    } else if (f == "--needle-pairs") {
      o.needle_pairs = parse_int(f, v, 1);
    } else if (f == "--probe-seqs") {
      o.probe_seqs = parse_int(f, v, 1);
    } else if (f == "--gen-prompt") {
      o.gen_prompt = parse_int(f, v, 1);
    } else if (f == "--gen-tokens") {
      o.gen_tokens = parse_int(f, v, 1);
    } else if (f == "--gen-rounds") {
      o.gen_rounds = parse_int(f, v, 1);
    } else if (!sizes("--lm-", o.lm) && !sizes("--bpe-", o.bp) && !sizes("--recall-", o.rc) && !sizes("--needle-", o.nd)) {
      throw Error(fmt::format("attention_study: unknown flag '{}' (see --help)", f));
    }
  }
  KILN_CHECK(o.n_queries <= o.n_pairs, "attention_study: --queries ({}) must be ≤ --pairs ({})", o.n_queries, o.n_pairs);
  KILN_CHECK(o.n_pairs <= o.n_keys && o.needle_pairs <= o.n_keys,
             "attention_study: --pairs ({}) and --needle-pairs ({}) must be ≤ --keys ({})", o.n_pairs, o.needle_pairs, o.n_keys);
  KILN_CHECK(o.rc.seq_len >= 2 * o.n_pairs + 2 * o.n_queries,
             "attention_study: --recall-seq ({}) must hold 2·pairs + 2·queries = {} tokens", o.rc.seq_len, 2 * o.n_pairs + 2 * o.n_queries);
  KILN_CHECK(!o.needle_lengths.empty(), "attention_study: --needle-lengths is empty");
  std::sort(o.needle_lengths.begin(), o.needle_lengths.end());
  for (int64_t L : o.needle_lengths)
    KILN_CHECK(L >= 2 * o.needle_pairs + 2, "attention_study: needle length {} cannot hold {} pairs and the query (needs ≥ {})", L,
               o.needle_pairs, 2 * o.needle_pairs + 2);
  o.nd.seq_len = o.needle_lengths.back();
  KILN_CHECK(o.gen_prompt + o.gen_tokens <= o.lm.seq_len, "attention_study: --gen-prompt + --gen-tokens ({}) must fit --lm-seq ({})",
             o.gen_prompt + o.gen_tokens, o.lm.seq_len);
  KILN_CHECK(!o.seeds.empty(), "attention_study: empty seed list");
  check_budgets(o);
  return o;
}

// ---------------------------------------------------------------------------------------------
// Variants, configs, parameters and FLOPs

struct Variant {
  std::string name, attention, residual;
};

Variant parse_variant(const std::string& s) {
  const auto parts = split(s, '+');
  KILN_CHECK(parts.size() <= 2 && (parts[0] == "mha" || parts[0] == "diff" || parts[0] == "diff2"),
             "attention_study: variant '{}' is not ATTN[+RESIDUAL] with ATTN mha|diff|diff2", s);
  Variant v{s, parts[0], parts.size() == 2 ? parts[1] : "standard"};
  KILN_CHECK(v.residual == "standard" || v.residual == "attnres_block" || v.residual == "attnres_full",
             "attention_study: variant '{}': residual is standard, attnres_block or attnres_full", s);
  return v;
}

// Diff with h heads has the projections of MHA with 2h heads (docs/specs.md §1); Diff V2 keeps MHA's h
// output heads (and k/v) and doubles the query heads (§1b).
ModelConfig make_config(const TaskSizes& t, const Variant& v, int64_t vocab, int64_t ffn) {
  KILN_CHECK(t.mha_heads % 2 == 0, "attention_study: MHA heads must be even (Diff gets half), got {}", t.mha_heads);
  ModelConfig c;
  c.vocab_size = vocab;
  c.d_model = t.d_model;
  c.n_layers = t.n_layers;
  c.n_heads = v.attention == "diff" ? t.mha_heads / 2 : t.mha_heads;
  c.ffn_hidden = ffn;
  c.max_seq_len = t.seq_len;
  c.attention = v.attention;
  c.residual = v.residual;
  c.attnres_block_size = t.block_size;
  c.rope = true;
  c.tie_embeddings = false;
  return c.resolved();
}

int64_t count_params(const ModelConfig& c) { return nn::GPT<Cpu>(c).num_parameters(); }

// The variant's config at equal parameters: the plain MHA model's SwiGLU width, less the variant's extra
// parameters in units of one SwiGLU unit (3·D per layer), rounded.
struct Sized {
  ModelConfig config;
  int64_t params = 0;
  double flops_per_step = 0;  // nn::gpt_flops × batch, averaged over `lengths`
  int64_t steps = 0;
};

Sized size_variant(const Options& o, const TaskSizes& t, const Variant& v, int64_t vocab, const std::vector<int64_t>& lengths) {
  const ModelConfig base = make_config(t, Variant{"mha", "mha", "standard"}, vocab, t.ffn_hidden);
  const int64_t p0 = count_params(base);
  ModelConfig c = make_config(t, v, vocab, base.ffn_hidden);
  const double unit = 3.0 * double(t.d_model) * double(t.n_layers);
  const auto shrink = static_cast<int64_t>(std::llround(double(count_params(c) - p0) / unit));
  if (shrink != 0) c = make_config(t, v, vocab, base.ffn_hidden - shrink);
  auto per_step = [&](const ModelConfig& m) {
    double f = 0;
    for (int64_t L : lengths) f += nn::gpt_flops(m, L).total();
    return f / double(lengths.size()) * double(t.batch);
  };
  Sized s{c, count_params(c), per_step(c), t.steps};
  if (o.match_flops) s.steps = std::max<int64_t>(1, std::llround(double(t.steps) * per_step(base) / s.flops_per_step));
  return s;
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

uint64_t mix(uint64_t a, uint64_t b) {
  Rng r{a * 0x100000001B3ULL ^ (b + 0x51ED270B27A4B3C5ULL)};
  return r.next();
}

// Token ranges: distractors [0, nd), keys [nd, nd+nk), values [nd+nk, nd+nk+nv).
struct RecallSpec {
  int64_t T, K, Q, nk, nv, nd;
  int64_t vocab() const { return nd + nk + nv; }
};

struct RecallBatch {
  std::vector<int64_t> x, y;  // [n, T]; y = -100 except at query keys, where it is the value
};

// n sequences: K pairs (distinct keys, values drawn uniformly, repeats allowed) shuffled as units among
// T − 2Q − 2K distractors, then Q of the K keys each followed by its value.
RecallBatch recall_batch(const RecallSpec& sp, int64_t n, uint64_t seed) {
  const int64_t T = sp.T, K = sp.K, Q = sp.Q;
  const int64_t ctx = T - 2 * Q;
  Rng rng{seed};
  RecallBatch b;
  b.x.reserve(static_cast<size_t>(n * T));
  b.y.assign(static_cast<size_t>(n * T), -100);
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int64_t> keys(static_cast<size_t>(sp.nk));
    for (int64_t i = 0; i < sp.nk; ++i) keys[static_cast<size_t>(i)] = sp.nd + i;
    rng.shuffle(keys);
    keys.resize(static_cast<size_t>(K));
    std::vector<int64_t> vals(static_cast<size_t>(K));
    for (auto& v : vals) v = sp.nd + sp.nk + rng.below(sp.nv);
    std::vector<int64_t> items;  // pair i as −(i+1), a distractor as its token
    for (int64_t i = 0; i < K; ++i) items.push_back(-(i + 1));
    for (int64_t i = 0; i < ctx - 2 * K; ++i) items.push_back(rng.below(sp.nd));
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

RecallSpec recall_spec(const Options& o) { return {o.rc.seq_len, o.n_pairs, o.n_queries, o.n_keys, o.n_values, o.n_distractors}; }
RecallSpec needle_spec(const Options& o, int64_t L) { return {L, o.needle_pairs, 1, o.n_keys, o.n_values, o.n_distractors}; }

// ---------------------------------------------------------------------------------------------
// Training

struct Curves {
  std::ofstream csv;
  void add(const std::string& task, const std::string& variant, int64_t seed, int64_t step, double flops, const std::string& metric,
           double value) {
    csv << fmt::format("{},{},{},{},{:.6g},{},{:.6g}\n", task, variant, seed, step, flops, metric, value);
    csv.flush();
  }
};

struct RunResult {
  std::string task, variant;
  int64_t seed = 0, params = 0, steps = 0, ffn_hidden = 0;
  double flops_per_step = 0, ms_per_step = 0, wall_s = 0;
  std::map<std::string, double> metrics;
  std::vector<double> eval_flops, eval_values;  // the held-out curve (lm: val_loss)
};

template <Backend B> struct Trainer {
  nn::GPT<B>& model;
  const TaskSizes& t;
  int64_t steps;
  optim::Adam<B> opt;
  LrSchedule schedule;
  std::vector<Var<B>> params;
  Trainer(nn::GPT<B>& m, const TaskSizes& sizes, int64_t n_steps)
      : model(m),
        t(sizes),
        steps(n_steps),
        opt(optim::decay_groups(m.named_parameters(), sizes.lr, 0.1),
            {.lr = sizes.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .decoupled = true}),
        schedule{.name = "cosine", .warmup_steps = std::min(sizes.warmup, n_steps - 1), .min_lr_ratio = 0.1},
        params(m.parameters()) {}
  double step(int64_t s, const Tensor<B>& x, const Tensor<B>& y) {
    opt.set_lr(schedule.at(t.lr, s, steps));
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

// Trains one model; `batch_at(s)` gives step s's (x, y), `evaluate(step, flops, result)` records the
// held-out metrics every eval_every steps and after the last.
template <Backend B, class BatchAt, class Eval> RunResult train_run(const std::string& task, const Variant& v, int64_t seed,
                                                                    const Sized& sz, const TaskSizes& t, nn::GPT<B>& model, Curves& curves,
                                                                    BatchAt&& batch_at, Eval&& evaluate) {
  model.init_weights(static_cast<uint64_t>(seed));
  Trainer<B> tr(model, t, sz.steps);
  RunResult res;
  res.task = task;
  res.variant = v.name;
  res.seed = seed;
  res.params = model.num_parameters();
  res.steps = sz.steps;
  res.ffn_hidden = sz.config.ffn_hidden;
  res.flops_per_step = sz.flops_per_step;
  fmt::print("[{}] {:<20} seed {} params {} ffn {} steps {} ({:.3g} FLOPs/step)\n", task, v.name, seed, res.params, res.ffn_hidden,
             res.steps, res.flops_per_step);
  const auto t0 = Clock::now();
  double train_s = 0, smooth = 0;
  for (int64_t s = 0; s < sz.steps; ++s) {
    const auto [x, y] = batch_at(s);
    const auto ts = Clock::now();
    const double loss = tr.step(s, x, y);
    train_s += seconds_since(ts);
    KILN_CHECK(std::isfinite(loss), "attention_study: {} {} seed {}: loss became {} at step {}", task, v.name, seed, loss, s);
    smooth = s == 0 ? loss : 0.95 * smooth + 0.05 * loss;
    const double flops = double(s + 1) * sz.flops_per_step;
    if ((s + 1) % 10 == 0 || s + 1 == sz.steps) curves.add(task, v.name, seed, s + 1, flops, "train_loss", loss);  // every 10th step
    if ((s + 1) % t.eval_every == 0 || s + 1 == sz.steps) {
      model.eval();
      const std::string line = evaluate(s + 1, flops, res);
      model.train();
      fmt::print("  step {:>5}  train(ema) {:.4f}  {}  {:.0f} ms/step\n", s + 1, smooth, line, 1000 * train_s / double(s + 1));
      std::fflush(stdout);
    }
  }
  res.metrics["train_loss_ema"] = smooth;
  res.metrics["train_flops"] = double(sz.steps) * sz.flops_per_step;
  res.ms_per_step = 1000 * train_s / double(sz.steps);
  res.wall_s = seconds_since(t0);
  return res;
}

template <Backend B> double recall_accuracy(const nn::GPT<B>& model, const RecallSpec& sp, const RecallBatch& data, int64_t n) {
  NoGrad ng;
  const int64_t T = sp.T, chunk = 64;
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
  return double(hit) / double(total);
}

template <Backend B> std::pair<Tensor<B>, Tensor<B>> to_tensors(const RecallBatch& b, int64_t n, int64_t T) {
  return {Tensor<B>::from_vector(b.x, {n, T}), Tensor<B>::from_vector(b.y, {n, T})};
}

// ---------------------------------------------------------------------------------------------
// Outliers and generation time (lm models)

template <Backend B> void outliers(const Options& o, const nn::GPT<B>& model, const TokenData& eval, RunResult& res) {
  study::Probe<B> probe(model);
  const auto [x, y] = eval.batch<B>(0, o.probe_seqs, o.lm.seq_len);
  const study::ProbeResult p = probe.run(x);
  KILN_CHECK(p.max_rebuild_error < 1e-3, "attention_study: {} seed {}: the probe's rebuilt outputs differ from the model's by {}",
             res.variant, res.seed, p.max_rebuild_error);
  auto put = [&](const std::string& what, const std::vector<float>& xs, const std::vector<double>& kurt) {
    const study::Magnitudes m = study::magnitudes(xs);
    res.metrics[what + "_top1"] = m.top1;
    res.metrics[what + "_top10"] = m.top10;
    res.metrics[what + "_top100"] = m.top100;
    res.metrics[what + "_median"] = m.median;
    res.metrics[what + "_kurtosis"] = study::kurtosis(xs);
    res.metrics[what + "_kurtosis_max"] = *std::max_element(kurt.begin(), kurt.end());
  };
  put("hidden", p.hidden, p.hidden_kurtosis);
  put("logit", p.logits, p.logit_kurtosis);
  res.metrics["probe_rebuild_error"] = p.max_rebuild_error;
  fmt::print("  outliers {:<20} hidden top1 {:.3g} kurtosis {:.3g} | logits top1 {:.3g} kurtosis {:.3g} (rebuild error {:.2g})\n",
             res.variant, res.metrics["hidden_top1"], res.metrics["hidden_kurtosis"], res.metrics["logit_top1"],
             res.metrics["logit_kurtosis"], p.max_rebuild_error);
}

// Per-token decode time of each model with its KV cache (nn::generate, greedy), interleaved: round r
// runs the models in order, round r+1 in reverse (A B C C B A ...), after one untimed warm-up each.
template <Backend B> void generation_time(const Options& o, const std::vector<std::unique_ptr<nn::GPT<B>>>& models,
                                          std::vector<RunResult*> runs, const TokenData& eval, std::ofstream& gen_csv) {
  const std::vector<int64_t> prompt(eval.tokens().begin(), eval.tokens().begin() + o.gen_prompt);
  const nn::GenerateOptions g{.max_new_tokens = o.gen_tokens, .temperature = 0.0};
  std::vector<std::vector<double>> ms(models.size());
  for (const auto& m : models) (void)nn::generate(*m, {prompt}, g);
  for (int64_t r = 0; r < o.gen_rounds; ++r) {
    for (size_t k = 0; k < models.size(); ++k) {
      const size_t i = r % 2 == 0 ? k : models.size() - 1 - k;
      const nn::Generation out = nn::generate(*models[i], {prompt}, g);
      const double v = 1000 * out.stats.decode_seconds / double(std::max<int64_t>(1, out.stats.decode_tokens));
      ms[i].push_back(v);
      gen_csv << fmt::format("{},{},{},{:.5f},{:.5f}\n", runs[i]->seed, r, runs[i]->variant, v,
                             1000 * out.stats.prefill_seconds / double(std::max<int64_t>(1, out.stats.prefill_tokens)));
    }
  }
  gen_csv.flush();
  for (size_t i = 0; i < models.size(); ++i) {
    runs[i]->metrics["gen_ms_per_token"] = study::mean_std(ms[i]).mean;
    fmt::print("  generation {:<20} {:.3f} ms/token (mean of {} rounds)\n", runs[i]->variant, runs[i]->metrics["gen_ms_per_token"],
               ms[i].size());
  }
}

// ---------------------------------------------------------------------------------------------
// The study

// One point of the budgets task: a base variant's final held-out loss after `steps` steps (`flops`).
struct BudgetPoint {
  std::string base;
  int64_t seed = 0;
  double scale = 0, flops = 0, val_loss = 0;
  int64_t steps = 0;
  bool from_lm = false;
};

struct Outputs {
  std::vector<RunResult> runs;
  std::vector<BudgetPoint> budgets;
  nlohmann::json configs;
};

// The lm text and its split: the last 5% of the bytes held out (the char task's ids are its bytes).
struct LmText {
  std::string text;
  size_t cut = 0;
};
LmText lm_text(const Options& o) {
  LmText t{o.corpus.empty() ? fortunes_corpus("/usr/share/games/fortunes") : read_text_file(o.corpus), 0};
  t.cut = static_cast<size_t>(static_cast<double>(t.text.size()) * 0.95);
  return t;
}

// The char task's tokens: the corpus's bytes, split as LmText says.
struct CharData {
  CharTokenizer tok;
  TokenData train, eval;
};
CharData char_data(const LmText& lt) {
  CharTokenizer tok = CharTokenizer::fit(lt.text);
  const std::vector<int64_t> ids = tok.encode(lt.text);
  const auto cut = static_cast<std::ptrdiff_t>(lt.cut);
  return {std::move(tok), TokenData(std::vector<int64_t>(ids.begin(), ids.begin() + cut), "train"),
          TokenData(std::vector<int64_t>(ids.begin() + cut, ids.end()), "eval")};
}

// One LM run on (train, eval): the held-out loss every eval_every steps and after the last, per token,
// and per byte too when tokens_per_byte > 0 (the evaluated targets' tokens over their bytes).
template <Backend B> RunResult lm_run(const Options& o, const std::string& task, const TaskSizes& t, const Variant& v, int64_t seed,
                                      const Sized& sz, nn::GPT<B>& model, const TokenData& train, const TokenData& eval,
                                      double tokens_per_byte, Curves& curves) {
  const int64_t offset = seed * 7919;  // the seed offsets the batch stream
  return train_run<B>(
      task, v, seed, sz, t, model, curves, [&](int64_t s) { return train.batch<B>(s + offset, t.batch, t.seq_len); },
      [&](int64_t step, double flops, RunResult& res) {
        const double ev = evaluate(model, eval, o.lm_eval_batches, t.batch, t.seq_len);
        curves.add(task, v.name, seed, step, flops, "val_loss", ev);
        res.eval_flops.push_back(flops);
        res.eval_values.push_back(ev);
        res.metrics["val_loss"] = ev;
        if (tokens_per_byte <= 0) return fmt::format("val {:.4f}", ev);
        const double pb = ev * tokens_per_byte;
        curves.add(task, v.name, seed, step, flops, "val_loss_per_byte", pb);
        res.metrics["val_loss_per_byte"] = pb;
        return fmt::format("val {:.4f}/token {:.4f}/byte", ev, pb);
      });
}

template <Backend B> void run_lm(const Options& o, const std::vector<Variant>& variants, Curves& curves, Outputs& out) {
  const LmText lt = lm_text(o);
  const CharData cd = char_data(lt);
  const CharTokenizer& tok = cd.tok;
  const TokenData &train_data = cd.train, &eval = cd.eval;
  fmt::print("[lm] corpus {} characters (train {}, held out {}), vocabulary {}\n", lt.text.size(), train_data.size(), eval.size(),
             tok.vocab_size());
  out.configs["lm_data"] = {{"characters", lt.text.size()},
                            {"train", train_data.size()},
                            {"eval", eval.size()},
                            {"vocab", tok.vocab_size()},
                            {"eval_tokens_per_eval", o.lm_eval_batches * o.lm.batch * o.lm.seq_len}};
  std::ofstream gen_csv(fs::path(o.out) / "gen.csv");
  gen_csv << "seed,round,variant,decode_ms_per_token,prefill_ms_per_token\n";
  for (int64_t seed : o.seeds) {
    std::vector<std::unique_ptr<nn::GPT<B>>> models;
    std::vector<size_t> idx;
    for (const auto& v : variants) {
      const Sized sz = size_variant(o, o.lm, v, tok.vocab_size(), {o.lm.seq_len});
      out.configs["lm"][v.name] = sz.config.to_json();
      models.push_back(std::make_unique<nn::GPT<B>>(sz.config));
      RunResult r = lm_run<B>(o, "lm", o.lm, v, seed, sz, *models.back(), train_data, eval, 0, curves);
      outliers(o, *models.back(), eval, r);
      idx.push_back(out.runs.size());
      out.runs.push_back(std::move(r));
    }
    std::vector<RunResult*> rs;
    for (size_t i : idx) rs.push_back(&out.runs[i]);
    generation_time(o, models, rs, eval, gen_csv);
  }
}

text::BpeTrainOptions bpe_options(const Options& o) {
  text::BpeTrainOptions b;
  b.vocab_size = o.bpe_vocab;
  return b;
}

// The bpe task: a byte-level BPE tokenizer (vocabulary --bpe-vocab) trained by kiln on the training
// bytes of the lm split only, then the lm method on its tokens.
template <Backend B> void run_bpe(const Options& o, const std::vector<Variant>& variants, Curves& curves, Outputs& out) {
  const LmText lt = lm_text(o);
  size_t cut = lt.cut;  // on a character boundary (a no-op for the ASCII fortunes)
  while (cut > 0 && (static_cast<unsigned char>(lt.text[cut]) & 0xC0) == 0x80) --cut;
  const std::string train_text = lt.text.substr(0, cut), eval_text = lt.text.substr(cut);
  const auto t0 = Clock::now();
  const std::string json = text::train_bpe_json(std::vector<std::string>{train_text}, bpe_options(o));
  const double train_tok_s = seconds_since(t0);
  const std::string tok_path = (fs::path(o.out) / "bpe_tokenizer.json").string();
  write_atomically(tok_path, {{json.data(), json.size()}});
  const text::Tokenizer tok = text::Tokenizer::load(tok_path);
  auto encode = [&](const std::string& s) {
    const std::vector<int32_t> v = tok.encode(s, false);
    return std::vector<int64_t>(v.begin(), v.end());
  };
  const TokenData train_data(encode(train_text), "bpe train"), eval(encode(eval_text), "bpe eval");
  // the bytes of each token (its GPT-2 stand-in characters, one per byte), and of the evaluated targets
  std::vector<int64_t> token_bytes(static_cast<size_t>(tok.vocab_size()));
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const std::string piece = tok.token(id);
    for (unsigned char c : piece) token_bytes[static_cast<size_t>(id)] += (c & 0xC0) != 0x80;
  }
  int64_t eval_targets = 0, eval_bytes = 0;
  for (int64_t i = 0; i < o.lm_eval_batches; ++i)
    for (int64_t y : eval.batch<Cpu>(i, o.bp.batch, o.bp.seq_len).second.to_vector<int64_t>()) {
      ++eval_targets;
      eval_bytes += token_bytes[static_cast<size_t>(y)];
    }
  const double tokens_per_byte = double(eval_targets) / double(eval_bytes);
  fmt::print(
      "[bpe] tokenizer: vocabulary {} trained on {} bytes in {:.2f} s; train {} tokens ({:.3f} bytes/token), held out {} tokens; "
      "evaluated targets {:.3f} bytes/token\n",
      tok.vocab_size(), train_text.size(), train_tok_s, train_data.size(), double(train_text.size()) / double(train_data.size()),
      eval.size(), 1 / tokens_per_byte);
  out.configs["bpe_data"] = {{"bytes", lt.text.size()},
                             {"train_bytes", train_text.size()},
                             {"eval_bytes", eval_text.size()},
                             {"vocab", tok.vocab_size()},
                             {"vocab_requested", o.bpe_vocab},
                             {"tokenizer", "bpe_tokenizer.json (kiln::text::train_bpe_json on the training bytes, min_frequency 0)"},
                             {"tokenizer_train_s", train_tok_s},
                             {"train_tokens", train_data.size()},
                             {"eval_tokens", eval.size()},
                             {"eval_targets_per_eval", eval_targets},
                             {"eval_bytes_per_eval", eval_bytes}};
  for (int64_t seed : o.seeds)
    for (const auto& v : variants) {
      const Sized sz = size_variant(o, o.bp, v, tok.vocab_size(), {o.bp.seq_len});
      out.configs["bpe"][v.name] = sz.config.to_json();
      nn::GPT<B> model(sz.config);
      out.runs.push_back(lm_run<B>(o, "bpe", o.bp, v, seed, sz, model, train_data, eval, tokens_per_byte, curves));
      out.runs.back().metrics["eval_bytes_per_token"] = 1 / tokens_per_byte;
    }
}

// The budgets task: each base variant of the lm task (mha, diff, diff2, standard residual) trained to
// scale × the lm budget, with its own full cosine schedule (same warmup, same data stream), evaluated
// once at the end on the lm held-out batches. Scale 1 is the lm run itself.
template <Backend B> void run_budgets(const Options& o, const std::vector<Variant>& variants, Curves& curves, Outputs& out) {
  const CharData cd = char_data(lm_text(o));
  for (int64_t seed : o.seeds)
    for (const auto& v : variants) {
      if (v.residual != "standard") continue;
      for (double k : o.budget_scales) {
        const RunResult* lm = nullptr;
        for (const auto& r : out.runs)
          if (r.task == "lm" && r.variant == v.name && r.seed == seed) lm = &r;
        KILN_CHECK(lm, "attention_study: budgets: no lm run of {} seed {}", v.name, seed);
        if (k == 1.0) {
          out.budgets.push_back({v.name, seed, k, lm->metrics.at("train_flops"), lm->metrics.at("val_loss"), lm->steps, true});
          continue;
        }
        TaskSizes t = o.lm;
        t.steps = std::max<int64_t>(2, std::llround(k * double(o.lm.steps)));
        t.eval_every = std::numeric_limits<int64_t>::max() / 2;  // once, after the last step
        const Sized sz = size_variant(o, t, v, cd.tok.vocab_size(), {o.lm.seq_len});
        nn::GPT<B> model(sz.config);
        const RunResult r = lm_run<B>(o, fmt::format("budget_{:g}x", k), t, v, seed, sz, model, cd.train, cd.eval, 0, curves);
        out.budgets.push_back({v.name, seed, k, r.metrics.at("train_flops"), r.metrics.at("val_loss"), r.steps, false});
      }
    }
}

template <Backend B> void run_recall(const Options& o, const std::vector<Variant>& variants, Curves& curves, Outputs& out) {
  const RecallSpec sp = recall_spec(o);
  const RecallBatch eval = recall_batch(sp, o.n_eval, static_cast<uint64_t>(o.eval_data_seed) ^ 0xE7A1ULL);
  out.configs["recall_data"] = {{"pairs", o.n_pairs},
                                {"queries", o.n_queries},
                                {"keys", o.n_keys},
                                {"values", o.n_values},
                                {"distractors", o.n_distractors},
                                {"eval_seqs", o.n_eval},
                                {"eval_data_seed", o.eval_data_seed},
                                {"chance", 1.0 / double(o.n_values)}};
  for (int64_t seed : o.seeds)
    for (const auto& v : variants) {
      const Sized sz = size_variant(o, o.rc, v, sp.vocab(), {sp.T});
      out.configs["recall"][v.name] = sz.config.to_json();
      nn::GPT<B> model(sz.config);
      out.runs.push_back(train_run<B>(
          "recall", v, seed, sz, o.rc, model, curves,
          [&](int64_t s) {  // a pure function of (seed, step), identical for every variant
            return to_tensors<B>(recall_batch(sp, o.rc.batch, mix(static_cast<uint64_t>(seed), static_cast<uint64_t>(s))), o.rc.batch,
                                 sp.T);
          },
          [&](int64_t step, double flops, RunResult& res) {
            const double acc = recall_accuracy(model, sp, eval, o.n_eval);
            curves.add("recall", v.name, seed, step, flops, "accuracy", acc);
            res.metrics["accuracy"] = acc;
            return fmt::format("acc {:.4f}", acc);
          }));
    }
}

template <Backend B> void run_needle(const Options& o, const std::vector<Variant>& variants, Curves& curves, Outputs& out) {
  const auto& Ls = o.needle_lengths;
  std::vector<RecallBatch> evals;
  for (int64_t L : Ls)
    evals.push_back(recall_batch(needle_spec(o, L), o.n_eval, static_cast<uint64_t>(o.eval_data_seed) ^ (0x9EED1EULL + uint64_t(L))));
  const int64_t vocab = needle_spec(o, Ls[0]).vocab();
  out.configs["needle_data"] = {
      {"pairs", o.needle_pairs},         {"lengths", Ls}, {"keys", o.n_keys}, {"values", o.n_values}, {"distractors", o.n_distractors},
      {"eval_seqs_per_length", o.n_eval}};
  for (int64_t seed : o.seeds)
    for (const auto& v : variants) {
      const Sized sz = size_variant(o, o.nd, v, vocab, Ls);
      out.configs["needle"][v.name] = sz.config.to_json();
      nn::GPT<B> model(sz.config);
      out.runs.push_back(train_run<B>(
          "needle", v, seed, sz, o.nd, model, curves,
          [&](int64_t s) {  // the lengths in turn
            const int64_t L = Ls[static_cast<size_t>(s) % Ls.size()];
            return to_tensors<B>(recall_batch(needle_spec(o, L), o.nd.batch, mix(static_cast<uint64_t>(seed) + 1000003ULL, uint64_t(s))),
                                 o.nd.batch, L);
          },
          [&](int64_t step, double flops, RunResult& res) {
            std::string line;
            double sum = 0;
            for (size_t i = 0; i < Ls.size(); ++i) {
              const double acc = recall_accuracy(model, needle_spec(o, Ls[i]), evals[i], o.n_eval);
              curves.add("needle", v.name, seed, step, flops, fmt::format("acc_L{}", Ls[i]), acc);
              res.metrics[fmt::format("acc_L{}", Ls[i])] = acc;
              line += fmt::format("L{} {:.3f}  ", Ls[i], acc);
              sum += acc;
            }
            res.metrics["accuracy"] = sum / double(Ls.size());
            return line;
          }));
    }
}

// The AttnRes "compute advantage" and its like: for each seed, the training FLOPs at which `base`'s
// held-out loss curve reaches `model`'s final held-out loss, over `model`'s training FLOPs (> 1: the
// model saves compute; NaN: the base never reached it within its budget).
struct Advantage {
  std::string base, model;
  int64_t seed;
  double model_flops, model_loss, base_flops, ratio;
};

std::vector<Advantage> advantages(const std::vector<RunResult>& runs) {
  std::vector<std::pair<std::string, std::string>> pairs;
  std::set<std::string> have;
  for (const auto& r : runs)
    if (r.task == "lm") have.insert(r.variant);
  for (const std::string a : {"mha", "diff", "diff2"})
    for (const std::string res : {"attnres_block", "attnres_full"})
      if (have.count(a) && have.count(a + "+" + res)) pairs.emplace_back(a, a + "+" + res);
  for (const std::string a : {"diff", "diff2"})
    if (have.count("mha") && have.count(a)) pairs.emplace_back("mha", a);
  std::vector<Advantage> out;
  for (const auto& [b, m] : pairs)
    for (const auto& rm : runs) {
      if (rm.task != "lm" || rm.variant != m) continue;
      for (const auto& rb : runs) {
        if (rb.task != "lm" || rb.variant != b || rb.seed != rm.seed) continue;
        Advantage a{b, m, rm.seed, rm.metrics.at("train_flops"), rm.metrics.at("val_loss"), 0, 0};
        a.base_flops = study::flops_to_reach(rb.eval_flops, rb.eval_values, a.model_loss);
        a.ratio = a.base_flops / a.model_flops;
        out.push_back(a);
      }
    }
  return out;
}

// The compute advantage from several budgets: for each seed, the FLOPs at which `base` reaches
// `model`'s final held-out loss on the curve through the base's budget runs (final loss against
// FLOPs), linear in log FLOPs between neighbouring budgets (the first crossing from the smallest), over
// the model's training FLOPs. No extrapolation: a loss the base already beats at its smallest budget
// gives only an upper bound on the ratio (status below_smallest), one it never reaches a lower bound
// (beyond_largest); both have ratio NaN and the bound in `bound`.
struct BudgetAdvantage {
  std::string base, model, status;
  int64_t seed;
  double model_flops, model_loss, base_flops, ratio, bound;
};

std::vector<BudgetAdvantage> budget_advantages(const Outputs& out) {
  std::vector<BudgetAdvantage> res;
  if (out.budgets.empty()) return res;
  for (const Advantage& a : advantages(out.runs)) {  // the pairs and the models' final losses
    std::vector<const BudgetPoint*> pts;
    for (const auto& p : out.budgets)
      if (p.base == a.base && p.seed == a.seed) pts.push_back(&p);
    std::sort(pts.begin(), pts.end(), [](auto* x, auto* y) { return x->flops < y->flops; });
    BudgetAdvantage b{a.base, a.model, "", a.seed, a.model_flops, a.model_loss, std::nan(""), std::nan(""), std::nan("")};
    std::vector<double> logc, loss;
    for (auto* p : pts) logc.push_back(std::log(p->flops)), loss.push_back(p->val_loss);
    if (pts.empty()) continue;
    if (loss[0] <= a.model_loss) {
      b.status = "below_smallest";
      b.bound = pts[0]->flops / a.model_flops;
    } else if (const double lc = study::flops_to_reach(logc, loss, a.model_loss); std::isnan(lc)) {
      b.status = "beyond_largest";
      b.bound = pts.back()->flops / a.model_flops;
    } else {
      b.status = "interpolated";
      b.base_flops = std::exp(lc);
      b.ratio = b.base_flops / a.model_flops;
    }
    res.push_back(b);
  }
  return res;
}

// budgets.csv, budget_advantage.csv, and their rows of aggregate.csv (`f`, `agg`): per base and scale
// (task lm_budgets, variant BASE@SCALEx) and per pair (task lm_budget_advantage: the mean ± std of the
// interpolated ratios, and how many seeds fell below or beyond the budgets).
void write_budgets(const fs::path& dir, const Outputs& out, std::ofstream& f, nlohmann::json& agg) {
  std::ofstream b(dir / "budgets.csv");
  b << "base,seed,scale,steps,flops,val_loss,source\n";
  std::vector<std::pair<std::string, double>> keys;
  for (const auto& p : out.budgets) {
    b << fmt::format("{},{},{:g},{},{:.6g},{:.6f},{}\n", p.base, p.seed, p.scale, p.steps, p.flops, p.val_loss,
                     p.from_lm ? "lm run" : "trained");
    if (std::find(keys.begin(), keys.end(), std::pair{p.base, p.scale}) == keys.end()) keys.emplace_back(p.base, p.scale);
  }
  auto put = [&](const std::string& task, const std::string& variant, const std::string& metric, const std::vector<double>& v) {
    const study::MeanStd m = study::mean_std(v);
    f << fmt::format("{},{},{},{},{:.6g},{:.6g}\n", task, variant, metric, m.n, m.mean, m.std);
    agg.push_back({{"task", task}, {"variant", variant}, {"metric", metric}, {"n", m.n}, {"mean", m.mean}, {"std", m.std}});
  };
  for (const auto& [base, scale] : keys) {
    std::vector<double> loss, flops, steps;
    for (const auto& p : out.budgets)
      if (p.base == base && p.scale == scale) loss.push_back(p.val_loss), flops.push_back(p.flops), steps.push_back(double(p.steps));
    const std::string v = fmt::format("{}@{:g}x", base, scale);
    put("lm_budgets", v, "val_loss", loss);
    put("lm_budgets", v, "train_flops", flops);
    put("lm_budgets", v, "steps", steps);
  }
  const std::vector<BudgetAdvantage> adv = budget_advantages(out);
  std::ofstream a(dir / "budget_advantage.csv");
  a << "base,model,seed,model_flops,model_val_loss,base_flops_to_reach,ratio,status,bound\n";
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& x : adv) {
    a << fmt::format("{},{},{},{:.6g},{:.6f},{:.6g},{:.6g},{},{:.6g}\n", x.base, x.model, x.seed, x.model_flops, x.model_loss, x.base_flops,
                     x.ratio, x.status, x.bound);
    if (std::find(pairs.begin(), pairs.end(), std::pair{x.base, x.model}) == pairs.end()) pairs.emplace_back(x.base, x.model);
  }
  for (const auto& [bs, m] : pairs) {
    std::vector<double> ratios;
    double below = 0, beyond = 0;
    for (const auto& x : adv)
      if (x.base == bs && x.model == m) {
        ratios.push_back(x.ratio);
        below += x.status == "below_smallest";
        beyond += x.status == "beyond_largest";
      }
    const std::string v = m + " vs " + bs;
    put("lm_budget_advantage", v, "compute_ratio", ratios);  // NaN (bounded) seeds are left out of n
    put("lm_budget_advantage", v, "below_smallest", {below});
    put("lm_budget_advantage", v, "beyond_largest", {beyond});
  }
}

void write_outputs(const Options& o, Outputs& out, double total_s) {
  const fs::path dir(o.out);
  // One row per run.
  std::set<std::string> names;
  for (const auto& r : out.runs)
    for (const auto& [k, v] : r.metrics) names.insert(k);
  {
    std::ofstream f(dir / "runs.csv");
    f << "task,variant,seed,params,ffn_hidden,steps,flops_per_step,ms_per_step,wall_s";
    for (const auto& n : names) f << ',' << n;
    f << '\n';
    for (const auto& r : out.runs) {
      f << fmt::format("{},{},{},{},{},{},{:.6g},{:.3f},{:.2f}", r.task, r.variant, r.seed, r.params, r.ffn_hidden, r.steps,
                       r.flops_per_step, r.ms_per_step, r.wall_s);
      for (const auto& n : names) f << ',' << (r.metrics.count(n) ? fmt::format("{:.6g}", r.metrics.at(n)) : "");
      f << '\n';
    }
  }
  // Mean ± std over seeds per (task, variant, metric).
  nlohmann::json agg = nlohmann::json::array();
  {
    std::ofstream f(dir / "aggregate.csv");
    f << "task,variant,metric,n,mean,std\n";
    std::vector<std::pair<std::string, std::string>> keys;
    for (const auto& r : out.runs)
      if (std::find(keys.begin(), keys.end(), std::pair{r.task, r.variant}) == keys.end()) keys.emplace_back(r.task, r.variant);
    for (const auto& [task, variant] : keys) {
      std::map<std::string, std::vector<double>> vals;
      for (const auto& r : out.runs) {
        if (r.task != task || r.variant != variant) continue;
        vals["params"].push_back(double(r.params));
        vals["steps"].push_back(double(r.steps));
        vals["ms_per_step"].push_back(r.ms_per_step);
        for (const auto& [k, v] : r.metrics) vals[k].push_back(v);
      }
      for (const auto& [k, v] : vals) {
        const study::MeanStd m = study::mean_std(v);
        f << fmt::format("{},{},{},{},{:.6g},{:.6g}\n", task, variant, k, m.n, m.mean, m.std);
        agg.push_back({{"task", task}, {"variant", variant}, {"metric", k}, {"n", m.n}, {"mean", m.mean}, {"std", m.std}});
      }
    }
    const std::vector<Advantage> adv = advantages(out.runs);
    std::ofstream a(dir / "advantage.csv");
    a << "base,model,seed,model_flops,model_val_loss,base_flops_to_reach,ratio\n";
    std::vector<std::pair<std::string, std::string>> pairs;
    for (const auto& x : adv) {
      a << fmt::format("{},{},{},{:.6g},{:.6f},{:.6g},{:.6g}\n", x.base, x.model, x.seed, x.model_flops, x.model_loss, x.base_flops,
                       x.ratio);
      if (std::find(pairs.begin(), pairs.end(), std::pair{x.base, x.model}) == pairs.end()) pairs.emplace_back(x.base, x.model);
    }
    for (const auto& [b, m] : pairs) {
      std::vector<double> ratios;
      for (const auto& x : adv)
        if (x.base == b && x.model == m) ratios.push_back(x.ratio);
      const study::MeanStd s = study::mean_std(ratios);  // over the seeds where the base reached the loss
      const auto runs_n = static_cast<int64_t>(ratios.size());
      f << fmt::format("lm_advantage,{} vs {},compute_ratio,{},{:.6g},{:.6g}\n", m, b, s.n, s.mean, s.std);
      f << fmt::format("lm_advantage,{} vs {},not_reached,{},{},0\n", m, b, runs_n, runs_n - s.n);
      agg.push_back({{"task", "lm_advantage"},
                     {"variant", m + " vs " + b},
                     {"metric", "compute_ratio"},
                     {"n", s.n},
                     {"mean", s.mean},
                     {"std", s.std}});
    }
    if (!out.budgets.empty()) write_budgets(dir, out, f, agg);
  }
  nlohmann::json js = nlohmann::json::array();
  for (const auto& r : out.runs) {
    nlohmann::json m(r.metrics);
    js.push_back({{"task", r.task},
                  {"variant", r.variant},
                  {"seed", r.seed},
                  {"params", r.params},
                  {"ffn_hidden", r.ffn_hidden},
                  {"steps", r.steps},
                  {"flops_per_step", r.flops_per_step},
                  {"ms_per_step", r.ms_per_step},
                  {"wall_s", r.wall_s},
                  {"metrics", m}});
  }
  std::ofstream(dir / "summary.json")
      << nlohmann::json{{"scale", o.scale}, {"runs", js}, {"aggregate", agg}, {"total_wall_s", total_s}}.dump(1) << '\n';
  std::ofstream(dir / "configs.json") << out.configs.dump(2) << '\n';
}

void check_spread(const std::vector<RunResult>& rs, const std::string& task) {
  double plo = 1e300, phi = 0, flo = 1e300, fhi = 0;
  for (const auto& r : rs)
    if (r.task == task) {
      plo = std::min(plo, double(r.params)), phi = std::max(phi, double(r.params));
      flo = std::min(flo, r.metrics.at("train_flops")), fhi = std::max(fhi, r.metrics.at("train_flops"));
    }
  if (phi == 0) return;
  fmt::print("[{}] parameters {}..{} (spread {:.3f}%), training FLOPs {:.4g}..{:.4g} (spread {:.3f}%)\n", task, plo, phi,
             100 * (phi - plo) / plo, flo, fhi, 100 * (fhi - flo) / flo);
}

template <Backend B> int study_main(const Options& o) {
  std::vector<Variant> variants;
  for (const auto& s : o.variants) variants.push_back(parse_variant(s));
  fs::create_directories(o.out);
  Curves curves;
  curves.csv.open(fs::path(o.out) / "curves.csv");
  KILN_CHECK(curves.csv.good(), "attention_study: cannot write '{}'", (fs::path(o.out) / "curves.csv").string());
  curves.csv << "task,variant,seed,step,flops,metric,value\n";
  Outputs out;
  const auto t0 = Clock::now();
  auto has = [&](const char* t) { return std::find(o.tasks.begin(), o.tasks.end(), t) != o.tasks.end(); };
  if (has("lm")) run_lm<B>(o, variants, curves, out);
  if (has("bpe")) run_bpe<B>(o, variants, curves, out);
  if (has("budgets")) run_budgets<B>(o, variants, curves, out);
  if (has("recall")) run_recall<B>(o, variants, curves, out);
  if (has("needle")) run_needle<B>(o, variants, curves, out);
  auto sizes_json = [](const TaskSizes& t) {
    return nlohmann::json{{"d_model", t.d_model},
                          {"n_layers", t.n_layers},
                          {"mha_heads", t.mha_heads},
                          {"seq_len", t.seq_len},
                          {"batch", t.batch},
                          {"mha_steps", t.steps},
                          {"warmup", t.warmup},
                          {"eval_every", t.eval_every},
                          {"attnres_block_size", t.block_size},
                          {"lr", t.lr},
                          {"optimizer", "AdamW beta (0.9, 0.95) eps 1e-8 wd 0.1 on matrices, clip 1.0"},
                          {"schedule", "cosine to 0.1x after linear warmup"}};
  };
  out.configs["scale"] = o.scale;
  out.configs["match"] = o.match_flops ? "flops" : "steps";
  out.configs["seeds"] = o.seeds;
  out.configs["lm_sizes"] = sizes_json(o.lm);
  out.configs["bpe_sizes"] = sizes_json(o.bp);
  out.configs["budget_scales"] = o.budget_scales;
  out.configs["recall_sizes"] = sizes_json(o.rc);
  out.configs["needle_sizes"] = sizes_json(o.nd);
  out.configs["probe"] = {{"seqs", o.probe_seqs}, {"seq_len", o.lm.seq_len}};
  out.configs["generation"] = {{"prompt", o.gen_prompt}, {"tokens", o.gen_tokens}, {"rounds", o.gen_rounds}};
  const double total_s = seconds_since(t0);
  write_outputs(o, out, total_s);
  for (const char* t : {"lm", "bpe", "recall", "needle"}) check_spread(out.runs, t);
  fmt::print("study wall time {:.1f} s; results in {}\n", total_s, o.out);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Self-test and smoke test

void expect(bool ok, const std::string& what) { KILN_CHECK(ok, "attention_study self-test: {}", what); }
bool near(double a, double b, double tol = 1e-9) { return std::fabs(a - b) <= tol * std::max(1.0, std::fabs(b)); }

void self_test() {
  expect(near(study::kurtosis({1, 2, 3, 4, 5}), 1.7), "kurtosis of 1..5 is 6.8/2² = 1.7");
  expect(near(study::kurtosis({0, 0, 0, 0, 10}), 3.25), "kurtosis of (0,0,0,0,10) is 832/16² = 3.25");
  expect(std::isnan(study::kurtosis({2, 2, 2})), "kurtosis of a constant sample is NaN");
  {
    Rng rng{7};  // a large Gaussian sample (Box–Muller) has kurtosis ≈ 3
    std::vector<float> g;
    for (int i = 0; i < 200000; ++i) {
      const double u1 = (double(rng.next() >> 11) + 1) / 9007199254740993.0, u2 = double(rng.next() >> 11) / 9007199254740992.0;
      g.push_back(float(std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2)));
    }
    const double k = study::kurtosis(g);
    expect(std::fabs(k - 3) < 0.06, fmt::format("kurtosis of 200k Gaussian draws is {}, not ≈ 3", k));
  }
  const study::MeanStd m = study::mean_std({1, 2, 3, 4, std::nan("")});
  expect(m.n == 4 && near(m.mean, 2.5) && near(m.std, std::sqrt(5.0 / 3.0)), "mean ± sample std of 1..4 (NaN skipped) is 2.5 ± 1.29099");
  expect(study::mean_std({7}).std == 0 && study::mean_std({}).n == 0, "mean_std of one value has std 0; of none, n 0");
  std::vector<float> xs;
  for (int i = 1; i <= 200; ++i) xs.push_back(float(i % 2 ? -i : i));
  const study::Magnitudes g = study::magnitudes(xs);
  expect(g.top1 == 200 && g.top10 == 191 && g.top100 == 101 && g.median == 100.5, "magnitudes of ±1..±200: 200, 191, 101, median 100.5");
  expect(std::isnan(study::magnitudes({1, 2}).top10), "top-10 of two values is NaN");
  expect(near(study::flops_to_reach({0, 1, 2, 3}, {4, 3, 2, 1}, 2.5), 1.5), "crossing at 2.5 of a line 4,3,2,1 is at x = 1.5");
  expect(near(study::flops_to_reach({10, 20, 30}, {3, 2.5, 2.4}, 2.75), 15), "crossing 2.75 between (10, 3) and (20, 2.5) is 15");
  expect(near(study::flops_to_reach({10, 20}, {1, 0.5}, 2), 10), "a curve below the target from the start reaches it at its first point");
  expect(std::isnan(study::flops_to_reach({10, 20}, {3, 2.5}, 2)), "a curve that never reaches the target gives NaN");
  {  // the several-budget advantage: base budgets at 1, 2, 4 FLOPs with final losses 3, 2, 1
    Outputs out;
    for (const char* v : {"mha", "mha+attnres_block"}) {
      RunResult r;
      r.task = "lm", r.variant = v, r.seed = 0;
      r.metrics = {{"train_flops", 2.0}, {"val_loss", 2.0}};
      out.runs.push_back(r);
    }
    for (int i = 0; i < 3; ++i) out.budgets.push_back({"mha", 0, 0.5 * (1 << i), double(1 << i), 3.0 - i, 10, i == 1});
    auto at = [&](double loss) {
      out.runs[1].metrics["val_loss"] = loss;
      const auto adv = budget_advantages(out);
      expect(adv.size() == 1 && adv[0].model == "mha+attnres_block", "one budget advantage for one pair and seed");
      return adv[0];
    };
    const BudgetAdvantage a = at(1.5);
    expect(a.status == "interpolated" && near(a.base_flops, std::sqrt(8.0)) && near(a.ratio, std::sqrt(2.0)),
           "loss 1.5 between (2 FLOPs, 2) and (4, 1) is reached at sqrt(8) FLOPs (linear in log FLOPs): ratio sqrt(2)");
    const BudgetAdvantage lo = at(3.5), hi = at(0.5);
    expect(lo.status == "below_smallest" && std::isnan(lo.ratio) && near(lo.bound, 0.5), "a loss the smallest budget beats: ratio ≤ 1/2");
    expect(hi.status == "beyond_largest" && std::isnan(hi.ratio) && near(hi.bound, 2), "a loss beyond the largest budget: ratio ≥ 4/2");
  }
  fmt::print("attention_study self-test: statistics OK\n");
}

// The rows of a results CSV after its header, split at commas, each `width` fields wide.
std::vector<std::vector<std::string>> csv_rows(const fs::path& path, size_t width) {
  std::ifstream f(path);
  expect(f.good(), fmt::format("cannot read {}", path.string()));
  std::string line;
  std::getline(f, line);
  std::vector<std::vector<std::string>> rows;
  while (std::getline(f, line)) {
    rows.push_back(split(line, ','));
    expect(rows.back().size() == width,
           fmt::format("{}: row '{}' has {} fields, not {}", path.filename().string(), line, rows.back().size(), width));
  }
  return rows;
}

// The whole study at --scale tiny in a fresh temporary folder; checks every output, then removes it.
int smoke(const std::string& argv0) {
  self_test();
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln_attention_study_smoke_{}", ::getpid());
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{dir};
  fs::create_directories(dir);
  {  // a small corpus of its own, so the test needs no package
    std::ofstream f(dir / "corpus.txt");
    Rng rng{1};
    const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs", "far"};
    for (int i = 0; i < 4000; ++i) f << words[rng.below(12)] << (rng.below(9) == 0 ? ".\n" : " ");
  }
  Options o;
  apply_scale(o, "tiny");
  o.out = (dir / "results").string();
  o.corpus = (dir / "corpus.txt").string();
  (void)argv0;
  study_main<Cpu>(o);
  const auto js = nlohmann::json::parse(std::ifstream(dir / "results" / "summary.json"));
  const size_t nv = o.variants.size(), ns = o.seeds.size();
  expect(
      js["runs"].size() == 4 * nv * ns,
      fmt::format("summary.json has {} runs, not 4 tasks (lm, bpe, recall, needle) × {} variants × {} seeds", js["runs"].size(), nv, ns));
  // Every run has its task's metrics, finite; parameters equal to within one SwiGLU unit; FLOPs to within one step.
  std::map<std::string, std::pair<double, double>> params, flops;
  std::map<std::string, std::map<std::string, std::vector<double>>> by_variant;  // "task/variant" -> metric -> values
  for (const auto& r : js["runs"]) {
    const std::string task = r["task"];
    std::vector<std::string> need = {"train_flops", "train_loss_ema"};
    if (task == "bpe") need.insert(need.end(), {"val_loss", "val_loss_per_byte", "eval_bytes_per_token"});
    if (task == "lm")
      need.insert(need.end(), {"val_loss", "hidden_top1", "hidden_top10", "hidden_median", "hidden_kurtosis", "logit_top1", "logit_top10",
                               "logit_median", "logit_kurtosis", "gen_ms_per_token", "probe_rebuild_error"});
    else if (task != "bpe")
      need.push_back("accuracy");
    if (task == "needle")
      for (int64_t L : o.needle_lengths) need.push_back(fmt::format("acc_L{}", L));
    for (const auto& n : need) {
      expect(r["metrics"].contains(n), fmt::format("{} {} seed {} lacks {}", task, std::string(r["variant"]), int(r["seed"]), n));
      const double v = r["metrics"][n];
      expect(std::isfinite(v), fmt::format("{} {}: {} is {}", task, std::string(r["variant"]), n, v));
      by_variant[task + "/" + std::string(r["variant"])][n].push_back(v);
    }
    if (task == "bpe") {
      const auto& m = r["metrics"];
      expect(m["eval_bytes_per_token"] > 1, "bpe: a token holds more than one byte on average");
      expect(near(m["val_loss_per_byte"], double(m["val_loss"]) / double(m["eval_bytes_per_token"]), 1e-5),
             "bpe: the loss per byte is the loss per token over the bytes per token");
    }
    if (task == "lm") {
      const auto& m = r["metrics"];
      expect(m["hidden_top1"] >= m["hidden_top10"] && m["hidden_top10"] >= m["hidden_median"], "hidden magnitudes are ordered");
      expect(m["logit_top1"] >= m["logit_top10"] && m["logit_top10"] >= m["logit_median"], "logit magnitudes are ordered");
    }
    auto& p = params.try_emplace(task, 1e300, 0).first->second;
    p = {std::min(p.first, double(r["params"])), std::max(p.second, double(r["params"]))};
    auto& f = flops.try_emplace(task, 1e300, 0).first->second;
    f = {std::min(f.first, double(r["metrics"]["train_flops"])), std::max(f.second, double(r["metrics"]["train_flops"]))};
  }
  for (const auto& [task, p] : params) {
    const TaskSizes& t = task == "lm" ? o.lm : task == "bpe" ? o.bp : task == "recall" ? o.rc : o.nd;
    expect(p.second - p.first <= 3.0 * double(t.d_model * t.n_layers),
           fmt::format("{}: parameters {}..{} differ by more than one SwiGLU unit", task, p.first, p.second));
    const double step_share = 1.0 / double(t.steps);  // rounding to whole steps
    expect((flops[task].second - flops[task].first) / flops[task].first <= 2 * step_share + 1e-9,
           fmt::format("{}: training FLOPs {}..{} are not matched", task, flops[task].first, flops[task].second));
  }
  // aggregate.csv: n = seeds, and mean ± std equal those recomputed here from the runs.
  std::ifstream agg(dir / "results" / "aggregate.csv");
  std::string line;
  std::getline(agg, line);
  expect(line == "task,variant,metric,n,mean,std", "aggregate.csv header");
  int64_t checked = 0;
  while (std::getline(agg, line)) {
    const auto c = split(line, ',');
    expect(c.size() == 6, fmt::format("aggregate.csv row '{}' has {} fields", line, c.size()));
    if (c[0] == "lm_advantage") continue;
    const auto it = by_variant.find(c[0] + "/" + c[1]);
    if (it == by_variant.end() || !it->second.count(c[2])) continue;
    const study::MeanStd m = study::mean_std(it->second.at(c[2]));
    expect(std::stoll(c[3]) == int64_t(ns) && m.n == int64_t(ns), fmt::format("aggregate {}: n is {}, not {}", line, c[3], ns));
    expect(near(std::stod(c[4]), m.mean, 1e-4) && near(std::stod(c[5]), m.std, 1e-4),
           fmt::format("aggregate {}: not {} ± {}", line, m.mean, m.std));
    ++checked;
  }
  expect(checked >= int64_t(nv) * 3, fmt::format("aggregate.csv: only {} rows checked", checked));
  // advantage.csv: one row per seed and pair; the ratio is base_flops / model_flops.
  int64_t adv_rows = 0;
  for (const auto& c : csv_rows(dir / "results" / "advantage.csv", 7)) {
    const double ratio = std::stod(c[6]), want = std::stod(c[5]) / std::stod(c[3]);
    expect(std::isnan(want) ? std::isnan(ratio) : near(ratio, want, 1e-4),
           fmt::format("advantage row '{}': ratio is not base/model FLOPs", fmt::join(c, ",")));
    ++adv_rows;
  }
  expect(adv_rows == 5 * int64_t(ns), fmt::format("advantage.csv has {} rows, not 5 pairs × {} seeds", adv_rows, ns));
  // budgets.csv: every base × seed × scale; scale 1 is the lm run; the others train scale × its FLOPs.
  std::map<std::pair<std::string, int64_t>, std::pair<double, double>> lm_final;  // (variant, seed) -> (FLOPs, loss)
  for (const auto& r : js["runs"])
    if (r["task"] == "lm") lm_final[{r["variant"], r["seed"]}] = {r["metrics"]["train_flops"], r["metrics"]["val_loss"]};
  int64_t bud_rows = 0;
  for (const auto& c : csv_rows(dir / "results" / "budgets.csv", 7)) {
    const std::string row = fmt::format("{}", fmt::join(c, ","));
    const auto [f1, l1] = lm_final.at({c[0], std::stoll(c[1])});
    const double scale = std::stod(c[2]), bflops = std::stod(c[4]);
    if (scale == 1.0) expect(c[6] == "lm run" && near(std::stod(c[5]), l1, 1e-5), fmt::format("budgets row '{}' is not the lm run", row));
    expect(std::fabs(bflops / f1 - scale) <= 2.0 / double(o.lm.steps) + 1e-9,
           fmt::format("budgets row '{}': not {} × the lm FLOPs", row, scale));
    ++bud_rows;
  }
  expect(bud_rows == 3 * int64_t(ns * o.budget_scales.size()),
         fmt::format("budgets.csv has {} rows, not 3 bases × seeds × scales", bud_rows));
  int64_t badv_rows = 0;
  for (const auto& c : csv_rows(dir / "results" / "budget_advantage.csv", 9)) {
    const std::string row = fmt::format("{}", fmt::join(c, ","));
    const double ratio = std::stod(c[6]);
    if (c[7] == "interpolated")
      expect(near(ratio, std::stod(c[5]) / std::stod(c[3]), 1e-4),
             fmt::format("budget advantage '{}': ratio is not base/model FLOPs", row));
    else
      expect((c[7] == "below_smallest" || c[7] == "beyond_largest") && std::isnan(ratio) && std::isfinite(std::stod(c[8])),
             fmt::format("budget advantage '{}': a bounded row has ratio NaN and a bound", row));
    ++badv_rows;
  }
  expect(badv_rows == 5 * int64_t(ns), fmt::format("budget_advantage.csv has {} rows, not 5 pairs × {} seeds", badv_rows, ns));
  for (const char* f : {"curves.csv", "runs.csv", "gen.csv", "configs.json", "bpe_tokenizer.json"})
    expect(fs::file_size(dir / "results" / f) > 0, fmt::format("{} is empty", f));
  fmt::print("attention_study smoke test: OK ({} runs, {} aggregate rows checked)\n", js["runs"].size(), checked);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    for (int i = 1; i < argc; ++i) {
      if (std::string(argv[i]) == "--self-test") {
        self_test();
        return 0;
      }
      if (std::string(argv[i]) == "--smoke") return smoke(argv[0]);
    }
    return study_main<Cpu>(parse(argc, argv));
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
