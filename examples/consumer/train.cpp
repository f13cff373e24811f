// A training script outside kiln's tree (examples/consumer): an MLP learns two interleaved spirals.
//   cmake -S . -B build -DCMAKE_PREFIX_PATH=/where/kiln/is/installed && cmake --build build && build/train
// or, with pkg-config:  g++ -std=c++20 -O2 train.cpp $(pkg-config --cflags --libs kiln) -o train
#include <kiln/kiln.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <numbers>
#include <vector>

using namespace kiln;

// Two spirals, n points each: inputs [2n, 2] f32, labels [2n] i64.
template <Backend B> TensorDataset<B> spirals(int64_t n) {
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t i = 0; i < n; ++i) {
      const double r = static_cast<double>(i) / static_cast<double>(n),
                   a = 3 * std::numbers::pi * r + std::numbers::pi * static_cast<double>(c);
      xs.push_back(static_cast<float>(r * std::cos(a)));
      xs.push_back(static_cast<float>(r * std::sin(a)));
      ys.push_back(c);
    }
  return {Tensor<B>::from_vector(xs, {2 * n, 2}), Tensor<B>::from_vector(ys)};
}

template <Backend B> class Classifier : public nn::Module<B> {
 public:
  explicit Classifier(int64_t hidden) {
    fc1_ = this->register_module("fc1", std::make_shared<nn::Linear<B>>(nn::LinearOptions{.in = 2, .out = hidden, .bias = true}));
    fc2_ = this->register_module("fc2", std::make_shared<nn::Linear<B>>(nn::LinearOptions{.in = hidden, .out = hidden, .bias = true}));
    out_ = this->register_module("out", std::make_shared<nn::Linear<B>>(nn::LinearOptions{.in = hidden, .out = 2, .bias = true}));
  }
  Var<B> forward(const Var<B>& x) const { return (*out_)((*fc2_)((*fc1_)(x).tanh()).tanh()); }

 private:
  std::shared_ptr<nn::Linear<B>> fc1_, fc2_, out_;
};

template <Backend B> double accuracy(const Classifier<B>& model, const TensorDataset<B>& data) {
  NoGrad ng;
  const Tensor<B> pred = model.forward(data.inputs()).value().argmax(1);
  return item<double>(pred.eq(data.targets()).to(DType::f32).mean());
}

template <Backend B> int run() {
  manual_seed(0);
  const TensorDataset<B> data = spirals<B>(200);
  Classifier<B> model(64);
  DataLoader train(data, {.batch_size = 40, .shuffle = true, .seed = 1});
  DataLoader eval(data, {.batch_size = 400, .shuffle = false});
  optim::Adam<B> opt(model.named_parameters(), {.lr = 2e-2, .weight_decay = 1e-4, .decoupled = true});  // AdamW
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("kiln-consumer-{}", B::name);
  std::filesystem::create_directories(dir);

  // One batch: its mean loss (and, when evaluating, the accuracy, logged as eval_accuracy).
  auto step = [&](const std::pair<Tensor<B>, Tensor<B>>& batch) {
    const auto& [x, y] = batch;
    const Var<B> logits = model.forward(x);
    StepOutput<B> out{.loss = nn::cross_entropy(logits, y)};
    if (!model.is_training()) out.metrics["accuracy"] = item<double>(logits.value().argmax(1).eq(y).to(DType::f32).mean());
    return out;
  };
  const FitResult r = fit(model, opt, train, eval, step,
                          {.epochs = 200,
                           .grad_clip = 1.0,
                           .eval_every = 500,
                           .checkpoint_path = (dir / "checkpoint.safetensors").string(),
                           .log_path = (dir / "log.jsonl").string(),
                           .progress = 0,
                           .schedule = {.name = "cosine", .warmup_steps = 20, .min_lr_ratio = 0.05}});
  const double acc = accuracy(model, data);

  // The checkpoint holds the weights under "model.": a fresh model loaded from it agrees.
  Classifier<B> again(64);
  std::map<std::string, Tensor<B>> weights;
  for (const auto& [name, t] : safetensors::load<B>((dir / "checkpoint.safetensors").string()))
    if (name.starts_with("model.")) weights.emplace(name.substr(6), t);
  again.load_state_dict(weights);
  const double acc2 = accuracy(again, data);
  std::filesystem::remove_all(dir);

  fmt::print("kiln {} ({}), backend {}: training accuracy {:.3f} after {} steps (final loss {:.4f}), reloaded {:.3f}\n", kiln::version(),
             KILN_VERSION_STRING, B::name, acc, r.steps_done, r.losses.back(), acc2);
  return acc >= 0.95 && acc2 == acc ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    if (std::strcmp(kiln::version(), KILN_VERSION_STRING) != 0) {
      std::fprintf(stderr, "header version %s, library %s\n", KILN_VERSION_STRING, kiln::version());
      return 1;
    }
    return dispatch(argc > 1 ? argv[1] : "cpu", []<Backend B>() { return run<B>(); });
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
