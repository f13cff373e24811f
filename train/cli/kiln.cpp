// The `kiln` command line: train, sample, eval, tokenize, inspect. See `kiln --help`.
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/backends/dispatch.hpp"
#include "kiln/core/profile.hpp"
#include "kiln/dist/process_group.hpp"
#include "kiln/formats/hf_dir.hpp"
#include "kiln/formats/printable.hpp"
#include "kiln/formats/safetensors.hpp"
#include "kiln/nn/generate.hpp"
#include "kiln/nn/hf/causal_lm.hpp"
#include "kiln/nn/hf/export.hpp"
#include "kiln/nn/lora.hpp"
#include "kiln/text/bpe_trainer.hpp"
#include "kiln/text/tokenizer.hpp"
#include "kiln/train/data.hpp"
#include "kiln/train/finetune.hpp"
#include "kiln/train/plot.hpp"
#include "kiln/train/text.hpp"
#include "kiln/train/trainer.hpp"
#include "kiln/version.hpp"

using namespace kiln;

namespace {

struct Flag {
  std::string name;  // without "--"
  std::string help;
  bool boolean = false;
};

// Parses "--flag value" / "--flag=value" / "--switch"; unknown flags are an error listing the valid ones.
class Args {
 public:
  Args(std::string cmd, std::string usage, std::vector<Flag> flags)
      : cmd_(std::move(cmd)), usage_(std::move(usage)), flags_(std::move(flags)) {
    flags_.push_back({"help", "show this help", true});
  }
  void parse(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      KILN_CHECK(a.rfind("--", 0) == 0, "kiln {}: unexpected argument '{}' (flags start with --; see kiln {} --help)", cmd_, a, cmd_);
      std::string name = a.substr(2), value;
      const auto eq = name.find('=');
      const bool has_eq = eq != std::string::npos;
      if (has_eq) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      const Flag* f = find(name);
      if (!f) {
        std::vector<std::string> valid;
        for (const Flag& g : flags_) valid.push_back("--" + g.name);
        fail("kiln {}: unknown flag '--{}' (valid: {})", cmd_, name, fmt::join(valid, ", "));
      }
      if (f->boolean) {
        values_[name] = has_eq ? value : "1";
      } else {
        if (!has_eq) {
          KILN_CHECK(i + 1 < argc, "kiln {}: --{} needs a value", cmd_, name);
          value = argv[++i];
        }
        values_[name] = value;
      }
      lists_[name].push_back(values_[name]);
    }
    if (has("help")) {
      fmt::print("{}\n\nflags:\n", usage_);
      for (const Flag& f : flags_) fmt::print("  --{:<16} {}\n", f.name + (f.boolean ? "" : " X"), f.help);
      std::exit(0);
    }
  }
  bool has(const std::string& n) const { return values_.count(n) != 0; }
  // Every value of a flag given several times, in order (a single-valued flag keeps the last).
  std::vector<std::string> list(const std::string& n) const { return lists_.count(n) ? lists_.at(n) : std::vector<std::string>{}; }
  std::string str(const std::string& n, const std::string& def = "") const { return has(n) ? values_.at(n) : def; }
  std::string required(const std::string& n) const {
    KILN_CHECK(has(n), "kiln {}: --{} is required (see kiln {} --help)", cmd_, n, cmd_);
    return values_.at(n);
  }
  int64_t integer(const std::string& n, int64_t def) const {
    if (!has(n)) return def;
    try {
      size_t used = 0;
      const int64_t v = std::stoll(values_.at(n), &used);
      if (used == values_.at(n).size()) return v;
    } catch (const std::exception&) {
    }
    fail("kiln {}: --{} must be an integer, got '{}'", cmd_, n, values_.at(n));
  }
  double number(const std::string& n, double def) const {
    if (!has(n)) return def;
    try {
      size_t used = 0;
      const double v = std::stod(values_.at(n), &used);
      if (used == values_.at(n).size()) return v;
    } catch (const std::exception&) {
    }
    fail("kiln {}: --{} must be a number, got '{}'", cmd_, n, values_.at(n));
  }

 private:
  const Flag* find(const std::string& n) const {
    for (const Flag& f : flags_)
      if (f.name == n) return &f;
    return nullptr;
  }
  std::string cmd_, usage_;
  std::vector<Flag> flags_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> lists_;
};

const char* kUsage = R"(kiln: train and sample GPT models (differential attention, attention residuals) in C++

usage: kiln <command> [flags]      kiln <command> --help for the flags of a command;  kiln --version

The file formats and the model's math: docs/formats.md and docs/specs.md in kiln's repository,
installed in share/doc/kiln/.

commands:
  train      train a GPT on a token file (checkpoints, resume, JSONL log)
  sample     generate text from a checkpoint (KV cache, temperature, top-k)
  generate   generate from a Hugging Face model directory or a kiln checkpoint (ids or text)
  eval       mean cross-entropy of a checkpoint or Hugging Face model directory (+ a LoRA adapter) on a token file
  export     write a Hugging Face model directory (transformers loads it) from a checkpoint or model dir
  tokenize   turn a text file into a token file (bytes, characters with --chars, or a model's own
             tokenizer with --tokenizer: tokenizer.json / tokenizer.model); --print-ids prints the ids
  tokenizer  `kiln tokenizer train`: train a byte-level BPE tokenizer (GPT-2 layout) on text files and
             write its tokenizer.json (Hugging Face `tokenizers` loads it)
  inspect    list the tensors and metadata of a safetensors file or checkpoint
  plot       draw loss, eval loss, lr, grad norm and tokens/s of JSONL logs into a PNG (gnuplot))";

