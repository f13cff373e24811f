// Sequential and ModuleList: PyTorch names ("features.0.weight"), forward chaining, typed access and its
// errors, train/eval reaching nested modules, state dicts and safetensors round trips of nested names.
#include <catch2/catch.hpp>

#include <filesystem>

#include <unistd.h>

#include <kiln/backends/backends.hpp>
#include <kiln/nn/batch_norm.hpp>
#include <kiln/nn/container.hpp>
#include <kiln/nn/group_norm.hpp>
#include <kiln/nn/layers.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/norm.hpp>

using namespace kiln;
using namespace kiln::nn;

namespace {

// A PyTorch-style model: `features` (a Sequential) and `head` (a Linear).
template <Backend B> class Net : public Module<B> {
 public:
  Net() {
    features = this->register_module(
        "features", std::make_shared<Sequential<B>>(std::make_shared<Linear<B>>(LinearOptions{.in = 4, .out = 6, .bias = true}),
                                                    std::make_shared<BatchNorm1d<B>>(BatchNormOptions{.num_features = 6}),
                                                    std::make_shared<ReLU<B>>(), std::make_shared<Dropout<B>>(0.5)));
    head = this->register_module("head", std::make_shared<Linear<B>>(LinearOptions{.in = 6, .out = 2, .bias = false}));
  }
  Var<B> forward(const Var<B>& x) const { return head->forward(features->forward(x)); }
  std::shared_ptr<Sequential<B>> features;
  std::shared_ptr<Linear<B>> head;
};

// A module without a unary forward: Sequential must refuse it at compile time.
template <Backend B> class NoForward : public Module<B> {};

template <class M> std::vector<std::string> state_names(const M& m) {
  std::vector<std::string> out;
  for (auto& [n, t] : m.state_dict()) out.push_back(n);
  return out;
}

}  // namespace

static_assert(SequentialModule<Linear<Cpu>, Cpu>);
static_assert(SequentialModule<ReLU<Cpu>, Cpu>);
static_assert(SequentialModule<Dropout<Cpu>, Cpu>);
static_assert(SequentialModule<BatchNorm2d<Cpu>, Cpu>);
static_assert(SequentialModule<Sequential<Cpu>, Cpu>);
static_assert(!SequentialModule<NoForward<Cpu>, Cpu>);
static_assert(!SequentialModule<Linear<Reference>, Cpu>);  // another backend's module

TEMPLATE_TEST_CASE("Sequential: PyTorch names, nested as features.0.weight, forward chains the modules", "[container]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  manual_seed(1);
  Net<B> net;
  CHECK(state_names(net) == std::vector<std::string>{"features.0.weight", "features.0.bias", "features.1.weight", "features.1.bias",
                                                     "head.weight", "features.1.running_mean", "features.1.running_var",
                                                     "features.1.num_batches_tracked"});
  std::vector<std::string> mods;
  for (auto& [n, m] : net.named_modules()) mods.push_back(n);
  CHECK(mods == std::vector<std::string>{"", "features", "features.0", "features.1", "features.2", "features.3", "head"});
  CHECK(net.features->size() == 4);
  CHECK(net.features->name(-1) == "3");

  // forward equals the modules called one after another (eval: Dropout is the identity).
  net.eval();
  Generator gen(2);
  const Var<B> x(Tensor<B>::randn({5, 4}, DType::f32, &gen));
  const auto& f = *net.features;
  Var<B> want = f.template at<Linear<B>>(0)->forward(x);
  want = f.template at<BatchNorm1d<B>>(1)->forward(want).relu();
  CHECK(to_vector<float>(f.forward(x).value()) == to_vector<float>(want.value()));
  CHECK(to_vector<float>(f(x).value()) == to_vector<float>(want.value()));

  // Iteration visits the modules in order; operator[] and a negative index.
  int i = 0;
  for (const auto& m : f) CHECK(m.get() == f[i++].get());
  CHECK(i == 4);
  CHECK(f[-4].get() == f[0].get());
  CHECK(dynamic_cast<Dropout<B>*>(f[3].get()) != nullptr);

  // An empty Sequential passes its input through.
  Sequential<B> empty;
  CHECK(empty.empty());
  CHECK(to_vector<float>(empty.forward(x).value()) == to_vector<float>(x.value()));
}

