// Activation checkpointing (autograd/checkpoint.hpp): the same gradients as without it, bit for bit,
// for every GPT variant, an imported Hugging Face model and a dropout layer; float64 finite differences
// through a checkpointed function; nesting, several outputs, inputs without grad, NoGrad; the errors;
// fewer tape records and, on the emulated Cuda device, a lower allocator peak. The backward pass that
// frees each node as soon as it has run (autograd/var.hpp): the same gradients as a retained graph, and
// a lower allocator peak.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include <nlohmann/json.hpp>
#include <unordered_set>

#include <kiln/autograd/autocast.hpp>
#include <kiln/autograd/checkpoint.hpp>
#include <kiln/autograd/gradcheck.hpp>
#include <kiln/backends/dispatch.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/hf/causal_lm.hpp>
#include <kiln/nn/init.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/nn/transformer.hpp>
#include <kiln/train/trainer.hpp>

#include "common/run.hpp"
#include "param_gradcheck.hpp"

using namespace kiln;

namespace {

const std::string kFixtures = std::string(KILN_SOURCE_DIR) + "/tests/hf/fixtures/";

template <Backend B> Tensor<B> token_ids(int64_t Bn, int64_t T, int64_t vocab, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::vector<int64_t> v(static_cast<size_t>(Bn * T));
  for (auto& t : v) t = static_cast<int64_t>(r() % static_cast<uint64_t>(vocab));
  return Tensor<B>::from_vector(v, {Bn, T});
}

// Each parameter's gradient after one backward of loss(), as raw floats.
template <Backend B, class M>
std::vector<std::pair<std::string, std::vector<float>>> grads_of(M& model, const std::function<Var<B>()>& loss, bool retain_graph = false) {
  for (auto& [n, p] : model.named_parameters()) p.zero_grad();
  loss().backward(retain_graph);
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (auto& [n, p] : model.named_parameters()) {
    REQUIRE(p.grad().defined());
    out.emplace_back(n, to_vector<float>(p.grad().to(DType::f32)));
  }
  return out;
}

// Bit for bit (float ==; no NaNs here). Returns how many gradients are all zeros (on both sides).
template <class G> int require_identical(const G& a, const G& b) {
  REQUIRE(a.size() == b.size());
  int zeros = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("parameter " << a[i].first);
    REQUIRE(a[i].first == b[i].first);
    double nz = 0;
    for (float v : a[i].second) nz += std::abs(v);
    zeros += nz == 0;
    CHECK(a[i].second == b[i].second);
  }
  return zeros;
}

// Interior nodes (tape records) reachable from v.
template <Backend B> size_t tape_records(const Var<B>& v) {
  std::unordered_set<const autograd::Node<B>*> seen;
  std::vector<const autograd::Node<B>*> stack{v.node().get()};
  size_t n = 0;
  while (!stack.empty()) {
    const auto* x = stack.back();
    stack.pop_back();
    if (!x || !seen.insert(x).second) continue;
    if (!x->is_leaf()) ++n;
    for (const auto& in : x->inputs) stack.push_back(in.get());
  }
  return n;
}

ModelConfig tiny(const std::string& attention, const std::string& residual) {
  ModelConfig c;
  c.vocab_size = 61;
  c.d_model = 32;
  c.n_layers = 3;
  c.n_heads = attention == "diff" ? 2 : 4;
  c.n_kv_heads = attention == "diff" ? 1 : 2;
  c.max_seq_len = 16;
  c.attention = attention;
  c.residual = residual;
  c.attnres_block_size = 2;
  return c;
}

template <Backend B> void gpt_identical(const ModelConfig& c, DType autocast_dtype) {
  nn::GPT<B> model(c);
  model.init_weights(3);
  // AttnRes queries start at zero (a uniform mixture); make them matter.
  for (auto& [n, p] : model.named_parameters())
    if (n.size() > 5 && n.substr(n.size() - 5) == "query") nn::init::normal_(p, 0.0, 0.5);
  const Tensor<B> x = token_ids<B>(2, 12, c.vocab_size, 1), y = token_ids<B>(2, 12, c.vocab_size, 2);
  auto loss = [&]() -> Var<B> {
    const autocast::Scope ac(autocast_dtype);
    return nn::cross_entropy(model.forward(x).reshape({-1, c.vocab_size}), y.reshape({-1}));
  };
  model.set_activation_checkpointing(false);
  const auto plain = grads_of<B>(model, loss);
  model.set_activation_checkpointing(true);
  const auto ckpt = grads_of<B>(model, loss);
  // Only the first sublayer's depth attention has none: a softmax over its one source (the embedding).
  CHECK(require_identical(plain, ckpt) == (c.residual == "standard" ? 0 : 2));
}

}  // namespace