int cmd_train(int argc, char** argv) {
  Args a(
      "train", "kiln train --model model.json --train train.json --data tokens.safetensors [flags]",
      {{"model", "model config JSON (docs/formats.md); defaults when absent"},
       {"train", "training config JSON (docs/formats.md); defaults when absent"},
       {"data", "token file: safetensors with a 1-D integer tensor 'tokens' (required), or a text file with --tokenizer"},
       {"eval-data", "held-out token file (or text file with --tokenizer), evaluated every eval_every steps"},
       // Training on text directly (docs/formats.md, "Tokenizers"): --data/--eval-data text files encoded with it.
       {"tokenizer",
        "a pretrained tokenizer (model directory, tokenizer.json or tokenizer.model): --data and --eval-data may be text files, "
        "encoded with it; its vocabulary must fit the model's (with --init-from MODEL_DIR: default the directory's)"},
       {"init-from",
        "initial weights (safetensors with the model's parameter names), or a Hugging Face model directory to fine-tune "
        "(--data then may be a text file, tokenized with the model's tokenizer)"},
       // LoRA (docs/lora.md): with --init-from MODEL_DIR; train.json's "lora" object holds the same keys.
       {"lora-r", "LoRA rank: adapters on the --lora-target modules, only they train (0: every parameter)"},
       {"lora-alpha", "LoRA alpha (scaling alpha/r; default 16)"},
       {"lora-dropout", "LoRA dropout on the adapters' input (default 0)"},
       {"lora-target", "comma-separated module names or globs (default: PEFT's for the model: c_attn on GPT-2, else q_proj,v_proj)"},
       {"save",
        "write the final weights here (safetensors); with --init-from MODEL_DIR: a directory, the adapter with LoRA, else a "
        "Hugging Face model directory (FILE.safetensors: kiln's state dict)"},
       {"log", "write one JSON object per step here (JSONL)"},
       {"checkpoint", "write a resumable checkpoint here (every checkpoint_every steps and at the end)"},
       {"resume", "resume from this checkpoint (weights, optimizer, step, RNG)"},
       {"stop-after", "stop after this many steps in total (the checkpoint lets a later run resume)"},
       {"time-limit",
        "wall seconds for the whole run (train.json \"time_limit_s\"): after 23 steps it plans the steps that fit (revised as it "
        "goes), its schedule ending with them, and stops at the limit whatever the plan"},
       {"device", "cpu (default), reference, or cuda"},
       {"seed", "seed for initialisation and sampling (default 0)"},
       {"dtype", "parameter dtype: f32 (default) or f64"},
       {"progress",
        "auto (default) or on: a bar redrawn in place on a terminal, plain lines (every 5% of the steps or 30 s) in a file or pipe; off"},
       {"profile", "record every op (docs/profiling.md): write the Chrome trace here, print the table at the end"},
       {"activation-checkpointing",
        "recompute each layer's activations in backward instead of keeping them (train.json "
        "\"activation_checkpointing\": same gradients, less memory, more time)",
        true},
       {"quiet", "print nothing but errors", true}});
  a.parse(argc, argv, 2);
  TrainOptions o;
  o.activation_checkpointing = a.has("activation-checkpointing");
  o.model_path = a.str("model");
  o.train_path = a.str("train");
  o.data_path = a.required("data");
  o.eval_data_path = a.str("eval-data");
  o.tokenizer = a.str("tokenizer");
  o.init_from = a.str("init-from");
  o.save_path = a.str("save");
  o.log_path = a.str("log");
  o.checkpoint_path = a.str("checkpoint");
  o.resume_path = a.str("resume");
  o.stop_after = a.integer("stop-after", -1);
  if (a.has("time-limit")) o.time_limit_s = a.number("time-limit", 0);
  o.device = a.str("device", "cpu");
  o.seed = static_cast<uint64_t>(a.integer("seed", 0));
  o.dtype = parse_dtype(a.str("dtype", "f32"));
  KILN_CHECK(o.dtype == DType::f32 || o.dtype == DType::f64, "kiln train: --dtype must be f32 or f64, got {}", o.dtype);
  const std::string p = a.str("progress", "auto");
  KILN_CHECK(p == "auto" || p == "on" || p == "off", "kiln train: --progress must be auto, on or off, got '{}'", p);
  o.progress = p == "auto" ? -1 : p == "on" ? 1 : 0;
  o.quiet = a.has("quiet");
  // Started by mpirun/srun: one rank of a data-parallel job (docs/distributed.md).
  if (dist::launched()) dist::init();
  std::string prof = a.str("profile");
  if (!prof.empty() && dist::launched()) prof += fmt::format(".rank{}", dist::rank());  // one trace per process
  if (!prof.empty()) profile::start();
  // Fine-tuning a Hugging Face model directory (train/finetune.hpp), with LoRA from the flags or train.json.
  std::optional<LoraTrainConfig>& lora = o.lora;
  if (a.has("lora-r") || a.has("lora-alpha") || a.has("lora-dropout") || a.has("lora-target")) {
    KILN_CHECK(!o.init_from.empty() || !o.resume_path.empty(),
               "kiln train: --lora-* needs --init-from (a Hugging Face model directory or kiln weights) to adapt");
    lora = TrainConfig::load(o.train_path).lora;
    lora->r = a.integer("lora-r", lora->r == 0 ? 8 : lora->r);
    lora->alpha = a.number("lora-alpha", lora->alpha);
    lora->dropout = a.number("lora-dropout", lora->dropout);
    if (a.has("lora-target")) {
      lora->target_modules.clear();
      std::stringstream ss(a.str("lora-target"));
      for (std::string t; std::getline(ss, t, ',');)
        if (!t.empty()) lora->target_modules.push_back(t);
    }
  }
  const bool finetune = !o.init_from.empty() && hf::is_model_dir(o.init_from);
  const TrainResult r = finetune ? finetune_causal_lm(o) : train_gpt(o);
  if (!prof.empty()) {
    profile::stop();
    profile::write_chrome_trace(prof);
    if (!o.quiet) fmt::print(stderr, "{}kiln train: profile trace written to {}\n", profile::report(), prof);
  }
  return r.interrupted ? 130 : 0;
}

