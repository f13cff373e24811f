// Fashion-MNIST with a small CNN on kiln::fit: two conv-batchnorm-relu-maxpool blocks and an MLP head,
// AdamW with a cosine schedule, test accuracy after each epoch. The network is the PyTorch one of
// bench/conv/cnn_epoch_torch.py, with the same parameter names (features.0.weight, features.1.running_mean,
// classifier.1.weight, ...), so `--save` writes a safetensors file that torch's load_state_dict reads.
//
//   example_fashion_mnist_cnn [data_dir] [epochs] [min_accuracy] [max_steps_per_epoch] [save.safetensors]
//     data_dir             default /usr/share/datasets/fashion-mnist (Debian package dataset-fashion-mnist)
//     epochs               default 5
//     min_accuracy         exit with status 1 when the final test accuracy is below it (default 0: never)
//     max_steps_per_epoch  > 0: stop each epoch after that many batches (a quick run); default 0: whole epochs
//     save.safetensors     where to write the trained weights and batch-norm statistics (default: nowhere)
// Exit status 2: the dataset is missing (apt-get install dataset-fashion-mnist, or scripts/setup.sh --data).
// Each epoch prints a JSON line (seconds, images/s, test accuracy) that bench/conv/run.sh compares with PyTorch.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <kiln/backends/backends.hpp>
#include <kiln/formats/idx.hpp>
#include <kiln/nn/batch_norm.hpp>
#include <kiln/nn/container.hpp>
#include <kiln/nn/conv.hpp>
#include <kiln/nn/layers.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/nn/pool.hpp>
#include <kiln/optim/optimizer.hpp>
#include <kiln/train/dataloader.hpp>
#include <kiln/train/loop.hpp>

using namespace kiln;

// x [N, 1, 28, 28] -> logits [N, 10]
template <Backend B> class CNN : public nn::Module<B> {
 public:
  CNN() {
    using namespace nn;
    features_ = this->register_module("features", std::make_shared<Sequential<B>>());
    for (const auto& [in, out] : {std::pair<int64_t, int64_t>{1, 32}, {32, 64}}) {  // [N, in, H, W] -> [N, out, H/2, W/2]
      features_->push_back(
          std::make_shared<Conv2d<B>>(Conv2dOptions{.in_channels = in, .out_channels = out, .kernel_size = 3, .padding = 1}));
      features_->push_back(std::make_shared<BatchNorm2d<B>>(BatchNormOptions{.num_features = out}));
      features_->push_back(std::make_shared<ReLU<B>>());
      features_->push_back(std::make_shared<MaxPool2d<B>>(MaxPool2dOptions{.kernel_size = 2}));
    }
    classifier_ = this->register_module("classifier", std::make_shared<Sequential<B>>());
    classifier_->push_back(std::make_shared<Flatten<B>>());
    classifier_->push_back(std::make_shared<Linear<B>>(LinearOptions{.in = 64 * 7 * 7, .out = 128, .bias = true}));
    classifier_->push_back(std::make_shared<ReLU<B>>());
    classifier_->push_back(std::make_shared<Dropout<B>>(0.25));
    classifier_->push_back(std::make_shared<Linear<B>>(LinearOptions{.in = 128, .out = 10, .bias = true}));
  }
  Var<B> forward(const Var<B>& x) const { return classifier_->forward(features_->forward(x)); }

 private:
  std::shared_ptr<nn::Sequential<B>> features_, classifier_;
};