TEST_CASE("checkpoint: GPT gradients are bit-identical with and without it, every attention and residual, f32 and bf16 autocast",
          "[checkpoint]") {
  for (const auto& [attn, res] : std::vector<std::pair<std::string, std::string>>{
           {"mha", "standard"}, {"diff", "standard"}, {"mha", "attnres_block"}, {"diff", "attnres_full"}}) {
    for (DType ac : {DType::f32, DType::bf16}) {
      INFO(attn << " " << res << " autocast " << dtype_name(ac));
      gpt_identical<Cpu>(tiny(attn, res), ac);
    }
  }
}

TEST_CASE("checkpoint: an imported Hugging Face model's gradients are bit-identical with and without it", "[checkpoint]") {
  for (const std::string name : {"llama", "gpt2"}) {
    for (DType ac : {DType::f32, DType::bf16}) {
      INFO(name << " autocast " << dtype_name(ac));
      auto model = hf::load_causal_lm<Cpu>(kFixtures + name, hf::LoadOptions{.autocast = ac});
      const int64_t V = model->spec().vocab;
      const Tensor<Cpu> x = token_ids<Cpu>(2, 7, V, 5), y = token_ids<Cpu>(2, 7, V, 6);
      auto loss = [&]() { return nn::cross_entropy(model->forward(x).reshape({-1, V}), y.reshape({-1})); };
      model->set_activation_checkpointing(false);
      const auto plain = grads_of<Cpu>(*model, loss);
      model->set_activation_checkpointing(true);
      const auto ckpt = grads_of<Cpu>(*model, loss);
      CHECK(require_identical(plain, ckpt) == 0);
    }
  }
}

TEST_CASE("checkpoint: dropout draws the same mask in the recomputation, and the random stream goes on as without it", "[checkpoint]") {
  nn::TransformerEncoderLayer<Cpu> layer({.d_model = 16, .n_heads = 2, .dim_feedforward = 24, .dropout = 0.3, .norm_first = true});
  layer.train();
  const Tensor<Cpu> x0 = Tensor<Cpu>::normal({2, 5, 16}, 0, 1, DType::f32);
  // The layer's parameter gradients and the input's, with and without checkpointing.
  auto grads = [&](bool ckpt, uint64_t& offset_after) {
    for (auto& [n, p] : layer.named_parameters()) p.zero_grad();
    manual_seed(11);
    Var<Cpu> x(x0.clone(), true);
    auto f = [&](const Var<Cpu>& h) { return layer.forward(layer.forward(h)); };
    Var<Cpu> out = ckpt ? kiln::checkpoint<Cpu>(f, x) : f(x);
    (out * out).sum().backward();
    offset_after = default_generator().offset();
    std::vector<std::pair<std::string, std::vector<float>>> g{{"input", to_vector<float>(x.grad())}};
    for (auto& [n, p] : layer.named_parameters()) g.emplace_back(n, to_vector<float>(p.grad()));
    return g;
  };
  uint64_t off_plain = 0, off_ckpt = 0;
  const auto plain = grads(false, off_plain);
  const auto ckpt = grads(true, off_ckpt);
  CHECK(require_identical(plain, ckpt) == 0);
  CHECK(off_plain > 0);
  CHECK(off_ckpt == off_plain);  // the recomputation's draws were given back
}