// Bytes <-> lower-case hex (a character-level alphabet with non-ASCII bytes in safetensors metadata).
std::string to_hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (const char ch : bytes) {
    const auto b = static_cast<unsigned char>(ch);
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}
std::string from_hex(const std::string& s) {
  auto digit = [&](char ch) -> int {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    fail("alphabet_hex: '{}' is not lower-case hex", printable(s, 40));
  };
  KILN_CHECK(s.size() % 2 == 0, "alphabet_hex: odd length {}", s.size());
  std::string out;
  for (size_t i = 0; i < s.size(); i += 2) out += static_cast<char>(digit(s[i]) * 16 + digit(s[i + 1]));
  return out;
}

// Text <-> tokens for sampling: a checkpoint trained with `kiln tokenize --chars` carries its alphabet,
// one trained with `kiln tokenize --tokenizer DIR` the tokenizer's path.
struct Codec {
  std::optional<CharTokenizer> chars;
  std::optional<text::Tokenizer> pretrained;
  std::vector<int64_t> encode(const std::string& s) const {
    if (pretrained) {
      const auto ids = pretrained->encode(s, false);
      return {ids.begin(), ids.end()};
    }
    return chars ? chars->encode(s) : ByteTokenizer::encode(s);
  }
  std::string decode(const std::vector<int64_t>& ids) const {
    if (pretrained) {
      const std::vector<int32_t> v(ids.begin(), ids.end());
      return pretrained->decode(v);
    }
    return chars ? chars->decode(ids) : ByteTokenizer::decode(ids);
  }
  int64_t vocab_size() const { return pretrained ? pretrained->vocab_size() : chars ? chars->vocab_size() : ByteTokenizer::vocab_size; }
};

Codec codec_for(const std::string& data_path, const std::string& tokenizer) {
  Codec c;
  if (!tokenizer.empty()) {
    c.pretrained = text::Tokenizer::load(tokenizer);
    return c;
  }
  if (data_path.empty()) return c;
  std::map<std::string, std::string> m;
  try {
    m = safetensors::File::open(data_path).metadata();
  } catch (const Error&) {
    return c;  // the data file may have moved: fall back to bytes
  }
  if (const auto hx = m.find("alphabet_hex"); hx != m.end())
    c.chars = CharTokenizer(from_hex(hx->second));
  else if (const auto it = m.find("alphabet"); it != m.end())
    c.chars = CharTokenizer(it->second);
  else if (const auto tp = m.find("tokenizer_path"); tp != m.end()) {
    try {
      c.pretrained = text::Tokenizer::load(tp->second);
    } catch (const Error& e) {
      fail("the token file '{}' was made with the tokenizer '{}', which cannot be read now ({}); give it with --tokenizer", data_path,
           tp->second, e.what());
    }
  }
  return c;
}

int cmd_sample(int argc, char** argv) {
  Args a("sample", "kiln sample --checkpoint ckpt.safetensors [--prompt TEXT] [flags]",
         {{"checkpoint", "checkpoint or weights file (required)"},
          {"model", "model config JSON (needed for a plain weights file)"},
          {"data", "token file the model was trained on (for its alphabet or tokenizer; default: the checkpoint's)"},
          {"tokenizer",
           "the tokenizer to encode the prompt and decode with (a model directory, tokenizer.json or tokenizer.model; default: the token "
           "file's)"},
          {"prompt", "text to continue (default: a newline)"},
          {"tokens", "number of tokens to generate (default 200)"},
          {"temperature", "sampling temperature, 0 = greedy (default 0.8)"},
          {"top-k", "sample among the k most likely tokens, 0 = all (default 40)"},
          {"seed", "sampling seed (default 0)"},
          {"device", "cpu (default), reference, or cuda"}});
  a.parse(argc, argv, 2);
  const std::string ck = a.required("checkpoint");
  const std::string prompt = a.str("prompt", "\n");
  nn::SampleOptions so{.max_new_tokens = a.integer("tokens", 200),
                       .temperature = a.number("temperature", 0.8),
                       .top_k = a.integer("top-k", 40),
                       .seed = static_cast<uint64_t>(a.integer("seed", 0))};
  KILN_CHECK(so.max_new_tokens >= 0 && so.top_k >= 0, "kiln sample: --tokens and --top-k must be >= 0");
  const CheckpointInfo info = read_checkpoint_info(ck);
  // a checkpoint of `kiln train --tokenizer` names its tokenizer
  const auto ck_tok = info.metadata.find("tokenizer_path");
  const Codec codec = codec_for(a.str("data", info.data_path), a.str("tokenizer", ck_tok != info.metadata.end() ? ck_tok->second : ""));
  so.vocab_limit = codec.vocab_size();  // only ids the codec can decode
  const std::vector<int64_t> out = dispatch(a.str("device", "cpu"), [&]<Backend B>() {
    auto model = load_gpt<B>(ck, a.str("model"));
    return model->generate(codec.encode(prompt), so);
  });
  fmt::print("{}{}\n", prompt, codec.decode(out));
  return 0;
}

// ------------------------------------------------------------------------------------- kiln generate
// `kiln generate MODEL [flags]`: MODEL is a Hugging Face directory (config.json + safetensors) or a
// kiln checkpoint (a file, or a directory holding checkpoint.safetensors). Prompts are ids
// (--prompt-ids 1,2,3) or text (--prompt): text needs a tokenizer, kiln's byte/character codec for its
// own checkpoints and the model's tokenizer for Hugging Face models (the seam below). Information goes to
// stderr; stdout gets the output: with --print-ids one line of comma-separated generated ids per prompt.

