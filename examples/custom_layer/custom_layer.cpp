// A user-defined layer in one file (docs/adding_a_layer.md walks through it).
//
// GatedResidual: y = x + tanh(gate) ⊙ (relu(x W1ᵀ + b1) W2ᵀ), a residual MLP block whose
// per-feature gate starts at 0, so the block starts as the identity and learns how much to add.
// # Shapes
//   w1 [hidden, dim], b1 [hidden], w2 [dim, hidden], gate [dim];  x [..., dim] -> y [..., dim]
//
// The program checks the layer's gradients against finite differences, trains a small classifier
// built from it on a synthetic 3-arm spiral, prints loss and accuracy, then saves the state dict to
// safetensors, loads it into a freshly built model and checks that both give the same logits.
// Exit status 0 only if all of that holds (CTest runs it).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include <kiln/autograd/gradcheck.hpp>
#include <kiln/autograd/var.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/optimizer.hpp>

using namespace kiln;

// ---------------------------------------------------------------------------------------- the layer
struct GatedResidualOptions {
  int64_t dim = 0;
  int64_t hidden = 0;
  double gate_init = 0.0;  // tanh(0) = 0: the block starts as the identity
};

template <Backend B> class GatedResidual : public nn::Module<B> {
 public:
  explicit GatedResidual(GatedResidualOptions o) : o_(o) {
    KILN_CHECK(o.dim > 0 && o.hidden > 0, "GatedResidual: dim ({}) and hidden ({}) must be positive", o.dim, o.hidden);
    const double a1 = 1.0 / std::sqrt(static_cast<double>(o.dim)), a2 = 1.0 / std::sqrt(static_cast<double>(o.hidden));
    // Registration order is the order of named_parameters() and of the state dict.
    w1_ = this->register_parameter("w1", Tensor<B>::uniform({o.hidden, o.dim}, -a1, a1));
    b1_ = this->register_parameter("b1", Tensor<B>::zeros({o.hidden}));
    w2_ = this->register_parameter("w2", Tensor<B>::uniform({o.dim, o.hidden}, -a2, a2));
    gate_ = this->register_parameter("gate", Tensor<B>::full({o.dim}, o.gate_init));
  }

  Var<B> forward(const Var<B>& x) const {
    KILN_CHECK(x.dim() >= 1 && x.size(-1) == o_.dim, "GatedResidual: input {} does not end in dim {}", shape_str(x.shape()), o_.dim);
    return apply(x, w1_, b1_, w2_, gate_);
  }
  Var<B> operator()(const Var<B>& x) const { return forward(x); }

  // The formula on explicit tensors, so gradcheck can differentiate with respect to every parameter.
  static Var<B> apply(const Var<B>& x, const Var<B>& w1, const Var<B>& b1, const Var<B>& w2, const Var<B>& gate) {
    const Var<B> h = (x.matmul(w1.t()) + b1).relu();
    return x + gate.tanh() * h.matmul(w2.t());
  }

 private:
  GatedResidualOptions o_;
  Var<B> w1_, b1_, w2_, gate_;
};

// ---------------------------------------------------------------------------------------- a model using it
template <Backend B> class SpiralNet : public nn::Module<B> {
 public:
  SpiralNet(int64_t width, int64_t depth, int64_t classes) {
    embed_ = this->register_module("embed", std::make_shared<nn::Linear<B>>(nn::LinearOptions{.in = 2, .out = width, .bias = true}));
    for (int64_t i = 0; i < depth; ++i)
      blocks_.push_back(this->register_module(fmt::format("block{}", i),
                                              std::make_shared<GatedResidual<B>>(GatedResidualOptions{.dim = width, .hidden = 2 * width})));
    head_ = this->register_module("head", std::make_shared<nn::Linear<B>>(nn::LinearOptions{.in = width, .out = classes, .bias = true}));
  }
  Var<B> forward(const Var<B>& x) const {
    Var<B> h = (*embed_)(x);
    for (const auto& b : blocks_) h = (*b)(h);
    return (*head_)(h);
  }

 private:
  std::shared_ptr<nn::Linear<B>> embed_, head_;
  std::vector<std::shared_ptr<GatedResidual<B>>> blocks_;
};