TEST_CASE("checkpoint: float64 finite differences through a checkpointed GPT and a checkpointed function", "[checkpoint]") {
  ModelConfig c = tiny("mha", "attnres_block");
  c.n_layers = 2;
  nn::GPT<Cpu> model(c, DType::f64);
  model.init_weights(4);
  for (auto& [n, p] : model.named_parameters())
    if (n.size() > 5 && n.substr(n.size() - 5) == "query") nn::init::normal_(p, 0.0, 0.5);
  model.set_activation_checkpointing(true);
  const Tensor<Cpu> x = token_ids<Cpu>(1, 6, c.vocab_size, 7), y = token_ids<Cpu>(1, 6, c.vocab_size, 8);
  std::vector<std::pair<std::string, Var<Cpu>>> params;
  for (auto& [n, p] : model.named_parameters())
    if (n.find("layers.1.") == 0 || n == "tok_emb.weight") params.emplace_back(n, p);
  test::check_param_grads<Cpu>(
      params,
      [&] {
        return nn::cross_entropy(model.forward(x).reshape({-1, c.vocab_size}), y.reshape({-1}));
      },
      1e-6, 1e-6, 8);

  // Inputs and a closed-over weight, nested, two outputs, one input without grad.
  Generator g(9);
  Var<Cpu> w(Tensor<Cpu>::normal({4, 4}, 0, 0.5, DType::f64, &g), true);
  const Tensor<Cpu> frozen = Tensor<Cpu>::normal({3, 4}, 0, 1, DType::f64, &g);
  const auto f = [w, frozen](const std::vector<Var<Cpu>>& in) {
    auto inner = [w](const std::vector<Var<Cpu>>& v) {
      const Var<Cpu> h = v[0].matmul(w).tanh();
      return std::vector<Var<Cpu>>{h, (h * v[1]).sin()};
    };
    const auto outs = kiln::checkpoint<Cpu>(
        [inner, frozen](const std::vector<Var<Cpu>>& v) {
          const auto r = kiln::checkpoint<Cpu>(inner, {v[0], v[1]});
          return std::vector<Var<Cpu>>{r[0] + Var<Cpu>(frozen), r[1].exp()};
        },
        {in[0], in[1], Var<Cpu>(frozen)});
    return (outs[0] * outs[1]).sum() + outs[0].square().sum();
  };
  const Tensor<Cpu> a = Tensor<Cpu>::normal({3, 4}, 0, 1, DType::f64, &g), b = Tensor<Cpu>::normal({3, 4}, 0, 1, DType::f64, &g);
  const auto r = gradcheck<Cpu>(f, {a, b});
  INFO(r.message);
  CHECK(r.ok);
  // The closed-over weight: against the same function without checkpointing.
  Var<Cpu> va(a, true), vb(b, true);
  w.zero_grad();  // gradcheck's backward passes accumulated into it
  f({va, vb}).backward();
  const std::vector<double> gw = to_vector<double>(w.grad());
  w.zero_grad();
  const Var<Cpu> h = va.matmul(w).tanh();
  const Var<Cpu> o0 = h + Var<Cpu>(frozen), o1 = (h * vb).sin().exp();
  ((o0 * o1).sum() + o0.square().sum()).backward();
  CHECK(gw == to_vector<double>(w.grad()));
}

