// The README's example, compiled and run by the test suite (tests/examples), so the README stays true:
// a two-layer MLP learns the XOR of two signs.
#include <kiln/autograd/var.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/optimizer.hpp>

using namespace kiln;

template <Backend B> double fit() {
  nn::Linear<B> l1({.in = 2, .out = 32, .bias = true}), l2({.in = 32, .out = 2, .bias = true});
  optim::NamedParams<B> params = l1.named_parameters();
  for (auto& [n, p] : l2.named_parameters()) params.emplace_back("l2." + n, p);
  optim::Adam<B> opt(params, {.lr = 1e-2});
  const Tensor<B> x = Tensor<B>::randn({256, 2});
  const Tensor<B> y = x.select(1, 0).mul(x.select(1, 1)).gt(0).to(DType::i64);  // XOR of signs
  for (int step = 0; step < 300; ++step) {
    opt.zero_grad();
    const Var<B> loss = nn::cross_entropy(l2(l1(x).relu()), y);
    loss.backward();
    opt.step();
  }
  NoGrad ng;
  const Tensor<B> pred = l2(l1(x).relu()).value().argmax(1);
  return item<double>(pred.eq(y).to(DType::f32).mean());
}

int main() {
  const double acc = fit<Cpu>();
  fmt::print("training accuracy {:.3f}\n", acc);
  return acc > 0.9 ? 0 : 1;
}