// ---------------------------------------------------------------------------------------- data
// n points per arm of a 3-arm spiral with a little noise; label = arm.
template <Backend B> std::pair<Tensor<B>, Tensor<B>> spiral(int64_t n, uint64_t seed) {
  std::vector<float> xy;
  std::vector<int64_t> label;
  for (int64_t arm = 0; arm < 3; ++arm)
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t k = static_cast<uint64_t>(arm * n + i) * 2;
      const double r = static_cast<double>(i) / static_cast<double>(n);
      const double t = 4.0 * r + 2.0944 * static_cast<double>(arm) + 0.2 * (philox_uniform_at(seed, 0, k) - 0.5);
      xy.push_back(static_cast<float>(r * std::sin(t)));
      xy.push_back(static_cast<float>(r * std::cos(t)));
      label.push_back(arm);
    }
  return {Tensor<B>::from_vector(xy, {3 * n, 2}), Tensor<B>::from_vector(label, {3 * n})};
}

template <Backend B> double accuracy(const SpiralNet<B>& model, const Tensor<B>& x, const Tensor<B>& y) {
  NoGrad ng;
  return item<double>(model.forward(x).value().argmax(1).eq(y).to(DType::f32).mean());
}

template <Backend B> int run() {
  // 1. Gradients: analytic (backward) vs central differences in f64, for the input and every parameter.
  {
    const auto r =
        gradcheck<B>([](const std::vector<Var<B>>& v) { return GatedResidual<B>::apply(v[0], v[1], v[2], v[3], v[4]); },
                     {Tensor<B>::randn({4, 3}, DType::f64), Tensor<B>::randn({5, 3}, DType::f64), Tensor<B>::randn({5}, DType::f64),
                      Tensor<B>::randn({3, 5}, DType::f64), Tensor<B>::randn({3}, DType::f64)});
    fmt::print("gradcheck: {}\n", r.ok ? "ok" : r.message);
    if (!r.ok) return 1;
  }

  // 2. Train on the spiral.
  manual_seed(0);
  SpiralNet<B> model(32, 2, 3);
  fmt::print("parameters: {}\n", model.num_parameters());
  for (const auto& [name, p] : model.named_parameters()) fmt::print("  {:<14} {}\n", name, shape_str(p.shape()));
  const auto [x, y] = spiral<B>(200, 1);
  const auto [xt, yt] = spiral<B>(100, 2);
  optim::Adam<B> opt(model.named_parameters(), {.lr = 1e-2});
  double loss = 0;
  for (int step = 0; step < 400; ++step) {
    opt.zero_grad();
    const Var<B> l = nn::cross_entropy(model.forward(x), y);
    l.backward();
    opt.step();
    loss = l.template item<double>();
    if (step % 100 == 0) fmt::print("step {:3d}  loss {:.4f}\n", step, loss);
  }
  const double train_acc = accuracy(model, x, y), test_acc = accuracy(model, xt, yt);
  fmt::print("final loss {:.4f}  train accuracy {:.3f}  held-out accuracy {:.3f}\n", loss, train_acc, test_acc);

  // 3. Save the state dict, load it into a fresh model (different initial weights), compare.
  const std::string path = (std::filesystem::temp_directory_path() / fmt::format("kiln-custom-layer-{}.safetensors", ::getpid())).string();
  model.save(path, {{"example", "custom_layer"}});
  manual_seed(123);
  SpiralNet<B> restored(32, 2, 3);
  restored.load(path);  // strict: every name and shape must match
  std::filesystem::remove(path);
  NoGrad ng;
  const double diff = item<double>(model.forward(xt).value().sub(restored.forward(xt).value()).abs().max());
  fmt::print("reloaded from safetensors: max |logit difference| = {}\n", diff);
  const bool ok = test_acc > 0.9 && diff == 0.0;
  fmt::print("{}\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

int main() {
  try {
    return run<Cpu>();
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