TEST_CASE("checkpoint: NoGrad, inputs without grad, outputs passed through, the tape records", "[checkpoint]") {
  Var<Cpu> w(Tensor<Cpu>::ones({3}), true);
  const auto f = [w](const Var<Cpu>& x) { return (x * w).exp(); };
  const Var<Cpu> x(Tensor<Cpu>::arange(0, 3, 1, DType::f32));
  {
    NoGrad ng;
    CHECK(!kiln::checkpoint<Cpu>(f, x).requires_grad());
  }
  // Nothing it reads needs grad: a plain result.
  CHECK(!kiln::checkpoint<Cpu>([](const Var<Cpu>& v) { return v.exp(); }, x).requires_grad());
  // The input does not need grad, the closed-over weight does.
  const Var<Cpu> y = kiln::checkpoint<Cpu>(f, x);
  CHECK(std::string(y.grad_fn()) == "checkpoint");
  y.sum().backward();
  CHECK(to_vector<float>(w.grad()) == to_vector<float>(x.value().exp().mul(x.value())));
  // An output that is an input, untouched.
  Var<Cpu> a(Tensor<Cpu>::ones({2}), true);
  const auto outs = kiln::checkpoint<Cpu>([](const std::vector<Var<Cpu>>& v) { return std::vector<Var<Cpu>>{v[0], v[0] * 2.0}; }, {a});
  (outs[0] + outs[1]).sum().backward();
  CHECK(to_vector<float>(a.grad()) == std::vector<float>{3, 3});

  // A post-accumulate hook (DistributedDataParallel's) on a parameter used only inside a segment runs
  // once per backward, after the last accumulation: .grad is then final.
  Var<Cpu> p(Tensor<Cpu>::ones({2}), true);
  std::vector<std::vector<float>> seen;
  p.register_post_accumulate_hook([&](const Tensor<Cpu>& g) { seen.push_back(to_vector<float>(g)); });
  const Var<Cpu> q = kiln::checkpoint<Cpu>([p](const Var<Cpu>& v) { return (v * p) * p; }, a);
  (q.sum() + a.sum()).backward();
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == to_vector<float>(p.grad()));
  CHECK(seen[0] == std::vector<float>{2, 2});  // d/dp of a·p² at a = p = 1

  // A Var used inside and outside a segment: its gradient is summed in the same order as without
  // checkpointing (the outside uses first, then the segment's, one by one), so it is bit-identical.
  const Tensor<Cpu> x0 = Tensor<Cpu>::normal({257}, 0, 1, DType::f32), c1 = Tensor<Cpu>::normal({257}, 0, 1, DType::f32);
  auto mixed = [&](bool ckpt) {
    Var<Cpu> leaf(x0, true);
    const Var<Cpu> h = leaf * 1.5;
    auto layer = [](const Var<Cpu>& v) { return v.exp() + v.sin() * 3.0 + v.square() * v; };
    const Var<Cpu> out = ckpt ? kiln::checkpoint<Cpu>(layer, h) : layer(h);
    ((out * Var<Cpu>(c1)).sum() + (h * Var<Cpu>(c1)).sum() + h.cos().sum()).backward();
    return to_vector<float>(leaf.grad());
  };
  CHECK(mixed(true) == mixed(false));

  // A GPT keeps a handful of records per layer instead of every op's.
  nn::GPT<Cpu> model(tiny("mha", "standard"));
  const Tensor<Cpu> ids = token_ids<Cpu>(1, 8, 61, 3);
  const size_t plain = tape_records(model.forward(ids));
  model.set_activation_checkpointing(true);
  const size_t ckpt = tape_records(model.forward(ids));
  INFO("tape records: " << plain << " without, " << ckpt << " with checkpointing");
  CHECK(ckpt + 3 * 20 < plain);  // 3 layers of 20+ records each become 3 records
}

TEST_CASE("checkpoint: a function that changes between the runs, or leaks an intermediate, is an error", "[checkpoint][errors]") {
  Var<Cpu> w(Tensor<Cpu>::ones({3}), true), u(Tensor<Cpu>::ones({3}).mul(2.0), true);
  const Var<Cpu> wu = w * u;  // an interior node from outside
  const Var<Cpu> x(Tensor<Cpu>::ones({3}), true);
  int calls = 0;
  const Var<Cpu> y = kiln::checkpoint<Cpu>([&](const Var<Cpu>& v) { return ++calls == 1 ? v * 2.0 : v * wu; }, x);
  try {
    y.sum().backward();
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("checkpoint") && Catch::Contains("did not read"));
  }
  Var<Cpu> leaked;
  const Var<Cpu> z = kiln::checkpoint<Cpu>(
      [&](const Var<Cpu>& v) {
        leaked = v.exp();
        return leaked * 2.0;
      },
      x);
  try {
    (z.sum() + leaked.sum()).backward();
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("exp") && Catch::Contains("inside a checkpointed function"));
  }
  calls = 0;
  const Var<Cpu> s = kiln::checkpoint<Cpu>([&](const Var<Cpu>& v) { return ++calls == 1 ? v * 2.0 : v.sum(); }, x);
  CHECK_THROWS_WITH(s.sum().backward(), Catch::Contains("output 0 is [] f32, the first run's [3] f32"));
}

