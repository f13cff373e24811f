// A full resume, as `kiln train --resume CK --model model.json --train train.json` does it
// (train_gpt, train/trainer.cpp and train/loop.cpp): the checkpoint's metadata (configs, step, RNG,
// grad_accum, optimizer kind, data fingerprint, loss scale), the model's weights and the optimizer's
// state loaded into a small GPT and its optimizer on the Reference backend, the JSONL log trimmed,
// then the remaining steps (at most two) trained. The input: byte 0 picks the run (even: AdamW, f32;
// odd: SGD with momentum, grad_accum 2, precision f16), the rest is the checkpoint file.
//
// Checked beyond "a kiln::Error or success": an accepted checkpoint at the last step leaves the model
// holding its weights (as f32), and after any accepted resume the log holds one record per step.
//
// Seeds: KILN_FUZZ_SEEDS=DIR fuzz_resume writes checkpoints of both runs after one and two steps
// into DIR and exits (docs/fuzzing.md; fuzz/make_corpus.py runs it when given the binary).
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <kiln/formats/safetensors.hpp>
#include <kiln/train/checkpoint.hpp>
#include <kiln/train/plot.hpp>
#include <kiln/train/trainer.hpp>

#include "fuzz.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kSteps = 2;
// The log before the resume: the two steps' records and a torn line (a run killed while writing).
constexpr const char* kLog = "{\"step\":0,\"loss\":2.7,\"lr\":0.01}\n{\"step\":1,\"loss\":2.6,\"lr\":0.005}\n{\"step\":2,\"lo";

struct Setup {
  fs::path dir;
  std::string model, train[2], data;
  Setup() {
    std::string t = fmt::format("{}/kiln-fuzz-{}-resume-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", getpid());
    if (!mkdtemp(t.data())) std::abort();
    dir = t;
    model = put("model.json", R"({"vocab_size": 16, "d_model": 8, "n_layers": 1, "n_heads": 2, "ffn_hidden": 16, "max_seq_len": 8})");
    train[0] = put("adamw.json", R"({"batch_size": 2, "seq_len": 4, "steps": 2, "optimizer": {"name": "adamw", "lr": 0.01}})");
    train[1] = put("sgd_f16.json", R"({"batch_size": 2, "seq_len": 4, "steps": 2, "grad_accum": 2, "precision": "f16",
                                      "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}})");
    std::vector<int32_t> tokens(64);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + i / 5) % 16);
    data = (dir / "tokens.safetensors").string();
    safetensors::save<Reference>(data, {{"tokens", Tensor<Reference>::from_vector(tokens)}}, {});
  }
  ~Setup() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string put(const char* name, const std::string& text) const {
    const std::string p = (dir / name).string();
    std::ofstream(p) << text;
    return p;
  }
  TrainOptions options(int run) const {
    TrainOptions o;
    o.model_path = model;
    o.train_path = train[run];
    o.data_path = data;
    o.device = "reference";
    o.quiet = true;
    o.progress = 0;
    return o;
  }
};

Setup& setup() {
  static Setup s;
  return s;
}

// Bit patterns, every NaN alike.
std::vector<uint32_t> bits(const Tensor<Reference>& t) {
  const std::vector<float> v = t.to(DType::f32).to_vector<float>();
  std::vector<uint32_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const float x = std::isnan(v[i]) ? NAN : v[i];
    std::memcpy(&b[i], &x, 4);
  }
  return b;
}

// KILN_FUZZ_SEEDS=DIR: checkpoints of both runs after 1 and 2 steps, as seeds.
void write_seeds(const std::string& out_dir) {
  fs::create_directories(out_dir);
  const std::string out = fs::absolute(out_dir).string();
  // From inside the scratch folder, so that the data path the checkpoints record is the same every time.
  fs::current_path(setup().dir);
  for (int run = 0; run < 2; ++run) {
    for (int64_t stop : {int64_t{1}, kSteps}) {
      TrainOptions o = setup().options(run);
      o.data_path = "tokens.safetensors";
      o.checkpoint_path = "ck.safetensors";
      o.stop_after = stop;
      train_gpt<Reference>(o);
      std::ifstream in(o.checkpoint_path, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string name = fmt::format("{}/{}_step{}", out, run == 0 ? "adamw" : "sgd_f16", stop);
      std::ofstream(name, std::ios::binary) << static_cast<char>(run) << ss.str();
      fmt::print("wrote {}\n", name);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* out = std::getenv("KILN_FUZZ_SEEDS")) {
    write_seeds(out);
    std::exit(0);
  }
  (void)setup();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Setup& s = setup();
  const std::string ck = fuzz::file(data + 1, size - 1, "resume");
  TrainOptions o = s.options(data[0] & 1);
  o.resume_path = ck;
  o.save_path = (s.dir / "weights.safetensors").string();
  o.log_path = s.put("log.jsonl", kLog);
  try {
    train_gpt<Reference>(o);
  } catch (const Error&) {
    return 0;
  }
  const CheckpointInfo info = read_checkpoint_info(ck);
  const LogSeries log = read_log(o.log_path);
  KILN_FUZZ_ASSERT((log.step == std::vector<int64_t>{0, 1}), "resumed at step {}: the log has steps [{}]", info.step,
                   fmt::join(log.step, ", "));
  if (info.step != kSteps) return 0;
  // Nothing left to train: the saved weights are the checkpoint's.
  const auto in = safetensors::File::open(ck), out = safetensors::File::open(o.save_path);
  for (const std::string& n : out.names())
    KILN_FUZZ_ASSERT(bits(out.load<Reference>(n)) == bits(in.load<Reference>("model." + n)), "weight '{}' differs from the checkpoint's",
                     n);
  return 0;
}
