// Optimizers and losses against PyTorch itself (torch 1.13, Debian's python3): the same parameters and
// gradient sequence through torch.optim and kiln::optim, compared after every step; cross-entropy with
// ignore_index and label smoothing against F.cross_entropy.
#include <catch2/catch.hpp>

#include <fstream>

#include <kiln/backends/backends.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/optimizer.hpp>
#include "ref.hpp"

using namespace kiln;
using json = nlohmann::json;

namespace {

void run_python(const std::string& code, const std::filesystem::path& dir) {
  const auto script = dir / "case.py";
  std::ofstream(script) << code;
  INFO(code);
  REQUIRE(std::system(fmt::format("OMP_NUM_THREADS=1 {} {} >/dev/null", kiln::test::python(), script.string()).c_str()) == 0);
}

// Writes params p0 [4,3] and q0 [5], and 6 steps of gradients, runs torch's optimizer `opt` (a Python
// expression over `groups`) and returns the parameters after every step.
std::map<std::string, Tensor<Cpu>> torch_trajectory(const std::string& opt, const std::filesystem::path& dir) {
  const std::string code = fmt::format(R"(
import sys, torch
sys.path.insert(0, "{}")
from kiln_ref import save_safetensors
torch.manual_seed(0)
p = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
q = torch.randn(5, dtype=torch.float64, requires_grad=True)
out = {{"p0": p.detach().clone(), "q0": q.detach().clone()}}
groups = [{{"params": [p], "weight_decay": 0.1}}, {{"params": [q], "weight_decay": 0.0}}]
opt = {}
for s in range(6):
    gp, gq = torch.randn(4, 3, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    out[f"gp{{s}}"], out[f"gq{{s}}"] = gp, gq
    p.grad, q.grad = gp.clone(), gq.clone()
    opt.step()
    out[f"p{{s+1}}"], out[f"q{{s+1}}"] = p.detach().clone(), q.detach().clone()
save_safetensors("{}", out)
)",
                                       KILN_REFERENCE_DIR, opt, (dir / "traj.safetensors").string());
  run_python(code, dir);
  return safetensors::load<Cpu>((dir / "traj.safetensors").string());
}

template <class Opt, class Options> void check_trajectory(const std::string& torch_opt, Options o) {
  test::require_torch();
  const auto dir = test::temp_dir("optim");
  const auto t = torch_trajectory(torch_opt, dir);
  Var<Cpu> p(t.at("p0").clone(), true), q(t.at("q0").clone(), true);
  std::vector<optim::ParamGroup<Cpu>> groups{{.params = {{"p", p}}, .lr = o.lr, .weight_decay = 0.1},
                                             {.params = {{"q", q}}, .lr = o.lr, .weight_decay = 0.0}};
  Opt opt(groups, o);
  for (int s = 0; s < 6; ++s) {
    p.set_grad(t.at(fmt::format("gp{}", s)).clone());
    q.set_grad(t.at(fmt::format("gq{}", s)).clone());
    opt.step();
    INFO("step " << s);
    const auto a = to_vector<double>(p.value()), b = to_vector<double>(t.at(fmt::format("p{}", s + 1)));
    const auto c = to_vector<double>(q.value()), d = to_vector<double>(t.at(fmt::format("q{}", s + 1)));
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).epsilon(1e-12).margin(1e-14));
    for (size_t i = 0; i < c.size(); ++i) CHECK(c[i] == Approx(d[i]).epsilon(1e-12).margin(1e-14));
  }
}

}  // namespace

TEST_CASE("optim: AdamW, Adam and SGD follow torch.optim step for step (float64, two groups)", "[parity][optim]") {
  SECTION("AdamW") {
    check_trajectory<optim::Adam<Cpu>>("torch.optim.AdamW(groups, lr=0.01, betas=(0.8, 0.99), eps=1e-6)",
                                       optim::AdamOptions{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .decoupled = true});
  }
  SECTION("Adam (L2 decay in the gradient)") {
    check_trajectory<optim::Adam<Cpu>>("torch.optim.Adam(groups, lr=0.02)", optim::AdamOptions{.lr = 0.02, .decoupled = false});
  }
  SECTION("SGD with momentum and dampening") {
    check_trajectory<optim::SGD<Cpu>>("torch.optim.SGD(groups, lr=0.1, momentum=0.9, dampening=0.3)",
                                      optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.3});
  }
  SECTION("SGD Nesterov") {
    check_trajectory<optim::SGD<Cpu>>("torch.optim.SGD(groups, lr=0.05, momentum=0.5, nesterov=True)",
                                      optim::SGDOptions{.lr = 0.05, .momentum = 0.5, .nesterov = true});
  }
}