TEST_CASE("checkpoint: kiln train with activation_checkpointing or --activation-checkpointing: the same losses, and resume",
          "[checkpoint][cli]") {
  namespace fs = std::filesystem;
  using json = nlohmann::json;
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln-ckpt-{}", ::getpid());
  fs::create_directories(dir);
  std::mt19937_64 r(1);
  std::vector<int64_t> tokens(2000);
  for (auto& t : tokens) t = static_cast<int64_t>(r() % 48);
  safetensors::save<Cpu>((dir / "tokens.safetensors").string(),
                         {{"tokens", Tensor<Cpu>::from_vector(tokens, {static_cast<int64_t>(tokens.size())})}});
  std::ofstream(dir / "model.json") << R"({"vocab_size": 48, "d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 16,
                                           "residual": "attnres_block", "attnres_block_size": 3})";
  for (const bool on : {false, true})
    std::ofstream(dir / fmt::format("train_{}.json", on))
        << json{{"batch_size", 2}, {"seq_len", 16}, {"steps", 4}, {"activation_checkpointing", on}}.dump();
  auto train = [&](bool key, bool flag, int64_t stop_after, const std::string& resume) {
    TrainOptions o;
    o.model_path = (dir / "model.json").string();
    o.train_path = (dir / fmt::format("train_{}.json", key)).string();
    o.data_path = (dir / "tokens.safetensors").string();
    o.activation_checkpointing = flag;
    o.stop_after = stop_after;
    o.checkpoint_path = (dir / "ckpt.safetensors").string();
    o.resume_path = resume;
    o.quiet = true;
    return train_gpt(o).losses;
  };
  const auto plain = train(false, false, -1, "");
  REQUIRE(plain.size() == 4);
  CHECK(train(true, false, -1, "") == plain);
  const auto first = train(false, true, 2, "");  // the flag, stopped after 2 steps
  const auto rest = train(false, true, -1, (dir / "ckpt.safetensors").string());
  REQUIRE(first.size() == 2);
  REQUIRE(rest.size() == 2);
  CHECK(std::vector<double>{first[0], first[1], rest[0], rest[1]} == plain);
  // The command line flag reaches the trainer: its banner says so.
  const auto res = kt::run_command(fmt::format("{} train --model {} --train {} --data {} --activation-checkpointing --progress off 2>&1",
                                               KILN_CLI, (dir / "model.json").string(), (dir / "train_false.json").string(),
                                               (dir / "tokens.safetensors").string()));
  CHECK(res.status == 0);
  CHECK_THAT(res.out, Catch::Contains("activation checkpointing on"));
  fs::remove_all(dir);
}

#if defined(KILN_HAVE_CUDA_BACKEND)
TEST_CASE("checkpoint: a checkpointed GPT on Cuda: the same gradients, a lower allocator peak", "[checkpoint][cuda]") {
  const ModelConfig c = tiny("mha", "standard");
  gpt_identical<Cuda>(c, DType::f32);
  nn::GPT<Cuda> model(c);
  const Tensor<Cuda> x = token_ids<Cuda>(4, 16, c.vocab_size, 1), y = token_ids<Cuda>(4, 16, c.vocab_size, 2);
  auto peak = [&](bool ckpt) {
    model.set_activation_checkpointing(ckpt);
    for (auto& [n, p] : model.named_parameters()) p.zero_grad();
    cuda::synchronize();
    const size_t base = cuda::memory_stats().allocated_bytes;
    cuda::reset_peak_memory_stats();
    nn::cross_entropy(model.forward(x).reshape({-1, c.vocab_size}), y.reshape({-1})).backward();
    cuda::synchronize();
    return cuda::memory_stats().peak_allocated_bytes - base;
  };
  const size_t plain = peak(false), ckpt = peak(true);
  INFO("peak above the weights: " << plain << " bytes without, " << ckpt << " with checkpointing");
  CHECK(ckpt < plain);
}
#endif

