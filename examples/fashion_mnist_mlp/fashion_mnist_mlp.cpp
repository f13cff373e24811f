// Fashion-MNIST with a 784-256-256-10 MLP on kiln::fit: the IDX reader, the DataLoader, AdamW with a
// cosine schedule, cross-entropy, a progress bar, test accuracy after each epoch.
//
//   example_fashion_mnist_mlp [data_dir] [epochs] [min_accuracy]
//     data_dir      default /usr/share/datasets/fashion-mnist (Debian package dataset-fashion-mnist)
//     epochs        default 5
//     min_accuracy  exit with status 1 when the final test accuracy is below it (default 0: never)
// Exit status 2: the dataset is missing (apt-get install dataset-fashion-mnist, or scripts/setup.sh --data).
// scripts/fashion_mnist.sh installs the package, builds and runs this.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <kiln/autograd/var.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/formats/idx.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/optimizer.hpp>
#include <kiln/optim/schedule.hpp>
#include <kiln/train/dataloader.hpp>
#include <kiln/train/loop.hpp>

using namespace kiln;

template <Backend B> class MLP : public nn::Module<B> {
 public:
  MLP(int64_t in, int64_t hidden, int64_t classes) {
    fc1_ = this->register_module("fc1", std::make_shared<nn::Linear<B>>(nn::LinearOptions{.in = in, .out = hidden, .bias = true}));
    fc2_ = this->register_module("fc2", std::make_shared<nn::Linear<B>>(nn::LinearOptions{.in = hidden, .out = hidden, .bias = true}));
    fc3_ = this->register_module("fc3", std::make_shared<nn::Linear<B>>(nn::LinearOptions{.in = hidden, .out = classes, .bias = true}));
  }
  Var<B> forward(const Var<B>& x) const { return (*fc3_)((*fc2_)((*fc1_)(x).relu()).relu()); }

 private:
  std::shared_ptr<nn::Linear<B>> fc1_, fc2_, fc3_;
};

template <Backend B> int train(const std::string& dir, int64_t epochs, double min_accuracy) {
  // Fashion-MNIST's pixel mean and standard deviation (of the training split).
  const IdxImageOptions norm{.mean = 0.2860, .std = 0.3530};
  const auto [train_x, train_y] = IdxDataset::load_split(dir, "train", norm).tensors<B>();  // [N, 784], [N]
  const auto [test_x, test_y] = IdxDataset::load_split(dir, "t10k", norm).tensors<B>();
  const TensorDataset<B> train_set(train_x, train_y), test_set(test_x, test_y);
  fmt::print("Fashion-MNIST: {} training and {} test images from {}\n", train_set.size(), test_set.size(), dir);

  manual_seed(0);
  MLP<B> model(784, 256, 10);
  const int64_t batch_size = 128;
  DataLoader loader(train_set, {.batch_size = batch_size, .shuffle = true, .drop_last = false, .seed = 0});
  DataLoader test(test_set, {.batch_size = 1000, .shuffle = false});
  const double peak_lr = 2e-3;
  optim::Adam<B> opt(model.named_parameters(), {.lr = peak_lr, .weight_decay = 1e-4, .decoupled = true});  // AdamW
  fmt::print("model: {} parameters; {} epochs of {} batches of {}\n", model.num_parameters(), epochs, loader.batches_per_epoch(),
             batch_size);

  // One batch: the loss, and in evaluation (model.eval()) the accuracy, logged as eval_accuracy.
  auto step = [&](const std::pair<Tensor<B>, Tensor<B>>& batch) {
    const auto& [x, y] = batch;
    const Var<B> logits = model.forward(x);
    StepOutput<B> out{.loss = nn::cross_entropy(logits, y)};
    if (!model.is_training()) out.metrics["accuracy"] = item<double>(logits.value().argmax(1).eq(y).to(DType::f64).mean());
    return out;
  };
  // After each epoch (the test split is evaluated every batches_per_epoch steps): a summary line.
  double acc = 0, loss_sum = 0;
  int64_t batches = 0;
  auto t0 = std::chrono::steady_clock::now();
  const Callback report{
      .on_step =
          [&](FitState& s) {
            loss_sum += s.loss;
            ++batches;
          },
      .on_eval = nullptr,
      .on_epoch =
          [&](FitState& s) {
            acc = s.metrics.at("eval_accuracy");
            const auto t1 = std::chrono::steady_clock::now();
            s.print(fmt::format("epoch {}: mean train loss {:.4f}, test accuracy {:.2f}%, {:.1f} s", s.epoch + 1,
                                loss_sum / static_cast<double>(batches), 100 * acc, std::chrono::duration<double>(t1 - t0).count()));
            loss_sum = 0;
            batches = 0;
            t0 = t1;
          }};
  fit(model, opt, loader, test, step,
      {.epochs = epochs,
       .eval_every = loader.batches_per_epoch(),
       .callbacks = {report},
       .lr = peak_lr,
       .schedule = {.name = "cosine", .warmup_steps = 100, .min_lr_ratio = 0.05}});
  fmt::print("test accuracy after {} epochs: {:.2f}%\n", epochs, 100 * acc);
  if (acc < min_accuracy) {
    fmt::print("below the required {:.2f}%\n", 100 * min_accuracy);
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  const int64_t epochs = argc > 2 ? std::atoll(argv[2]) : 5;
  const double min_accuracy = argc > 3 ? std::atof(argv[3]) : 0.0;
  if (epochs <= 0) {
    std::fprintf(stderr, "epochs must be a positive integer, got '%s'\n", argv[2]);
    return 1;
  }
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(dir) / "train-images-idx3-ubyte.gz") && !fs::exists(fs::path(dir) / "train-images-idx3-ubyte")) {
    std::fprintf(stderr,
                 "Fashion-MNIST not found in '%s'.\n"
                 "Install it with:  sudo apt-get install dataset-fashion-mnist   (or run scripts/fashion_mnist.sh)\n"
                 "or pass the directory holding train-images-idx3-ubyte[.gz] etc.:  %s DIR [EPOCHS]\n",
                 dir.c_str(), argv[0]);
    return 2;
  }
  try {
    return train<Cpu>(dir, epochs, min_accuracy);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