TEMPLATE_TEST_CASE("Sequential: named push_back, nesting, typed access and index errors", "[container][errors]", KILN_BACKEND_TYPES) {
  using B = TestType;
  Sequential<B> s;
  auto lin = s.push_back(std::make_shared<Linear<B>>(LinearOptions{.in = 3, .out = 3, .bias = false}));
  s.push_back("act", std::make_shared<GELU<B>>(true));
  auto inner = s.push_back(std::make_shared<Sequential<B>>());
  inner->push_back(std::make_shared<LayerNorm<B>>(LayerNormOptions{.dim = 3}));
  inner->push_back(std::make_shared<SiLU<B>>());
  std::vector<std::string> names;
  for (auto& [n, p] : s.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"0.weight", "2.0.weight", "2.0.bias"});
  CHECK(s.name(1) == "act");
  CHECK(s.template at<Linear<B>>(0) == lin);
  CHECK(s.template at<Act<B>>(1) != nullptr);  // GELU is an Act

  CHECK_THROWS_WITH(s.template at<Linear<B>>(1),
                    Catch::Contains("Sequential::at: module 1 ('act') is a kiln::nn::GELU") && Catch::Contains("not a kiln::nn::Linear"));
  CHECK_THROWS_WITH(s[3], Catch::Contains("Sequential: index 3 is out of range for 3 modules"));
  CHECK_THROWS_WITH(s[-4], Catch::Contains("index -4 is out of range"));
  CHECK_THROWS_WITH(s.push_back("act", std::make_shared<ReLU<B>>()), Catch::Contains("'act' is already registered"));
  CHECK_THROWS_WITH(s.push_back("a.b", std::make_shared<ReLU<B>>()), Catch::Contains("invalid name 'a.b'"));
  CHECK_THROWS_WITH(s.push_back(std::shared_ptr<ReLU<B>>()), Catch::Contains("is null"));
  CHECK(s.size() == 3);  // the refused pushes left nothing behind

  // The chain: x -> linear -> gelu(tanh) -> layer norm -> silu.
  Generator gen(4);
  const Var<B> x(Tensor<B>::randn({2, 3}, DType::f32, &gen));
  const Var<B> y = s.forward(x);
  const Var<B> want = inner->template at<LayerNorm<B>>(0)->forward(lin->forward(x).gelu(true)).silu();
  CHECK(to_vector<float>(y.value()) == to_vector<float>(want.value()));
}

TEMPLATE_TEST_CASE("containers: train and eval reach nested modules, state dicts round-trip nested names through safetensors",
                   "[container]", KILN_BACKEND_TYPES) {
  using B = TestType;
  manual_seed(5);
  Net<B> net;
  net.eval();
  for (auto& [n, m] : net.named_modules()) CHECK(!m->is_training());
  net.train();
  for (auto& [n, m] : net.named_modules()) CHECK(m->is_training());

  // A training step moves features.1's running stats; save, load into a fresh model, compare everything.
  Generator gen(6);
  net.forward(Var<B>(Tensor<B>::randn({8, 4}, DType::f32, &gen))).sum().backward();
  const auto path = (std::filesystem::temp_directory_path() / fmt::format("kiln-seq-{}.safetensors", ::getpid())).string();
  net.save(path);
  manual_seed(99);
  Net<B> back;
  back.load(path);
  std::filesystem::remove(path);
  std::map<std::string, Tensor<B>> got;
  for (auto& [n, t] : back.state_dict()) got[n] = t;
  for (auto& [n, t] : net.state_dict()) {
    INFO(n);
    REQUIRE(got.count(n));
    CHECK(to_vector<double>(got.at(n)) == to_vector<double>(t));
  }
  CHECK(back.features->template at<BatchNorm1d<B>>(1)->num_batches_tracked().template item<int64_t>() == 1);
  CHECK(to_vector<double>(got.at("features.1.running_mean")) != std::vector<double>(6, 0.0));

  // A state dict missing a nested buffer is refused, naming it.
  std::map<std::string, Tensor<B>> sd(got.begin(), got.end());
  sd.erase("features.1.running_var");
  CHECK_THROWS_WITH(back.load_state_dict(sd), Catch::Contains("missing 1 [features.1.running_var]"));
}

TEMPLATE_TEST_CASE("ModuleList: names 0, 1, ..., iteration, typed access, parameters and modes", "[container]", KILN_BACKEND_TYPES) {
  using B = TestType;
  ModuleList<B> list(std::make_shared<Linear<B>>(LinearOptions{.in = 2, .out = 3, .bias = false}),
                     std::make_shared<GroupNorm<B>>(GroupNormOptions{.num_groups = 1, .num_channels = 3}));
  list.push_back(std::make_shared<BatchNorm1d<B>>(BatchNormOptions{.num_features = 3, .affine = false}));
  CHECK(list.size() == 3);
  CHECK(state_names(list) ==
        std::vector<std::string>{"0.weight", "1.weight", "1.bias", "2.running_mean", "2.running_var", "2.num_batches_tracked"});
  CHECK(list.parameters().size() == 3);
  size_t i = 0;
  for (const auto& m : list) CHECK(m.get() == list[static_cast<int64_t>(i++)].get());
  CHECK(i == 3);
  CHECK(list.template at<GroupNorm<B>>(1)->options().num_groups == 1);
  CHECK_THROWS_WITH(list.template at<Linear<B>>(2), Catch::Contains("ModuleList::at: module 2 is a kiln::nn::BatchNorm1d"));
  CHECK_THROWS_WITH(list[3], Catch::Contains("ModuleList: index 3 is out of range for 3 modules"));
  list.eval();
  for (const auto& m : list) CHECK(!m->is_training());

  // The owner calls them: x -> Linear -> GroupNorm -> BatchNorm1d(eval: running stats 0 and 1).
  Generator gen(3);
  const Var<B> x(Tensor<B>::randn({4, 2}, DType::f32, &gen));
  const Var<B> h = list.template at<GroupNorm<B>>(1)->forward(list.template at<Linear<B>>(0)->forward(x));
  const Var<B> y = list.template at<BatchNorm1d<B>>(2)->forward(h);
  const auto hv = to_vector<double>(h.value()), yv = to_vector<double>(y.value());
  for (size_t k = 0; k < hv.size(); ++k) CHECK(yv[k] == Approx(hv[k] / std::sqrt(1 + 1e-5)).epsilon(1e-6));
}