TEST_CASE("optim: clip_grad_norm equals torch.nn.utils.clip_grad_norm_", "[parity][optim]") {
  test::require_torch();
  const auto dir = test::temp_dir("clip");
  run_python(fmt::format(R"(
import sys, torch
sys.path.insert(0, "{0}")
from kiln_ref import save_safetensors
torch.manual_seed(1)
ps = [torch.randn(3, 4, dtype=torch.float64, requires_grad=True), torch.randn(7, dtype=torch.float64, requires_grad=True)]
for p in ps: p.grad = torch.randn_like(p) * 3
out = {{"g0": ps[0].grad.clone(), "g1": ps[1].grad.clone()}}
n = torch.nn.utils.clip_grad_norm_(ps, 1.5)
out.update({{"c0": ps[0].grad, "c1": ps[1].grad, "norm": n.reshape(1)}})
save_safetensors("{1}", out)
)",
                         KILN_REFERENCE_DIR, (dir / "clip.safetensors").string()),
             dir);
  const auto t = safetensors::load<Cpu>((dir / "clip.safetensors").string());
  std::vector<Var<Cpu>> ps{Var<Cpu>(Tensor<Cpu>::zeros({3, 4}, DType::f64), true), Var<Cpu>(Tensor<Cpu>::zeros({7}, DType::f64), true)};
  ps[0].set_grad(t.at("g0").clone());
  ps[1].set_grad(t.at("g1").clone());
  CHECK(optim::clip_grad_norm(ps, 1.5) == Approx(item<double>(t.at("norm"))).epsilon(1e-12));
  for (int i = 0; i < 2; ++i) {
    const auto a = to_vector<double>(ps[static_cast<size_t>(i)].grad()), b = to_vector<double>(t.at(fmt::format("c{}", i)));
    for (size_t k = 0; k < a.size(); ++k) CHECK(a[k] == Approx(b[k]).epsilon(1e-12));
  }
}

TEST_CASE("loss: cross_entropy with ignore_index and label smoothing equals F.cross_entropy (value and gradient)", "[parity][loss]") {
  test::require_torch();
  const auto dir = test::temp_dir("ce");
  run_python(fmt::format(R"(
import sys, torch
import torch.nn.functional as F
sys.path.insert(0, "{0}")
from kiln_ref import save_safetensors
torch.manual_seed(2)
x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
t = torch.tensor([0, 4, -100, 2, 2, -100])
out = {{"x": x.detach().clone(), "t": t}}
for i, eps in enumerate([0.0, 0.1, 0.35]):
    l = F.cross_entropy(x, t, ignore_index=-100, label_smoothing=eps)
    g, = torch.autograd.grad(l, x)
    out[f"l{{i}}"], out[f"g{{i}}"] = l.detach().reshape(1), g
save_safetensors("{1}", out)
)",
                         KILN_REFERENCE_DIR, (dir / "ce.safetensors").string()),
             dir);
  const auto t = safetensors::load<Cpu>((dir / "ce.safetensors").string());
  const double eps[] = {0.0, 0.1, 0.35};
  for (int i = 0; i < 3; ++i) {
    INFO("label_smoothing " << eps[i]);
    Var<Cpu> x(t.at("x").clone(), true);
    const Var<Cpu> l = nn::cross_entropy(x, t.at("t"), {.ignore_index = -100, .label_smoothing = eps[i]});
    l.backward();
    CHECK(item<double>(l.value()) == Approx(item<double>(t.at(fmt::format("l{}", i)))).epsilon(1e-12));
    const auto a = to_vector<double>(x.grad()), b = to_vector<double>(t.at(fmt::format("g{}", i)));
    for (size_t k = 0; k < a.size(); ++k) CHECK(a[k] == Approx(b[k]).epsilon(1e-10).margin(1e-14));
  }
  CHECK_THROWS_WITH(nn::cross_entropy(Var<Cpu>(t.at("x")), Tensor<Cpu>::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5})),
                    Catch::Contains("cross_entropy") && Catch::Contains("[0, 5)"));
}