template <Backend B> int train(const std::string& dir, int64_t epochs, double min_accuracy, int64_t max_steps, const std::string& save) {
  const IdxImageOptions norm{.mean = 0.2860, .std = 0.3530};  // the training split's pixel mean and std
  // Images [N, 28, 28] (not flattened) with a channel axis: [N, 1, 28, 28].
  const auto [train_x, train_y] = IdxDataset::load_split(dir, "train", norm).tensors<B>(/*flatten=*/false);
  const auto [test_x, test_y] = IdxDataset::load_split(dir, "t10k", norm).tensors<B>(/*flatten=*/false);
  const TensorDataset<B> train_set(train_x.unsqueeze(1), train_y), test_set(test_x.unsqueeze(1), test_y);
  fmt::print("Fashion-MNIST: {} training and {} test images from {}\n", train_set.size(), test_set.size(), dir);

  manual_seed(0);
  CNN<B> model;
  const int64_t batch_size = 128;
  DataLoader loader(train_set, {.batch_size = batch_size, .shuffle = true, .drop_last = false, .seed = 0});
  DataLoader test(test_set, {.batch_size = 1000, .shuffle = false});
  // An "epoch" of the report: the whole training split, or max_steps batches of it (a quick run).
  const int64_t per_epoch = max_steps > 0 ? std::min(max_steps, loader.batches_per_epoch()) : loader.batches_per_epoch();
  const double peak_lr = 2e-3;
  optim::Adam<B> opt(model.named_parameters(), {.lr = peak_lr, .weight_decay = 1e-4, .decoupled = true});  // AdamW
  fmt::print("model: {} parameters; {} epochs of {} batches of {}\n", model.num_parameters(), epochs, per_epoch, batch_size);

  using clock = std::chrono::steady_clock;
  double eval_seconds = 0;  // inside the current report interval, left out of its training time
  auto step = [&](const std::pair<Tensor<B>, Tensor<B>>& batch) {
    const auto& [x, y] = batch;
    const auto t = clock::now();
    const Var<B> logits = model.forward(x);
    StepOutput<B> out{.loss = nn::cross_entropy(logits, y)};
    if (!model.is_training()) {
      out.metrics["accuracy"] = item<double>(logits.value().argmax(1).eq(y).to(DType::f64).mean());
      eval_seconds += std::chrono::duration<double>(clock::now() - t).count();
    }
    return out;
  };
  double acc = 0, loss_sum = 0;
  int64_t batches = 0, epoch = 0, images_seen = 0;
  auto t0 = clock::now();
  const Callback report{.on_step = [&](FitState& s) {
    loss_sum += s.loss;
    ++batches;
    images_seen += std::min(batch_size, train_set.size() - (s.step % loader.batches_per_epoch()) * batch_size);
    if (!s.evaluated) return;
    // evaluated every per_epoch steps: one line per epoch
    acc = s.metrics.at("eval_accuracy");
    const double secs = std::chrono::duration<double>(clock::now() - t0).count() - eval_seconds;
    s.print(fmt::format("epoch {}: mean train loss {:.4f}, test accuracy {:.2f}%, {:.1f} s training", ++epoch,
                        loss_sum / static_cast<double>(batches), 100 * acc, secs));
    s.print(fmt::format(R"({{"peer": "kiln", "epoch": {}, "seconds": {:.3f}, "images_per_s": {:.1f}, )"
                        R"("test_accuracy": {:.4f}, "threads": {}}})",
                        epoch, secs, static_cast<double>(images_seen) / secs, acc, num_threads()));
    loss_sum = 0;
    batches = images_seen = 0;
    eval_seconds = 0;
    t0 = clock::now();
  }};
  fit(model, opt, loader, test, step,
      {.steps = epochs * per_epoch,
       .eval_every = per_epoch,
       .callbacks = {report},
       .lr = peak_lr,
       .schedule = {.name = "cosine", .warmup_steps = 100, .min_lr_ratio = 0.05}});
  fmt::print("test accuracy after {} epochs: {:.2f}%\n", epochs, 100 * acc);
  if (!save.empty()) {
    model.save(save);
    fmt::print("saved {}\n", save);
  }
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
  const int64_t max_steps = argc > 4 ? std::atoll(argv[4]) : 0;
  const std::string save = argc > 5 ? argv[5] : "";
  if (epochs <= 0 || max_steps < 0) {
    std::fprintf(stderr, "usage: %s [data_dir] [epochs > 0] [min_accuracy] [max_steps_per_epoch >= 0] [save.safetensors]\n", argv[0]);
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
    return train<Cpu>(dir, epochs, min_accuracy, max_steps, save);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
