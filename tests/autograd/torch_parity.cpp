// Hard-coded PyTorch 1.13 values (float64), generated with /usr/bin/python3; snippets beside the numbers.
#include "helpers.hpp"

using namespace kiln;
using namespace kiln::test;

TEMPLATE_TEST_CASE("torch parity: cross-entropy via log_softmax + gather", "[autograd][parity]", KILN_BACKEND_TYPES) {
  // import torch
  // x = torch.tensor([[0.5, -1.0, 2.0, 0.0], [1.5, 0.25, -0.5, 3.0]], dtype=torch.float64, requires_grad=True)
  // t = torch.tensor([2, 0])
  // loss = -torch.log_softmax(x, 1).gather(1, t[:, None]).mean(); loss.backward()
  // print(loss.item(), x.grad.flatten().tolist())
  using V = Var<TestType>;
  V x(f64<TestType>({0.5, -1.0, 2.0, 0.0, 1.5, 0.25, -0.5, 3.0}, {2, 4}), true);
  const auto t = i64<TestType>({2, 0}, {2, 1});
  const V loss = x.log_softmax(1).gather(1, t).mean().neg();
  CHECK(loss.template item<double>() == Approx(1.0589499577825572).epsilon(1e-12));
  loss.backward();
  check_values(x.grad(), {0.07922235475748987, 0.017676896704374435, -0.14495003855691285, 0.048050787095048605, -0.4153048986023608,
                          0.024265552820983825, 0.011462235536403133, 0.37957711024497387});
}

TEMPLATE_TEST_CASE("torch parity: linear + gelu + sigmoid + softmax(axis 0)", "[autograd][parity]", KILN_BACKEND_TYPES) {
  // x = torch.tensor([[0.1, -0.2, 0.3], [0.4, 0.5, -0.6]], dtype=torch.float64)
  // W = torch.tensor([[0.2, -0.1], [0.3, 0.4], [-0.5, 0.6]], dtype=torch.float64, requires_grad=True)
  // b = torch.tensor([0.05, -0.05], dtype=torch.float64, requires_grad=True)
  // y = torch.nn.functional.gelu(x @ W + b).sigmoid().softmax(0)
  // l = (y * torch.tensor([[1.0, 2.0], [3.0, -1.0]], dtype=torch.float64)).sum(); l.backward()
  // print(l.item(), W.grad.flatten().tolist(), b.grad.tolist())
  using V = Var<TestType>;
  const auto x = f64<TestType>({0.1, -0.2, 0.3, 0.4, 0.5, -0.6}, {2, 3});
  V W(f64<TestType>({0.2, -0.1, 0.3, 0.4, -0.5, 0.6}, {3, 2}), true);
  V b(f64<TestType>({0.05, -0.05}, {2}), true);
  const V y = (V(x).matmul(W) + b).gelu().sigmoid().softmax(0);
  const V l = (y * f64<TestType>({1.0, 2.0, 3.0, -1.0}, {2, 2})).sum();
  CHECK(l.template item<double>() == Approx(2.5817549468140384).epsilon(1e-12));
  l.backward();
  check_values(W.grad(), {0.03880411809499216, -0.012814648833556862, 0.06423878510582964, -0.04842001876641329, -0.07999121366307363,
                          0.06408587625344374});
  check_values(b.grad(), {0.06070190103650471, 0.04273654958795527});
}