std::vector<int64_t> parse_ids(const std::string& flag, const std::string& s) {
  std::vector<int64_t> out;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    const std::string t = s.substr(i, j - i);
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KILN_CHECK(!t.empty() && used == t.size() && v >= 0, "kiln generate: --{} must be comma-separated token ids (0, 1, ...), got '{}'",
               flag, s);
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

std::string join_ids(const std::vector<int64_t>& ids) { return fmt::format("{}", fmt::join(ids, ",")); }

// kiln's byte/character codec as a detokenizer (kiln generate on a kiln checkpoint).
class CodecDetokenizer : public nn::Detokenizer {
 public:
  explicit CodecDetokenizer(const Codec& c) : c_(c) {}
  std::string push(int64_t id) override { return c_.decode({id}); }

 private:
  const Codec& c_;
};

bool is_directory(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// --adapter DIR (kiln generate, kiln export): the PEFT LoRA adapter loaded onto the model and merged into
// its weights (W += scaling·B·A, PEFT's merge_and_unload); nothing when dir is empty.
template <Backend B> void merge_adapter(nn::Module<B>& model, const std::string& dir, const char* cmd) {
  if (dir.empty()) return;
  const size_t n = nn::load_lora(model, dir).size();
  nn::merge_lora(model);
  fmt::print(stderr, "kiln {}: LoRA adapter {} merged ({} Linears)\n", cmd, dir, n);
}

int cmd_generate(int argc, char** argv) {
  Args a("generate",
         "kiln generate MODEL_DIR (--prompt-ids 1,2,3 | --prompt TEXT) [flags]\n\n"
         "MODEL_DIR: a Hugging Face model directory (config.json, model.safetensors or its sharded index) or a kiln\n"
         "checkpoint. Sampling defaults come from the model's generation_config.json (greedy when it has none); --adapter\n"
         "merges a PEFT LoRA adapter into the model first.",
         {{"prompt-ids", "prompt token ids, comma-separated; repeat the flag for a batch of prompts"},
          {"prompt", "prompt text (the model's tokenizer; repeat for a batch)"},
          {"max-new-tokens", "tokens to generate per prompt (default 20)"},
          {"temperature", "0 = greedy; > 0 samples (default: generation_config.json's, else 0)"},
          {"top-k", "sample among the k most likely tokens, 0 = all"},
          {"top-p", "sample among the most likely tokens holding this probability, 1 = all"},
          {"repetition-penalty", "transformers' repetition penalty, 1 = none"},
          {"seed", "sampling seed (default 0)"},
          {"stop-ids", "comma-separated ids that end a sequence, besides the model's EOS"},
          {"stop", "a text that ends a sequence (not printed; repeat the flag for several; needs the tokenizer)"},
          {"batch-size", "prompts decoded together as one batch (default: all; 1: one after the other)"},
          {"ignore-eos", "do not stop at the model's EOS ids", true},
          {"print-ids", "print the generated ids, comma-separated, one line per prompt", true},
          {"adapter", "a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors), merged into the weights"},
          {"dtype", "parameters' dtype: f32 (default), bf16, f16"},
          {"autocast", "bf16 or f16: run matmuls and attention in that dtype (default: off)"},
          {"model", "model config JSON (a plain kiln weights file)"},
          {"device", "cpu (default), reference, or cuda"}});
  if (argc >= 3 && std::string(argv[2]) == "--help") a.parse(argc, argv, 2);
  KILN_CHECK(argc >= 3 && std::string(argv[2]).rfind("--", 0) != 0,
             "kiln generate: the model directory comes first (kiln generate MODEL_DIR "
             "--prompt-ids 1,2,3; see kiln generate --help)");
  std::string path = argv[2];
  a.parse(argc, argv, 3);
  KILN_CHECK(a.has("prompt-ids") != a.has("prompt"), "kiln generate: give --prompt-ids or --prompt (one of them)");

  const bool hf = hf::is_model_dir(path);
  if (!hf && is_directory(path)) {
    KILN_CHECK(::access((path + "/checkpoint.safetensors").c_str(), R_OK) == 0,
               "kiln generate: {} is neither a Hugging Face model directory (no config.json) nor holds a kiln checkpoint "
               "(checkpoint.safetensors)",
               path);
    path += "/checkpoint.safetensors";
  }
  std::optional<hf::ModelDir> dir;
  std::optional<CheckpointInfo> info;
  nn::GenerateOptions o;
  o.max_new_tokens = a.integer("max-new-tokens", 20);
  if (hf) {
    dir = hf::ModelDir::open(path);
    if (!a.has("ignore-eos")) o.stop_ids = hf::eos_token_ids(*dir);
    // transformers' generate() defaults: generation_config.json's sampling settings.
    if (const nlohmann::json* g = dir->generation_config(); g && g->value("do_sample", false)) {
      auto num = [&](const char* k, double def) { return g->contains(k) && (*g)[k].is_number() ? (*g)[k].get<double>() : def; };
      o.temperature = num("temperature", 1.0);
      o.top_k = static_cast<int64_t>(num("top_k", 50));
      o.top_p = num("top_p", 1.0);
      o.repetition_penalty = num("repetition_penalty", 1.0);
    } else if (g) {
      o.repetition_penalty =
          g->contains("repetition_penalty") && (*g)["repetition_penalty"].is_number() ? (*g)["repetition_penalty"].get<double>() : 1.0;
    }
    fmt::print(stderr, "kiln generate: Hugging Face model directory {}: {} ({} tensors, {} bytes of weights, {})\n", path,
               dir->architecture(), dir->tensor_names().size(), dir->weight_bytes(), dir->sharded() ? "sharded" : "model.safetensors");
  } else {
    info = read_checkpoint_info(path);
    fmt::print(stderr, "kiln generate: kiln {} {} (GPT, {} layers, d_model {})\n", info->is_checkpoint ? "checkpoint" : "weights file",
               path, info->model.n_layers, info->model.d_model);
  }
  o.temperature = a.number("temperature", o.temperature);
  o.top_k = a.integer("top-k", o.top_k);
  o.top_p = a.number("top-p", o.top_p);
  o.repetition_penalty = a.number("repetition-penalty", o.repetition_penalty);
  o.seed = static_cast<uint64_t>(a.integer("seed", 0));
  if (a.has("stop-ids"))
    for (int64_t id : parse_ids("stop-ids", a.str("stop-ids"))) o.stop_ids.push_back(id);

  if (a.has("stop")) o.stop_strings = a.list("stop");
  o.batch_size = a.integer("batch-size", 0);

  // Prompts and the way back to text (for --prompt, and for --stop).
  std::vector<std::vector<int64_t>> prompts;
  const bool text_mode = a.has("prompt");
  std::optional<text::Tokenizer> tok;
  std::optional<Codec> codec;
  if (text_mode || !o.stop_strings.empty()) {
    if (hf) {
      try {
        tok = text::Tokenizer::load(path);
      } catch (const Error& e) {
        if (text_mode) throw;
        fail("kiln generate: --stop needs the model's tokenizer to read the generated text: {}", e.what());
      }
      o.detokenizer = nn::detokenizer(*tok);
    } else {
      codec = codec_for(info->data_path, "");
      o.detokenizer = [&] { return std::make_unique<CodecDetokenizer>(*codec); };
      o.vocab_limit = codec->vocab_size();  // only ids the codec can decode
    }
  }
  if (text_mode) {
    for (const std::string& p : a.list("prompt")) {
      if (hf) {
        const auto v = tok->encode(p, true);
        prompts.emplace_back(v.begin(), v.end());
      } else {
        prompts.push_back(codec->encode(p));
      }
    }
  } else {
    for (const std::string& p : a.list("prompt-ids")) prompts.push_back(parse_ids("prompt-ids", p));
  }
  const bool print_ids = a.has("print-ids") || !text_mode;
  const DType dtype = parse_dtype(a.str("dtype", "f32"));
  const DType autocast = a.has("autocast") ? parse_dtype(a.str("autocast")) : DType::f32;

  // Streaming text (one prompt: as it comes, held back while it could begin a stop string; a batch:
  // each sequence printed when done).
  const bool stream = text_mode && !print_ids && prompts.size() == 1;
  if (stream) {
    fmt::print("{}", a.list("prompt")[0]);
    o.on_text = [&](size_t, const std::string& piece) {
      fmt::print("{}", piece);
      std::fflush(stdout);
    };
  }
  const nn::Generation g = dispatch(a.str("device", "cpu"), [&]<Backend B>() {
    if (hf) {
      auto model = hf::load_causal_lm<B>(*dir, {.dtype = dtype, .autocast = autocast});
      merge_adapter(*model, a.str("adapter"), "generate");
      return nn::generate(*model, prompts, o);
    }
    auto model = load_gpt<B>(path, a.str("model"));
    merge_adapter(*model, a.str("adapter"), "generate");
    return nn::generate(*model, prompts, o);
  });
  if (text_mode && !print_ids) {
    for (size_t s = 0; s < prompts.size(); ++s) {
      if (stream)
        fmt::print("\n");
      else
        fmt::print("{}{}\n", a.list("prompt")[s], g.text[s]);
    }
  }
  const nn::GenerateStats& st = g.stats;
  fmt::print(stderr, "prefill: {} tokens, {:.1f} tokens/s; decode: {} tokens, {:.1f} tokens/s\n", st.prefill_tokens,
             st.prefill_tokens_per_second(), st.decode_tokens, st.decode_tokens_per_second());
  if (print_ids)
    for (const auto& ids : g.ids) fmt::print("{}\n", join_ids(ids));
  return 0;
}

// ---------------------------------------------------------------------------- kiln export
// A Hugging Face model directory from a kiln checkpoint of the Llama shape (LlamaForCausalLM) or from a
// Hugging Face directory read by load_causal_lm (written back: identical tensors). nn/hf/export.hpp.
int cmd_export(int argc, char** argv) {
  Args a("export",
         "kiln export CHECKPOINT_OR_MODEL_DIR --format hf --out DIR [flags]\n\n"
         "Writes a Hugging Face model directory (config.json, generation_config.json, model.safetensors or shards with\n"
         "model.safetensors.index.json) that transformers' from_pretrained loads. The input is a kiln checkpoint (a file, or a\n"
         "directory holding checkpoint.safetensors) of the Llama shape, or a Hugging Face model directory; --adapter merges\n"
         "a PEFT LoRA adapter (what kiln train --lora-r writes) into it first.",
         {{"format", "the output format: hf (the one there is; the default)"},
          {"out", "the directory to write (required); an existing non-empty one needs --force"},
          {"dtype", "stored dtype: f32 (default), bf16, f16"},
          {"tokenizer", "copy the tokenizer files of this directory (default: the input model directory's, if it has any)"},
          {"max-shard-size", "shard above this many bytes per file: 2GB, 500MB, 1GiB, ... (default 5GB, as transformers)"},
          {"bos-id", "bos_token_id for config.json and generation_config.json (a kiln checkpoint has none)"},
          {"eos-id", "eos_token_id for config.json and generation_config.json (a kiln checkpoint has none)"},
          {"adapter", "a PEFT LoRA adapter directory merged into the weights written (as PEFT's merge_and_unload)"},
          {"model", "model config JSON (a plain kiln weights file)"},
          {"force", "replace an existing non-empty --out", true}});
  if (argc >= 3 && std::string(argv[2]) == "--help") a.parse(argc, argv, 2);
  KILN_CHECK(
      argc >= 3 && std::string(argv[2]).rfind("--", 0) != 0,
      "kiln export: the checkpoint or model directory comes first (kiln export CHECKPOINT --format hf --out DIR; see kiln export --help)");
  std::string path = argv[2];
  a.parse(argc, argv, 3);
  KILN_CHECK(a.str("format", "hf") == "hf", "kiln export: --format '{}' is not one kiln writes (valid: hf)", a.str("format"));
  const std::string out = a.required("out");
  hf::ExportOptions o;
  o.dtype = parse_dtype(a.str("dtype", "f32"));
  o.overwrite = a.has("force");
  if (a.has("max-shard-size")) o.max_shard_bytes = hf::parse_byte_size(a.str("max-shard-size"));
  if (a.has("bos-id")) o.bos_token_id = a.integer("bos-id", 0);
  if (a.has("eos-id")) o.eos_token_id = a.integer("eos-id", 0);
  o.tokenizer_from = a.str("tokenizer");
  const bool hf_in = hf::is_model_dir(path);
  if (hf_in) {
    KILN_CHECK(!a.has("model"), "kiln export: --model is for a plain kiln weights file, not a Hugging Face directory ({})", path);
    if (!a.has("tokenizer") && hf::has_tokenizer_files(path)) o.tokenizer_from = path;
    auto model = hf::load_causal_lm<Cpu>(path);
    fmt::print(stderr, "kiln export: Hugging Face model directory {} ({})\n", path, model->spec().architecture);
    merge_adapter(*model, a.str("adapter"), "export");
    hf::save_pretrained(*model, out, o);
  } else {
    if (is_directory(path)) {
      KILN_CHECK(::access((path + "/checkpoint.safetensors").c_str(), R_OK) == 0,
                 "kiln export: {} is neither a Hugging Face model directory (no config.json) nor holds a kiln checkpoint "
                 "(checkpoint.safetensors)",
                 path);
      path += "/checkpoint.safetensors";
    }
    auto model = load_gpt<Cpu>(path, a.str("model"));
    fmt::print(stderr, "kiln export: kiln checkpoint {} (GPT, {} layers, d_model {}) as LlamaForCausalLM\n", path, model->config().n_layers,
               model->config().d_model);
    merge_adapter(*model, a.str("adapter"), "export");
    hf::save_pretrained(*model, out, o);
  }
  const hf::ModelDir d = hf::ModelDir::open(out);
  fmt::print("kiln export: wrote {}: {}, {} tensors, {} bytes of weights ({}, {}){}\n", out, d.architecture(), d.tensor_names().size(),
             d.weight_bytes(), o.dtype, d.sharded() ? fmt::format("{} shards", d.files().size()) : "model.safetensors",
             o.tokenizer_from.empty() ? "" : ", tokenizer from " + o.tokenizer_from);
  return 0;
}

int cmd_eval(int argc, char** argv) {
  Args a("eval",
         "kiln eval --checkpoint CKPT_OR_MODEL_DIR --data tokens.safetensors [--adapter ADAPTER_DIR] [flags]\n\n"
         "Prints the mean cross-entropy of --batches batches (batch i, row r: the seq-len tokens from ((i·batch-size + r)·seq-len)\n"
         "mod (N − seq-len)) and its exp as JSON. The model is a kiln checkpoint or weights file, or a Hugging Face model directory\n"
         "(what kiln generate and kiln train --init-from read); --adapter puts a PEFT LoRA adapter on it.",
         {{"checkpoint", "kiln checkpoint or weights file, or a Hugging Face model directory (required)"},
          {"model", "model config JSON (needed for a plain weights file)"},
          {"adapter", "a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) applied to the model"},
          {"data", "token file (required)"},
          {"batches", "number of batches (default 16)"},
          {"batch-size", "rows per batch (default 8)"},
          {"seq-len", "tokens per row (default 64)"},
          {"device", "cpu (default), reference, or cuda"}});
  a.parse(argc, argv, 2);
  const std::string path = a.required("checkpoint");
  const bool hf_dir = hf::is_model_dir(path);
  KILN_CHECK(!hf_dir || !a.has("model"), "kiln eval: --model is for a plain kiln weights file, not a Hugging Face directory ({})", path);
  const TokenData data = TokenData::load(a.required("data"));
  const int64_t batches = a.integer("batches", 16), bs = a.integer("batch-size", 8), T = a.integer("seq-len", 64);
  const double loss = dispatch(a.str("device", "cpu"), [&]<Backend B>() {
    auto run = [&](auto& model, int64_t vocab) {
      if (a.has("adapter")) nn::load_lora(model, a.str("adapter"));
      data.check_vocab(vocab);
      model.eval();
      return evaluate<B>(model, data, batches, bs, T);
    };
    if (hf_dir) {
      auto model = hf::load_causal_lm<B>(path);
      const int64_t positions = model->max_positions();
      KILN_CHECK(positions == 0 || T <= positions, "kiln eval: --seq-len {} exceeds the {} positions of {} ({})", T, positions,
                 model->spec().architecture, path);
      return run(*model, model->spec().vocab);
    }
    auto model = load_gpt<B>(path, a.str("model"));
    return run(*model, model->config().vocab_size);
  });
  fmt::print("{}\n", nlohmann::json{{"loss", loss}, {"perplexity", std::exp(loss)}}.dump());
  return 0;
}

// The text of a file, or of the standard input for "-".
std::string read_input(const std::string& path) {
  if (path != "-") return read_text_file(path);
  std::ios::sync_with_stdio(false);
  std::string s((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  KILN_CHECK(!std::cin.bad(), "kiln tokenize: cannot read the standard input");
  return s;
}

int cmd_tokenize(int argc, char** argv) {
  Args a("tokenize",
         "kiln tokenize --text corpus.txt --out tokens.safetensors [--chars | --tokenizer MODEL_DIR] [--eval-out eval.safetensors]\n"
         "       kiln tokenize --tokenizer MODEL_DIR --print-ids [--text corpus.txt] < corpus.txt",
         {{"text", "input text file ('-' or absent with --print-ids: the standard input)"},
          {"out", "output token file (required unless --print-ids)"},
          {"chars", "character-level vocabulary (the corpus's distinct bytes) instead of bytes (256)", true},
          {"tokenizer",
           "a pretrained model's tokenizer: a Hugging Face model directory (tokenizer.json, tokenizer.model), or one of those files"},
          {"print-ids", "print the ids of the whole text as one comma-separated line (with --tokenizer, or bytes/--chars)", true},
          {"no-special-tokens",
           "with --tokenizer: no BOS/EOS from the tokenizer's post-processor (special tokens written in the text still count)", true},
          {"eval-out", "also write the last --eval-fraction of the tokens here, and leave them out of --out"},
          {"eval-fraction", "held-out fraction for --eval-out (default 0.05)"},
          {"max-bytes", "read at most this many bytes of the text (default: all)"}});
  a.parse(argc, argv, 2);
  const bool print_ids = a.has("print-ids");
  KILN_CHECK(!(a.has("chars") && a.has("tokenizer")), "kiln tokenize: --chars and --tokenizer exclude each other");
  std::string text = read_input(print_ids ? a.str("text", "-") : a.required("text"));
  const int64_t maxb = a.integer("max-bytes", -1);
  if (maxb >= 0 && static_cast<size_t>(maxb) < text.size()) text.resize(static_cast<size_t>(maxb));
  std::vector<int64_t> ids;
  std::map<std::string, std::string> meta{{"tokenizer", a.has("chars") ? "chars" : a.has("tokenizer") ? "pretrained" : "bytes"}};
  int64_t vocab = 256;
  if (a.has("tokenizer")) {
    const text::Tokenizer tok = text::Tokenizer::load(a.str("tokenizer"));
    const std::vector<int32_t> v = tok.encode(text, !a.has("no-special-tokens"));
    ids.assign(v.begin(), v.end());
    vocab = tok.vocab_size();
    std::error_code ec;
    const auto abs = std::filesystem::absolute(a.str("tokenizer"), ec);
    meta["tokenizer_path"] = ec ? a.str("tokenizer") : abs.lexically_normal().string();
    meta["tokenizer_kind"] = tok.description();
    if (tok.bos_id()) meta["bos_id"] = std::to_string(*tok.bos_id());
    if (tok.eos_id()) meta["eos_id"] = std::to_string(*tok.eos_id());
  } else if (a.has("chars")) {
    const CharTokenizer t = CharTokenizer::fit(text);
    ids = t.encode(text);
    // The alphabet is a set of bytes: as text when it is ASCII, else as hex (the bytes of a multi-byte
    // UTF-8 character, sorted apart, are no valid string for the JSON header).
    const std::string& al = t.alphabet();
    if (std::all_of(al.begin(), al.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x80; }))
      meta["alphabet"] = al;
    else
      meta["alphabet_hex"] = to_hex(al);
    vocab = t.vocab_size();
  } else {
    ids = ByteTokenizer::encode(text);
  }
  if (print_ids) {  // the ids alone, one line (the last), for scripts
    fmt::print("{}\n", fmt::join(ids, ","));
    return 0;
  }
  std::vector<int64_t> held;
  if (a.has("eval-out")) {
    const double frac = a.number("eval-fraction", 0.05);
    KILN_CHECK(frac > 0 && frac < 1, "kiln tokenize: --eval-fraction must be in (0, 1), got {}", frac);
    const auto n = static_cast<size_t>(static_cast<double>(ids.size()) * (1 - frac));
    held.assign(ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end());
    ids.resize(n);
  }
  meta["vocab_size"] = std::to_string(vocab);
  auto write = [&](const std::string& path, const std::vector<int64_t>& v) {
    std::vector<int32_t> v32(v.begin(), v.end());
    safetensors::save<Cpu>(path, {{"tokens", Tensor<Cpu>::from_vector(v32)}}, meta);
  };
  write(a.required("out"), ids);
  if (a.has("eval-out")) write(a.str("eval-out"), held);
  fmt::print("{}\n", nlohmann::json{{"tokens", ids.size()}, {"eval_tokens", held.size()}, {"vocab_size", vocab}}.dump());
  return 0;
}

// `kiln tokenizer train`: kiln::text::train_bpe (text/bpe_trainer.hpp), flags named as `tokenizers`'
// BpeTrainer (vocab_size, min_frequency, special_tokens).
int cmd_tokenizer(int argc, char** argv) {
  KILN_CHECK(argc >= 3 && (std::string(argv[2]) == "train" || std::string(argv[2]) == "--help"),
             "kiln tokenizer: expected a subcommand: train (kiln tokenizer train --help)");
  Args a("tokenizer train",
         "kiln tokenizer train --data corpus.txt [--data more.txt ...] --vocab-size N [--min-frequency N] [--special-token TOK ...] "
         "--out DIR|tokenizer.json",
         {{"data", "a UTF-8 text file to train on (repeat for several; read line by line, as `tokenizers` reads files)"},
          {"vocab-size", "the vocabulary size: special tokens + 256 bytes + merges (required)"},
          {"min-frequency", "merge only pairs seen at least this often (default 0: every pair)"},
          {"special-token", "an added special token, ids 0, 1, ... in the order given (repeat for several)"},
          {"out", "a directory (gets tokenizer.json) or a path ending in .json (required)"}});
  a.parse(argc, argv, std::string(argv[2]) == "train" ? 3 : 2);
  const std::vector<std::string> files = a.list("data");
  KILN_CHECK(!files.empty(), "kiln tokenizer train: --data is required (see kiln tokenizer train --help)");
  text::BpeTrainOptions o;
  o.vocab_size = a.integer("vocab-size", 0);
  KILN_CHECK(a.has("vocab-size"), "kiln tokenizer train: --vocab-size is required");
  o.min_frequency = a.integer("min-frequency", 0);
  o.special_tokens = a.list("special-token");
  const std::string out = a.required("out");
  const auto t0 = std::chrono::steady_clock::now();
  const text::Tokenizer tok = text::train_bpe(files, o, out);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("{}\n", nlohmann::json{{"tokenizer", tok.path()}, {"vocab_size", tok.vocab_size()}, {"seconds", s}}.dump());
  return 0;
}

int cmd_plot(int argc, char** argv) {
  Args a("plot", "kiln plot --log a.jsonl [--label A] [--log b.jsonl [--label B] ...] --out curves.png",
         {{"log", "a JSONL log (kiln train --log); repeat for several runs, overlaid"},
          {"label", "the legend name of each --log, in order (default: the log's folder name)"},
          {"out", "the PNG to write (required)"},
          {"title", "a title above the panels"},
          {"size", "WIDTHxHEIGHT in pixels (default 1400x1000)"}});
  a.parse(argc, argv, 2);
  PlotOptions o{.logs = a.list("log"), .labels = a.list("label"), .out = a.required("out"), .title = a.str("title")};
  KILN_CHECK(!o.logs.empty(), "kiln plot: --log is required (see kiln plot --help)");
  if (a.has("size")) {
    const std::string sz = a.str("size");
    const auto x = sz.find('x');
    try {
      KILN_CHECK(x != std::string::npos, "");
      size_t u1 = 0, u2 = 0;
      o.width = std::stoi(sz.substr(0, x), &u1);
      o.height = std::stoi(sz.substr(x + 1), &u2);
      KILN_CHECK(u1 == x && u2 == sz.size() - x - 1, "");
    } catch (const std::exception&) {
      fail("kiln plot: --size must be WIDTHxHEIGHT (e.g. 1400x1000), got '{}'", sz);
    }
  }
  plot_logs(o);
  fmt::print("kiln plot: wrote {} ({} run{})\n", o.out, o.logs.size(), o.logs.size() == 1 ? "" : "s");
  return 0;
}

int cmd_inspect(int argc, char** argv) {
  Args a("inspect", "kiln inspect --file model.safetensors", {{"file", "safetensors file or checkpoint (required)"}});
  a.parse(argc, argv, 2);
  const auto f = safetensors::File::open(a.required("file"));
  int64_t total = 0;
  for (const std::string& n : f.names()) {
    const auto& i = f.info(n);
    total += kiln::numel(i.shape);
    fmt::print("{:<48} {:<5} {}\n", n, i.st_dtype, shape_str(i.shape));
  }
  fmt::print("{} tensors, {} elements\n", f.names().size(), total);
  for (const auto& [k, v] : f.metadata()) fmt::print("meta {} = {}\n", printable(k), printable(v, 200));
  return 0;
}

}  // namespace

// libgomp's default barrier spin (~300k iterations) collapses throughput ~10x when the cores are
// shared with other work (measured: a training step went from 0.7 s to 7.7 s next to two compile
// jobs on 2 cores). libgomp reads its environment once, when it is loaded, so the command re-executes
// itself with GOMP_SPINCOUNT=1000 — libgomp's own value once it detects oversubscription — unless the
// user chose OMP_WAIT_POLICY or GOMP_SPINCOUNT.
void set_omp_spin_policy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT") || std::getenv("KILN_NO_REEXEC")) return;
  ::setenv("GOMP_SPINCOUNT", "1000", 0);
  ::setenv("KILN_NO_REEXEC", "1", 0);
  ::execv("/proc/self/exe", argv);  // returns only on failure: then go on with the default policy
}

int main(int argc, char** argv) {
  set_omp_spin_policy(argv);
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" || std::string(argv[1]) == "help") {
    fmt::print("{}\n", kUsage);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "version") {
    // The library's version (libkiln.so) and, if they differ, the headers this command was built with.
    fmt::print("kiln {}{}\n", kiln::version(),
               std::string(kiln::version()) == KILN_VERSION_STRING ? "" : fmt::format(" (built against {})", KILN_VERSION_STRING));
    return 0;
  }
  try {
    if (cmd == "train") return cmd_train(argc, argv);
    if (cmd == "sample") return cmd_sample(argc, argv);
    if (cmd == "generate") return cmd_generate(argc, argv);
    if (cmd == "eval") return cmd_eval(argc, argv);
    if (cmd == "export") return cmd_export(argc, argv);
    if (cmd == "tokenize") return cmd_tokenize(argc, argv);
    if (cmd == "tokenizer") return cmd_tokenizer(argc, argv);
    if (cmd == "inspect") return cmd_inspect(argc, argv);
    if (cmd == "plot") return cmd_plot(argc, argv);
    fmt::print(stderr, "kiln: unknown command '{}' (valid: train, sample, generate, eval, export, tokenize, tokenizer, inspect, plot)\n",
               cmd);
    return 2;
  } catch (const Error& e) {
    // In a job of several ranks, say which one (each rank reports its own errors).
    const std::string who = kiln::dist::is_initialized() && kiln::dist::world_size() > 1
                                ? fmt::format(" (rank {} of {})", kiln::dist::rank(), kiln::dist::world_size())
                                : std::string();
    // The readers escape the file bytes they quote (formats/printable.hpp); this is the net behind them.
    fmt::print(stderr, "kiln {}{}: error: {}\n", cmd, who, printable(e.what(), std::string::npos));
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln {}: internal error: {}\n", cmd, printable(e.what(), std::string::npos));
    return 3;
  }
}