// The backward pass frees each node as soon as its backward has run (autograd/var.hpp); a retained
// graph (backward(retain_graph = true)) frees nothing until its Vars go, as every backward did before.
TEST_CASE("backward: GPT gradients are bit-identical whether the pass frees the graph as it goes or retains it", "[checkpoint]") {
  for (const auto& [attn, res] :
       std::vector<std::pair<std::string, std::string>>{{"mha", "standard"}, {"diff", "attnres_block"}, {"mha", "attnres_full"}}) {
    for (const bool ckpt : {false, true}) {
      INFO(attn << " " << res << (ckpt ? " checkpointed" : ""));
      const ModelConfig c = tiny(attn, res);
      nn::GPT<Cpu> model(c);
      model.init_weights(3);
      for (auto& [n, p] : model.named_parameters())
        if (n.size() > 5 && n.substr(n.size() - 5) == "query") nn::init::normal_(p, 0.0, 0.5);
      model.set_activation_checkpointing(ckpt);
      const Tensor<Cpu> x = token_ids<Cpu>(2, 12, c.vocab_size, 1), y = token_ids<Cpu>(2, 12, c.vocab_size, 2);
      const std::function<Var<Cpu>()> loss = [&] {
        return nn::cross_entropy(model.forward(x).reshape({-1, c.vocab_size}), y.reshape({-1}));
      };
      const auto retained = grads_of<Cpu>(model, loss, true);
      const auto freed = grads_of<Cpu>(model, loss, false);
      CHECK(require_identical(retained, freed) == (res == "standard" ? 0 : 2));
    }
  }
}

#if defined(KILN_HAVE_CUDA_BACKEND)
namespace {
// The allocator peak of one forward + backward of a GPT on Cuda, above what was allocated before (the
// weights), with the graph freed as the pass goes or retained.
size_t gpt_step_peak(nn::GPT<Cuda>& model, const Tensor<Cuda>& x, const Tensor<Cuda>& y, bool retain_graph) {
  const int64_t V = model.config().vocab_size;
  for (auto& [n, p] : model.named_parameters()) p.zero_grad();
  cuda::synchronize();
  const size_t base = cuda::memory_stats().allocated_bytes;
  cuda::reset_peak_memory_stats();
  nn::cross_entropy(model.forward(x).reshape({-1, V}), y.reshape({-1})).backward(retain_graph);
  cuda::synchronize();
  return cuda::memory_stats().peak_allocated_bytes - base;
}
}  // namespace

TEST_CASE("backward: freeing each node as soon as it has run lowers the allocator peak of a GPT step on Cuda", "[checkpoint][cuda]") {
  for (const std::string res : {"standard", "attnres_block"}) {
    INFO(res);
    const ModelConfig c = tiny("mha", res);
    nn::GPT<Cuda> model(c);
    const Tensor<Cuda> x = token_ids<Cuda>(4, 16, c.vocab_size, 1), y = token_ids<Cuda>(4, 16, c.vocab_size, 2);
    const size_t retained = gpt_step_peak(model, x, y, true), freed = gpt_step_peak(model, x, y, false);
    CHECK(freed < retained);
  }
}

// The figures of docs/memory.md (hidden: `test_nn "[.memory]"`, or emu_test_nn on the emulated device;
// neither "Cuda" in its name nor [cuda]: the emulated-device runs of the suite leave it out).
TEST_CASE("backward: the allocator peak of a GPT step on the GPU, the graph freed as the pass goes or retained", "[.memory]") {
  if (!cuda::available()) {
    WARN("no CUDA device: " << cuda::unavailable_reason());
    return;
  }
  ModelConfig c = tiny("mha", "standard");
  c.vocab_size = 512;
  c.d_model = 256;
  c.n_layers = 4;
  c.n_heads = 4;
  c.n_kv_heads = 4;
  c.max_seq_len = 128;
  for (const std::string res : {"standard", "attnres_block"}) {
    c.residual = res;
    nn::GPT<Cuda> model(c);
    const Tensor<Cuda> x = token_ids<Cuda>(8, 128, c.vocab_size, 1), y = token_ids<Cuda>(8, 128, c.vocab_size, 2);
    for (const bool ckpt : {false, true}) {
      model.set_activation_checkpointing(ckpt);
      const size_t retained = gpt_step_peak(model, x, y, true), freed = gpt_step_peak(model, x, y, false);
      fmt::print("{} {}: peak above the weights {:.2f} MiB retained, {:.2f} MiB freed as the pass goes ({:.2f}x)\n", res,
                 ckpt ? "checkpointed" : "plain", static_cast<double>(retained) / (1 << 20), static_cast<double>(freed) / (1 << 20),
                 static_cast<double>(retained) / static_cast<double>(freed));
      CHECK(freed < retained);
    }
  }
}
#endif
