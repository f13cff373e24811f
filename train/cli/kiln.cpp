// The `kiln` command line: train, sample, eval, tokenize, inspect. See `kiln --help`.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/backends/dispatch.hpp"
#include "kiln/core/profile.hpp"
#include "kiln/formats/printable.hpp"
#include "kiln/formats/safetensors.hpp"
#include "kiln/dist/process_group.hpp"
#include "kiln/train/data.hpp"
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
  Args(std::string cmd, std::string usage, std::vector<Flag> flags) : cmd_(std::move(cmd)), usage_(std::move(usage)), flags_(std::move(flags)) {
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
  eval       mean cross-entropy of a checkpoint on a token file
  tokenize   turn a text file into a token file (byte-level, or character-level with --chars)
  inspect    list the tensors and metadata of a safetensors file or checkpoint
  plot       draw loss, eval loss, lr, grad norm and tokens/s of JSONL logs into a PNG (gnuplot))";

int cmd_train(int argc, char** argv) {
  Args a("train", "kiln train --model model.json --train train.json --data tokens.safetensors [flags]",
         {{"model", "model config JSON (docs/formats.md); defaults when absent"},
          {"train", "training config JSON (docs/formats.md); defaults when absent"},
          {"data", "token file: safetensors with a 1-D integer tensor 'tokens' (required)"},
          {"eval-data", "held-out token file, evaluated every eval_every steps"},
          {"init-from", "initial weights (safetensors with the model's parameter names)"},
          {"save", "write the final weights here (safetensors)"},
          {"log", "write one JSON object per step here (JSONL)"},
          {"checkpoint", "write a resumable checkpoint here (every checkpoint_every steps and at the end)"},
          {"resume", "resume from this checkpoint (weights, optimizer, step, RNG)"},
          {"stop-after", "stop after this many steps in total (the checkpoint lets a later run resume)"},
          {"device", "cpu (default), reference, or cuda"},
          {"seed", "seed for initialisation and sampling (default 0)"},
          {"dtype", "parameter dtype: f32 (default) or f64"},
          {"progress", "progress bar: auto (default), on, off"},
          {"profile", "record every op (docs/profiling.md): write the Chrome trace here, print the table at the end"},
          {"quiet", "print nothing but errors", true}});
  a.parse(argc, argv, 2);
  TrainOptions o;
  o.model_path = a.str("model");
  o.train_path = a.str("train");
  o.data_path = a.required("data");
  o.eval_data_path = a.str("eval-data");
  o.init_from = a.str("init-from");
  o.save_path = a.str("save");
  o.log_path = a.str("log");
  o.checkpoint_path = a.str("checkpoint");
  o.resume_path = a.str("resume");
  o.stop_after = a.integer("stop-after", -1);
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
  const TrainResult r = train_gpt(o);
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

// Text <-> tokens for sampling: a checkpoint trained with `kiln tokenize --chars` carries its alphabet.
struct Codec {
  std::optional<CharTokenizer> chars;
  std::vector<int64_t> encode(const std::string& s) const { return chars ? chars->encode(s) : ByteTokenizer::encode(s); }
  std::string decode(const std::vector<int64_t>& ids) const { return chars ? chars->decode(ids) : ByteTokenizer::decode(ids); }
};

Codec codec_for(const std::string& data_path) {
  Codec c;
  if (data_path.empty()) return c;
  try {
    const auto f = safetensors::File::open(data_path);
    const auto& m = f.metadata();
    if (const auto hx = m.find("alphabet_hex"); hx != m.end()) c.chars = CharTokenizer(from_hex(hx->second));
    else if (const auto it = m.find("alphabet"); it != m.end()) c.chars = CharTokenizer(it->second);
  } catch (const Error&) {
    // the data file may have moved: fall back to bytes
  }
  return c;
}

int cmd_sample(int argc, char** argv) {
  Args a("sample", "kiln sample --checkpoint ckpt.safetensors [--prompt TEXT] [flags]",
         {{"checkpoint", "checkpoint or weights file (required)"},
          {"model", "model config JSON (needed for a plain weights file)"},
          {"data", "token file the model was trained on (for its alphabet; default: the checkpoint's)"},
          {"prompt", "text to continue (default: a newline)"},
          {"tokens", "number of tokens to generate (default 200)"},
          {"temperature", "sampling temperature, 0 = greedy (default 0.8)"},
          {"top-k", "sample among the k most likely tokens, 0 = all (default 40)"},
          {"seed", "sampling seed (default 0)"},
          {"device", "cpu (default), reference, or cuda"}});
  a.parse(argc, argv, 2);
  const std::string ck = a.required("checkpoint");
  const std::string prompt = a.str("prompt", "\n");
  nn::SampleOptions so{.max_new_tokens = a.integer("tokens", 200), .temperature = a.number("temperature", 0.8),
                       .top_k = a.integer("top-k", 40), .seed = static_cast<uint64_t>(a.integer("seed", 0))};
  KILN_CHECK(so.max_new_tokens >= 0 && so.top_k >= 0, "kiln sample: --tokens and --top-k must be >= 0");
  const CheckpointInfo info = read_checkpoint_info(ck);
  const Codec codec = codec_for(a.str("data", info.data_path));
  so.vocab_limit = codec.chars ? codec.chars->vocab_size() : ByteTokenizer::vocab_size;  // only ids the codec can decode
  const std::vector<int64_t> out = dispatch(a.str("device", "cpu"), [&]<Backend B>() {
    auto model = load_gpt<B>(ck, a.str("model"));
    return model->generate(codec.encode(prompt), so);
  });
  fmt::print("{}{}\n", prompt, codec.decode(out));
  return 0;
}

int cmd_eval(int argc, char** argv) {
  Args a("eval", "kiln eval --checkpoint ckpt.safetensors --data tokens.safetensors [flags]",
         {{"checkpoint", "checkpoint or weights file (required)"},
          {"model", "model config JSON (needed for a plain weights file)"},
          {"data", "token file (required)"},
          {"batches", "number of batches (default 16)"},
          {"batch-size", "rows per batch (default 8)"},
          {"seq-len", "tokens per row (default 64)"},
          {"device", "cpu (default), reference, or cuda"}});
  a.parse(argc, argv, 2);
  const TokenData data = TokenData::load(a.required("data"));
  const double loss = dispatch(a.str("device", "cpu"), [&]<Backend B>() {
    auto model = load_gpt<B>(a.required("checkpoint"), a.str("model"));
    data.check_vocab(model->config().vocab_size);
    model->eval();
    return evaluate<B>(*model, data, a.integer("batches", 16), a.integer("batch-size", 8), a.integer("seq-len", 64));
  });
  fmt::print("{}\n", nlohmann::json{{"loss", loss}, {"perplexity", std::exp(loss)}}.dump());
  return 0;
}

int cmd_tokenize(int argc, char** argv) {
  Args a("tokenize", "kiln tokenize --text corpus.txt --out tokens.safetensors [--chars] [--eval-out eval.safetensors]",
         {{"text", "input text file (required)"},
          {"out", "output token file (required)"},
          {"chars", "character-level vocabulary (the corpus's distinct bytes) instead of bytes (256)", true},
          {"eval-out", "also write the last --eval-fraction of the tokens here, and leave them out of --out"},
          {"eval-fraction", "held-out fraction for --eval-out (default 0.05)"},
          {"max-bytes", "read at most this many bytes of the text (default: all)"}});
  a.parse(argc, argv, 2);
  std::string text = read_text_file(a.required("text"));
  const int64_t maxb = a.integer("max-bytes", -1);
  if (maxb >= 0 && static_cast<size_t>(maxb) < text.size()) text.resize(static_cast<size_t>(maxb));
  std::vector<int64_t> ids;
  std::map<std::string, std::string> meta{{"tokenizer", a.has("chars") ? "chars" : "bytes"}};
  int64_t vocab = 256;
  if (a.has("chars")) {
    const CharTokenizer t = CharTokenizer::fit(text);
    ids = t.encode(text);
    // The alphabet is a set of bytes: as text when it is ASCII, else as hex (the bytes of a multi-byte
    // UTF-8 character, sorted apart, are no valid string for the JSON header).
    const std::string& al = t.alphabet();
    if (std::all_of(al.begin(), al.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x80; })) meta["alphabet"] = al;
    else meta["alphabet_hex"] = to_hex(al);
    vocab = t.vocab_size();
  } else {
    ids = ByteTokenizer::encode(text);
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
    if (cmd == "eval") return cmd_eval(argc, argv);
    if (cmd == "tokenize") return cmd_tokenize(argc, argv);
    if (cmd == "inspect") return cmd_inspect(argc, argv);
    if (cmd == "plot") return cmd_plot(argc, argv);
    fmt::print(stderr, "kiln: unknown command '{}' (valid: train, sample, eval, tokenize, inspect, plot)\n", cmd);
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
