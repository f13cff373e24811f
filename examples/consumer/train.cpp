// A training script outside kiln's tree (examples/consumer): an MLP learns two interleaved spirals.
//   cmake -S . -B build -DCMAKE_PREFIX_PATH=/where/kiln/is/installed && cmake --build build && build/train
// or, with pkg-config:  g++ -std=c++20 -O2 train.cpp $(pkg-config --cflags --libs kiln) -o train
#include <kiln/kiln.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numbers>
#include <vector>

using namespace kiln;

// Two spirals, n points each: inputs [2n, 2] f32, labels [2n] i64.
template <Backend B> TensorDataset<B> spirals(int64_t n) {
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t i = 0; i < n; ++i) {
      const double r = static_cast<double>(i) / static_cast<double>(n), a = 3 * std::numbers::pi * r + std::numbers::pi * static_cast<double>(c);
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
  DataLoader loader(data, {.batch_size = 40, .shuffle = true, .seed = 1});
  const int64_t epochs = 200, steps = epochs * loader.batches_per_epoch();
  const double peak = 2e-2;
  optim::Adam<B> opt(model.named_parameters(), {.lr = peak, .weight_decay = 1e-4, .decoupled = true});
  const LrSchedule schedule{.name = "cosine", .warmup_steps = 20, .min_lr_ratio = 0.05};
  int64_t step = 0;
  for (int64_t e = 0; e < epochs; ++e)
    for (auto [x, y] : loader) {
      opt.set_lr(schedule.at(peak, step++, steps));
      opt.zero_grad();
      nn::cross_entropy(model.forward(x), y).backward();
      opt.step();
    }
  const double acc = accuracy(model, data);

  // The weights round-trip through safetensors: a fresh model loaded from the file agrees.
  const std::string path = (std::filesystem::temp_directory_path() / "kiln_consumer.safetensors").string();
  model.save(path);
  Classifier<B> again(64);
  again.load(path);
  std::filesystem::remove(path);
  const double acc2 = accuracy(again, data);

  fmt::print("kiln {} ({}), backend {}: training accuracy {:.3f} after {} steps, reloaded {:.3f}\n", kiln::version(),
             KILN_VERSION_STRING, B::name, acc, steps, acc2);
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
