// DistributedDataParallel and ZeroOptimizer: N ranks against one process with the same global batch
// (each rank its contiguous slice of the rows), on GPTs (MHA; Diff + AttnRes), with and without
// ZeRO-1, with gradient accumulation; parameters without gradients; the checkpoint of ZeRO-1.
// Every rank computes the one-process reference itself (same weights, same data, full batch).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <kiln/config.hpp>
#include <kiln/dist/ddp.hpp>
#include <kiln/dist/zero.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/batch_norm.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/optimizer.hpp>
#include <kiln/train/dataloader.hpp>
#include <kiln/train/dist_fit.hpp>
#include <kiln/train/loop.hpp>
#if defined(KILN_HAVE_CUDA_BACKEND)
#include <kiln/backends/cuda/cuda.hpp>
#endif

using namespace kiln;
namespace dist = kiln::dist;

namespace {

ModelConfig mha_config() {
  ModelConfig c;
  c.vocab_size = 61;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.max_seq_len = 16;
  return c.resolved();
}

ModelConfig diff_attnres_config() {
  ModelConfig c;
  c.vocab_size = 61;
  c.d_model = 32;
  c.n_layers = 2;
  c.max_seq_len = 16;
  c.attention = "diff";
  c.n_heads = 2;
  c.residual = "attnres_block";
  c.attnres_block_size = 2;
  return c.resolved();
}

constexpr int64_t kT = 12;

// Batch s of the token data: [B, T + 1] ids, a pure function of (s, row).
Tensor<Cpu> batch(int64_t s, int64_t B, int64_t vocab) {
  std::vector<int64_t> ids(static_cast<size_t>(B * (kT + 1)));
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t <= kT; ++t)
      ids[static_cast<size_t>(r * (kT + 1) + t)] = (s * 131 + r * 31 + t * 7 + (r * t) % 5 + (s * r) % 3) % vocab;
  return Tensor<Cpu>::from_vector(ids, {B, kT + 1});
}

Var<Cpu> lm_loss(const nn::GPT<Cpu>& m, const Tensor<Cpu>& rows) {
  const Tensor<Cpu> x = rows.narrow(1, 0, kT).contiguous(), y = rows.narrow(1, 1, kT).contiguous();
  return nn::cross_entropy(m.forward(x).reshape({-1, m.config().vocab_size}), y.reshape({-1}));
}

optim::AdamOptions adam() { return {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .decoupled = true}; }

struct Result {
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> weights;
};

std::map<std::string, std::vector<double>> weights_of(const nn::Module<Cpu>& m) {
  std::map<std::string, std::vector<double>> w;
  for (const auto& [n, p] : m.named_parameters()) w[n] = to_vector<double>(p.value());
  return w;
}

// One process: the whole batch in one backward per step, or in k micro-batches of B/k rows whose
// losses are scaled by 1/k (the same additions as k ranks averaging their gradients).
Result train_single(const ModelConfig& c, int64_t steps, int64_t B, uint64_t seed, int64_t k = 1) {
  nn::GPT<Cpu> model(c);
  model.init_weights(seed);
  optim::Adam<Cpu> opt(model.named_parameters(), adam());
  Result r;
  for (int64_t s = 0; s < steps; ++s) {
    opt.zero_grad();
    const Tensor<Cpu> b = batch(s, B, c.vocab_size);
    double loss = 0;
    for (int64_t j = 0; j < k; ++j) {
      const Var<Cpu> l = k == 1 ? lm_loss(model, b) : lm_loss(model, b.narrow(0, j * (B / k), B / k)).mul(1.0 / static_cast<double>(k));
      l.backward();
      loss += item<double>(l.value());
    }
    optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    r.losses.push_back(loss);
  }
  r.weights = weights_of(model);
  return r;
}

// N ranks: rank r takes rows [r·B/N, (r+1)·B/N) of each batch, in `accum` micro-batches (all but the
// last under no_sync). Rank r starts from other weights (seed + r): DDP must give it rank 0's.
Result train_ddp(const ModelConfig& c, int64_t steps, int64_t B, uint64_t seed, bool zero, int64_t accum, dist::DDPOptions o = {}) {
  nn::GPT<Cpu> model(c);
  model.init_weights(seed + static_cast<uint64_t>(dist::rank()));
  dist::DistributedDataParallel<Cpu> ddp(model, o);
  std::unique_ptr<optim::Optimizer<Cpu>> opt;
  if (zero)
    opt = std::make_unique<dist::ZeroOptimizer<Cpu>>(model.named_parameters(), adam());
  else
    opt = std::make_unique<optim::Adam<Cpu>>(model.named_parameters(), adam());
  Result r;
  for (int64_t s = 0; s < steps; ++s) {
    opt->zero_grad();
    const Tensor<Cpu> mine = dist::local_rows(batch(s, B, c.vocab_size));
    const int64_t per = mine.size(0) / accum;
    double local = 0;
    for (int64_t j = 0; j < accum; ++j) {
      const Var<Cpu> loss = lm_loss(model, mine.narrow(0, j * per, per)).mul(1.0 / static_cast<double>(accum));
      if (j + 1 < accum) {
        auto no_sync = ddp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
      local += item<double>(loss.value());
    }
    ddp.synchronize();  // a no-op here: the last backward synchronised
    optim::clip_grad_norm(model.parameters(), 1.0);
    opt->step();
    r.losses.push_back(dist::all_reduce_scalar(local, dist::ReduceOp::avg));
  }
  r.weights = weights_of(model);
  return r;
}

// Per-step losses within loss_rel (relative); final weights within weight_rel as the relative L2
// difference over all parameters, and within tensor_rel per parameter tensor.
void check_close(const Result& got, const Result& want, double loss_rel, double weight_rel, double tensor_rel) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s) {
    INFO("step " << s << ": " << got.losses[s] << " vs " << want.losses[s]);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= loss_rel * std::abs(want.losses[s]));
  }
  double all_d2 = 0, all_n2 = 0;
  for (const auto& [name, w] : want.weights) {
    const auto& g = got.weights.at(name);
    double d2 = 0, n2 = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      d2 += (g[i] - w[i]) * (g[i] - w[i]);
      n2 += w[i] * w[i];
    }
    all_d2 += d2;
    all_n2 += n2;
    INFO(name << ": relative L2 difference " << std::sqrt(d2 / std::max(n2, 1e-30)));
    CHECK(std::sqrt(d2) <= tensor_rel * std::sqrt(n2));
  }
  INFO("all parameters: relative L2 difference " << std::sqrt(all_d2 / all_n2));
  CHECK(std::sqrt(all_d2) <= weight_rel * std::sqrt(all_n2));
}

// Against one process with the same global batch: losses within 1e-5, weights within 1e-4 (relative
// L2 over the model). Per tensor 1e-3: AttnRes queries start at zero and Adam turns the rounding of
// their tiny gradients (the batch split in two, in one process too) into relative differences of
// about 2e-4 after a few steps.
void check_parity(const Result& got, const Result& want) { check_close(got, want, 1e-5, 1e-4, 1e-3); }

// Every rank holds the same bits.
void check_same_on_every_rank(const nn::Module<Cpu>& m) {
  for (const auto& [name, p] : m.named_parameters()) {
    const Tensor<Cpu> hi = p.value().clone(), lo = p.value().clone();
    dist::all_reduce(hi, dist::ReduceOp::max);
    dist::all_reduce(lo, dist::ReduceOp::min);
    INFO(name);
    CHECK(to_vector<float>(hi) == to_vector<float>(lo));
  }
}

}  // namespace

TEST_CASE("DDP: N ranks = 1 process with the same global batch (GPT, MHA)", "[ddp][two-hosts]") {
  const ModelConfig c = mha_config();
  const Result got = train_ddp(c, 5, 8, 7, false, 1);
  check_parity(got, train_single(c, 5, 8, 7));
  // 2 ranks add the same numbers as one process with the batch in 2 micro-batches: bit for bit
  if (dist::world_size() == 2) check_close(got, train_single(c, 5, 8, 7, 2), 0, 0, 0);
}

TEST_CASE("DDP: N ranks = 1 process (GPT, Diff + AttnRes), small buckets launched during backward", "[ddp]") {
  const ModelConfig c = diff_attnres_config();
  const Result got = train_ddp(c, 5, 8, 11, false, 1, {.bucket_mb = 0.02, .first_bucket_mb = 0.005});
  check_parity(got, train_single(c, 5, 8, 11));
  if (dist::world_size() == 2) check_close(got, train_single(c, 5, 8, 11, 2), 0, 0, 0);
}

TEST_CASE("DDP + gradient accumulation (no_sync): N ranks x 2 micro-batches = 1 process", "[ddp]") {
  const ModelConfig c = mha_config();
  check_parity(train_ddp(c, 4, 8, 5, false, 2), train_single(c, 4, 8, 5));
}

TEST_CASE("ZeRO-1: N ranks with sharded AdamW state = 1 process (MHA; Diff + AttnRes with accumulation)", "[ddp]") {
  const ModelConfig c = mha_config();
  const Result got = train_ddp(c, 5, 8, 3, true, 1);
  check_parity(got, train_single(c, 5, 8, 3));
  if (dist::world_size() == 2) check_close(got, train_single(c, 5, 8, 3, 2), 1e-7, 1e-7, 1e-6);  // (Adam on 1-D pieces)
  const ModelConfig d = diff_attnres_config();
  check_parity(train_ddp(d, 4, 8, 13, true, 2, {.bucket_mb = 0.01, .first_bucket_mb = 0.01}), train_single(d, 4, 8, 13));
}

TEST_CASE("ZeRO-1: each rank holds 1/N of the state; parameters stay identical on every rank", "[ddp]") {
  const int N = dist::world_size();
  nn::GPT<Cpu> model(mha_config());
  model.init_weights(1);
  dist::DistributedDataParallel<Cpu> ddp(model);
  dist::ZeroOptimizer<Cpu> opt(model.named_parameters(), adam());
  const int64_t total = model.num_parameters();
  CHECK(opt.total_numel() == total);
  CHECK(opt.shard_numel() <= (total + N - 1) / N);
  CHECK(static_cast<int64_t>(dist::all_reduce_scalar(static_cast<double>(opt.shard_numel()))) == total);
  lm_loss(model, dist::local_rows(batch(0, 4 * N, 61))).backward();
  opt.step();
  int64_t held = 0;
  for (const auto& [k, t] : opt.shard_optimizer().state_dict())
    if (k.rfind("exp_avg.", 0) == 0) held += t.numel();
  CHECK(held == opt.shard_numel());
  check_same_on_every_rank(model);
  // the full state: what one optim::Adam keeps
  const auto full = opt.state_dict();
  int64_t n_avg = 0;
  for (const auto& [k, t] : full)
    if (k.rfind("exp_avg.", 0) == 0) n_avg += t.numel();
  CHECK(n_avg == total);
  // through the base class (as kiln::fit holds it): the same sharded load, state_dict and step
  std::map<std::string, Tensor<Cpu>> m(full.begin(), full.end());
  m["step"] = Tensor<Cpu>::full({}, 99, DType::i64);
  optim::Optimizer<Cpu>& base = opt;
  base.load_state_dict(m);
  CHECK(opt.step_count() == 99);
  CHECK(opt.shard_optimizer().step_count() == 99);
  CHECK(base.state_dict().size() == full.size());
  CHECK_THROWS_WITH(base.load_state_dict({{"step", m["step"]}, {"exp_avg.nope", m["step"]}}), Catch::Contains("exp_avg.nope"));
  opt.step();
  CHECK(opt.step_count() == 100);
}

namespace {
// Three linear maps: `a` always used, `b` used only by rank 0, `c` never.
class Branches : public nn::Module<Cpu> {
 public:
  Branches() {
    a_ = this->register_module("a", std::make_shared<nn::Linear<Cpu>>(nn::LinearOptions{.in = 3, .out = 2, .bias = true}));
    b_ = this->register_module("b", std::make_shared<nn::Linear<Cpu>>(nn::LinearOptions{.in = 3, .out = 2, .bias = true}));
    c_ = this->register_module("c", std::make_shared<nn::Linear<Cpu>>(nn::LinearOptions{.in = 3, .out = 2, .bias = false}));
  }
  Var<Cpu> forward(const Var<Cpu>& x, bool use_b) const {
    const Var<Cpu> h = (*a_)(x);
    return use_b ? h + (*b_)(x) : h;
  }

 private:
  std::shared_ptr<nn::Linear<Cpu>> a_, b_, c_;
};
}  // namespace

TEST_CASE("DDP: parameters without a gradient on some or all ranks", "[ddp]") {
  const int r = dist::rank(), N = dist::world_size();
  Branches model;
  dist::DistributedDataParallel<Cpu> ddp(model, {.bucket_mb = 1e-5, .first_bucket_mb = 1e-5});  // a bucket per parameter
  const Tensor<Cpu> x = Tensor<Cpu>::full({4, 3}, 0.5 + r);
  // Each rank's local gradients, computed without DDP on a copy: the averaged gradient is their sum / N,
  // ranks without one counting as zeros.
  Branches copy;
  copy.load_state_dict(std::map<std::string, Tensor<Cpu>>([&] {
    std::map<std::string, Tensor<Cpu>> m;
    for (auto& [n, v] : model.state_dict()) m.emplace(n, v.clone());
    return m;
  }()));
  copy.forward(x, r == 0).square().sum().backward();
  model.forward(x, r == 0).square().sum().backward();
  for (const auto& [name, p] : copy.named_parameters()) {
    INFO(name);
    const Var<Cpu> q = model.parameter(name);
    if (name.rfind("c.", 0) == 0) {
      CHECK_FALSE(q.grad().defined());  // no rank gave it a gradient: undefined, as in one process
      continue;
    }
    const Tensor<Cpu> sum = p.grad().defined() ? p.grad().clone() : Tensor<Cpu>::zeros(p.shape());
    dist::all_reduce(sum);
    if (!q.grad().defined()) {
      FAIL_CHECK("no gradient");
      continue;
    }
    CHECK(to_vector<float>(q.grad()) == to_vector<float>(sum.div(N)));
  }
  // A rank whose backward reaches no parameter takes part through synchronize().
  model.zero_grad();
  Var<Cpu> other(Tensor<Cpu>::ones({2}), true);
  if (r == 0)
    model.forward(x, true).sum().backward();
  else
    (other * 2.0).sum().backward();
  ddp.synchronize();
  CHECK(model.parameter("a.weight").grad().defined());
  const Tensor<Cpu> zero_rank = Tensor<Cpu>::ones({1}).mul(static_cast<double>(r == 0));
  dist::all_reduce(zero_rank);
  CHECK(item<float>(zero_rank) == 1.0f);
  check_same_on_every_rank(model);
}

TEST_CASE("DDP: buckets cover every parameter once, in reverse order; launched during backward", "[ddp]") {
  nn::GPT<Cpu> model(mha_config());
  model.init_weights(2);
  dist::DistributedDataParallel<Cpu> ddp(model, {.bucket_mb = 0.01, .first_bucket_mb = 0.005});
  std::vector<std::string> names;
  for (const auto& b : ddp.buckets())
    for (const auto& n : b.params) names.push_back(n);
  std::vector<std::string> want;
  for (const auto& [n, p] : model.named_parameters()) want.insert(want.begin(), n);
  CHECK(names == want);
  CHECK(ddp.buckets().size() > 3);
  lm_loss(model, dist::local_rows(batch(0, 2 * dist::world_size(), 61))).backward();
  CHECK(ddp.stats().rounds == 1);
  CHECK(ddp.stats().launched == static_cast<int64_t>(ddp.buckets().size()));
  CHECK(ddp.stats().launched_early > 0);
  // a model that differs between ranks is refused at construction, naming the difference
  if (dist::world_size() > 1) {
    nn::Linear<Cpu> odd(nn::LinearOptions{.in = dist::rank() == 1 ? 5 : 4, .out = 2, .bias = true});
    CHECK_THROWS_WITH(dist::DistributedDataParallel<Cpu>(odd), Catch::Contains("DistributedDataParallel: ") && Catch::Contains("model"));
  }
}

// The ZeRO-1 checkpoint: written by N ranks after 3 steps ([zero-write]), resumed by one process for 3
// more ([zero-resume]); both runs must end where one process training 6 steps ends. The file is
// $KILN_DIST_CKPT (tests/dist/CMakeLists.txt runs the two in order).
namespace {
std::string ckpt_path() {
  const char* p = std::getenv("KILN_DIST_CKPT");
  return p ? p : "zero_ckpt.safetensors";
}
}  // namespace

TEST_CASE("ZeRO-1 checkpoint: written by N ranks", "[zero-write]") {
  const ModelConfig c = mha_config();
  nn::GPT<Cpu> model(c);
  model.init_weights(21);
  dist::DistributedDataParallel<Cpu> ddp(model);
  dist::ZeroOptimizer<Cpu> opt(model.named_parameters(), adam());
  for (int64_t s = 0; s < 3; ++s) {
    opt.zero_grad();
    lm_loss(model, dist::local_rows(batch(s, 8, c.vocab_size))).backward();
    optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
  }
  const auto state = opt.state_dict();  // collective
  if (dist::is_main_process()) {
    std::vector<std::pair<std::string, Tensor<Cpu>>> ts;
    for (auto& [n, v] : model.state_dict()) ts.emplace_back("model." + n, v);
    for (auto& [n, v] : state) ts.emplace_back("optim." + n, v);
    safetensors::save<Cpu>(ckpt_path(), ts, {{"world_size", std::to_string(dist::world_size())}});
  }
  dist::barrier();
}

TEST_CASE("ZeRO-1 checkpoint: resumed by one process with optim::Adam and with ZeroOptimizer", "[zero-resume]") {
  REQUIRE(dist::world_size() == 1);
  const ModelConfig c = mha_config();
  const Result want = train_single(c, 6, 8, 21);
  const auto f = safetensors::File::open(ckpt_path());
  for (const bool zero : {false, true}) {
    nn::GPT<Cpu> model(c);
    std::map<std::string, Tensor<Cpu>> msd, osd;
    for (const auto& n : f.names()) {
      if (n.rfind("model.", 0) == 0)
        msd.emplace(n.substr(6), f.load<Cpu>(n));
      else
        osd.emplace(n.substr(6), f.load<Cpu>(n));
    }
    model.load_state_dict(msd);
    std::unique_ptr<optim::Optimizer<Cpu>> opt;
    if (zero) {
      auto z = std::make_unique<dist::ZeroOptimizer<Cpu>>(model.named_parameters(), adam());
      z->load_state_dict(osd);
      opt = std::move(z);
    } else {
      opt = std::make_unique<optim::Adam<Cpu>>(model.named_parameters(), adam());
      opt->load_state_dict(osd);
    }
    CHECK(opt->step_count() == 3);
    Result got;
    for (int64_t s = 3; s < 6; ++s) {
      opt->zero_grad();
      const Var<Cpu> loss = lm_loss(model, batch(s, 8, c.vocab_size));
      loss.backward();
      optim::clip_grad_norm(model.parameters(), 1.0);
      opt->step();
      got.losses.push_back(item<double>(loss.value()));
    }
    got.weights = weights_of(model);
    Result tail = want;
    tail.losses.erase(tail.losses.begin(), tail.losses.begin() + 3);
    INFO((zero ? "ZeroOptimizer" : "optim::Adam"));
    check_parity(got, tail);
  }
}

namespace {
// A classifier on a deterministic dataset: 60 samples of 8 features, 4 classes.
TensorDataset<Cpu> classes_data() {
  std::vector<float> x(60 * 8);
  std::vector<int64_t> y(60);
  for (int64_t i = 0; i < 60; ++i) {
    for (int64_t j = 0; j < 8; ++j) x[static_cast<size_t>(i * 8 + j)] = static_cast<float>(((i * 13 + j * 7) % 17) - 8) / 8.0f;
    y[static_cast<size_t>(i)] = (i * 5 + i / 7) % 4;
  }
  return TensorDataset<Cpu>(Tensor<Cpu>::from_vector(x, {60, 8}), Tensor<Cpu>::from_vector(y, {60}));
}

struct FitRun {
  FitResult r;
  std::map<std::string, std::vector<double>> weights;
};

// kiln::fit with a sharded DataLoader (world_size ranks) and dist::fit_hooks, or one process.
FitRun fit_classifier(int world_size, int rank, const std::string& ck, int64_t stop_after = -1, const std::string& resume = "") {
  manual_seed(3);  // the initial weights (DDP gives every rank rank 0's anyway)
  nn::Linear<Cpu> model({.in = 8, .out = 4, .bias = true});
  std::unique_ptr<dist::DistributedDataParallel<Cpu>> ddp;
  if (world_size > 1) ddp = std::make_unique<dist::DistributedDataParallel<Cpu>>(model);
  std::unique_ptr<optim::Optimizer<Cpu>> opt;
  if (world_size > 1)
    opt = std::make_unique<dist::ZeroOptimizer<Cpu>>(model.named_parameters(), adam());
  else
    opt = std::make_unique<optim::Adam<Cpu>>(model.named_parameters(), adam());
  // 60 samples in batches of 12 (the last of an epoch: 0 left): 5 batches per epoch; grad_accum 2
  DataLoader train(classes_data(), {.batch_size = 12, .shuffle = true, .seed = 9, .world_size = world_size, .rank = rank});
  DataLoader eval(classes_data(), {.batch_size = 20, .shuffle = false});
  FitOptions o{.epochs = 3,
               .grad_accum = 2,
               .grad_clip = 1.0,
               .eval_every = 3,
               .checkpoint_path = ck,
               .resume_path = resume,
               .progress = 0,
               .stop_after = stop_after,
               .handle_signals = false};
  if (ddp) o.hooks = dist::fit_hooks(*ddp);
  FitRun out;
  out.r = fit(
      model, *opt, train, eval,
      [&](const std::pair<Tensor<Cpu>, Tensor<Cpu>>& b) { return nn::cross_entropy(model.forward(Var<Cpu>(b.first)), b.second); }, o);
  out.weights = weights_of(model);
  return out;
}
}  // namespace

TEST_CASE("DataLoader with world_size: each rank its contiguous share of every global batch", "[ddp]") {
  const int N = dist::world_size(), r = dist::rank();
  for (bool drop_last : {false, true}) {
    const int64_t n = drop_last ? 61 : 60;  // 61 with drop_last: the short batch of 1 is dropped
    std::vector<int64_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i;
    const Tensor<Cpu> idx = Tensor<Cpu>::from_vector(ids, {n});
    DataLoader whole(TensorDataset<Cpu>(idx, idx), {.batch_size = 6 * N, .shuffle = true, .drop_last = drop_last, .seed = 4});
    DataLoader mine(TensorDataset<Cpu>(idx, idx),
                    {.batch_size = 6 * N, .shuffle = true, .drop_last = drop_last, .seed = 4, .world_size = N, .rank = r});
    REQUIRE(mine.batches_per_epoch() == whole.batches_per_epoch());
    for (int e = 0; e < 2; ++e) {
      for (auto b = mine.next(); b; b = mine.next()) {
        const auto w = whole.next();
        REQUIRE(w.has_value());
        const int64_t k = w->first.size(0) / N;
        REQUIRE(b->first.size(0) == k);
        CHECK(to_vector<int64_t>(b->first) == to_vector<int64_t>(w->first.narrow(0, r * k, k)));
        CHECK(to_vector<int64_t>(dist::all_gather(b->first).reshape({-1})) == to_vector<int64_t>(w->first));
      }
      REQUIRE(!whole.next());  // the end of its epoch too
    }
  }
  const Tensor<Cpu> t = Tensor<Cpu>::zeros({10, 1});
  CHECK_THROWS_WITH(DataLoader(TensorDataset<Cpu>(t, t), {.batch_size = 3, .world_size = 2, .rank = 0}),
                    Catch::Contains("batch_size 3") && Catch::Contains("2 ranks"));
  const Tensor<Cpu> t9 = Tensor<Cpu>::zeros({9, 1});  // batches of 4, 4 and 1: the last does not divide
  CHECK_THROWS_WITH(DataLoader(TensorDataset<Cpu>(t9, t9), {.batch_size = 4, .world_size = 2, .rank = 0}),
                    Catch::Contains("last batch") && Catch::Contains("drop_last"));
  CHECK_NOTHROW(DataLoader(TensorDataset<Cpu>(t9, t9), {.batch_size = 4, .drop_last = true, .world_size = 2, .rank = 0}));
  CHECK_THROWS_WITH(DataLoader(TensorDataset<Cpu>(t, t), {.batch_size = 4, .world_size = 2, .rank = 2}), Catch::Contains("rank 2"));
}

TEST_CASE("fit with dist::fit_hooks: N ranks (sharded DataLoader, ZeRO-1, grad_accum 2) = 1 process; resumed = uninterrupted", "[ddp]") {
  const std::string dir = std::getenv("KILN_DIST_CKPT") ? std::string(std::getenv("KILN_DIST_CKPT")) + ".fit" : "dist_fit";
  FitRun one;
  if (dist::rank() == 0) one = fit_classifier(1, 0, "");
  // every rank needs the one-process result: rank 0 computed it alone (no collective inside), so broadcast
  std::vector<double> losses(9, 0.0);
  if (dist::rank() == 0) losses = one.r.losses;
  REQUIRE(losses.size() == 9);  // 3 epochs x ceil(5 / 2) steps
  const Tensor<Cpu> lt = Tensor<Cpu>::from_vector(losses, {9});
  dist::broadcast(lt, 0);
  losses = to_vector<double>(lt);

  const FitRun par = fit_classifier(dist::world_size(), dist::rank(), dir + ".a.safetensors");
  REQUIRE(par.r.losses.size() == losses.size());
  for (size_t s = 0; s < losses.size(); ++s) CHECK(par.r.losses[s] == Approx(losses[s]).epsilon(1e-5));
  if (dist::rank() == 0) {
    CHECK(par.r.eval_losses.size() == 3);  // rank 0 evaluates after steps 2, 5 and 8
    for (const auto& [name, w] : one.weights) {
      const auto& g = par.weights.at(name);
      for (size_t i = 0; i < w.size(); ++i) CHECK(g[i] == Approx(w[i]).epsilon(1e-4).margin(1e-6));
    }
  } else {
    CHECK(par.r.eval_losses.empty());
  }
  for (const auto& [name, w] : par.weights) {  // the same bits on every rank
    const Tensor<Cpu> hi = Tensor<Cpu>::from_vector(w, {static_cast<int64_t>(w.size())}), lo = hi.clone();
    dist::all_reduce(hi, dist::ReduceOp::max);
    dist::all_reduce(lo, dist::ReduceOp::min);
    CHECK(to_vector<double>(hi) == to_vector<double>(lo));
  }
  // stopped after 4 steps (mid-epoch), resumed: the same losses and weights, bit for bit
  const std::string ck = dir + ".b.safetensors";
  const FitRun a = fit_classifier(dist::world_size(), dist::rank(), ck, 4);
  CHECK(a.r.stopped);
  const FitRun b = fit_classifier(dist::world_size(), dist::rank(), ck, -1, ck);
  CHECK(b.r.start_step == 4);
  std::vector<double> both = a.r.losses;
  both.insert(both.end(), b.r.losses.begin(), b.r.losses.end());
  CHECK(both == par.r.losses);
  CHECK(b.weights == par.weights);
}

// A time limit under DDP: rank 0 alone evaluates (every 5 steps, before the plan too) and its clock
// decides, yet every rank must time the same steps, plan the same total and stop after the same step,
// or their collectives would no longer pair up. The ranks' steps take different times (sleeps).
TEST_CASE("fit with dist::fit_hooks and a time limit: every rank plans the same total and stops after the same step", "[ddp]") {
  manual_seed(3);
  nn::Linear<Cpu> model({.in = 8, .out = 4, .bias = true});
  dist::DistributedDataParallel<Cpu> ddp(model);
  optim::Adam<Cpu> opt(model.named_parameters(), adam());
  DataLoader train(classes_data(), {.batch_size = 12, .shuffle = true, .seed = 9, .world_size = dist::world_size(), .rank = dist::rank()});
  DataLoader eval(classes_data(), {.batch_size = 20, .shuffle = false});
  FitOptions o{.steps = 1000, .eval_every = 5, .progress = 0, .time_limit_s = 1.0, .handle_signals = false};
  o.hooks = dist::fit_hooks(ddp);
  o.schedule = {.name = "cosine", .warmup_steps = 5};
  const FitResult r = fit(
      model, opt, train, eval,
      [&](const std::pair<Tensor<Cpu>, Tensor<Cpu>>& b) {
        if (model.is_training()) std::this_thread::sleep_for(std::chrono::milliseconds(dist::rank() == 1 ? 8 : 4));
        return nn::cross_entropy(model.forward(Var<Cpu>(b.first)), b.second);
      },
      o);
  INFO("rank " << dist::rank() << ": planned " << r.planned_steps << ", done " << r.steps_done << ", out of time " << r.out_of_time);
  CHECK(r.planned_steps > kTimePlanSkip + kTimePlanSteps);  // 1,000 steps of 8 ms do not fit 1 s
  CHECK(r.steps_done < 1000);
  CHECK(r.eval_losses.empty() == (dist::rank() != 0));
  const Tensor<Cpu> hi = Tensor<Cpu>::from_vector(std::vector<double>{static_cast<double>(r.planned_steps),
                                                                      static_cast<double>(r.steps_done), r.out_of_time ? 1.0 : 0.0},
                                                  {3}),
                    lo = hi.clone();
  dist::all_reduce(hi, dist::ReduceOp::max);
  dist::all_reduce(lo, dist::ReduceOp::min);
  CHECK(to_vector<double>(hi) == to_vector<double>(lo));  // the same plan, the same last step, on every rank
}

namespace {

// BatchNorm on the input, then a Linear: the running statistics depend on the data alone, so a lone
// BatchNorm1d fed the same batches is their reference, bit for bit.
class NormedLinear : public nn::Module<Cpu> {
 public:
  NormedLinear() {
    bn_ = this->register_module("bn", std::make_shared<nn::BatchNorm1d<Cpu>>(nn::BatchNormOptions{.num_features = 4}));
    lin_ = this->register_module("lin", std::make_shared<nn::Linear<Cpu>>(nn::LinearOptions{.in = 4, .out = 1, .bias = true}));
  }
  Var<Cpu> forward(const Var<Cpu>& x) const { return (*lin_)((*bn_)(x)); }
  const nn::BatchNorm1d<Cpu>& bn() const { return *bn_; }

 private:
  std::shared_ptr<nn::BatchNorm1d<Cpu>> bn_;
  std::shared_ptr<nn::Linear<Cpu>> lin_;
};

// Rank r's micro-batch j of step s: [6, 4], different on every rank.
Tensor<Cpu> bn_batch(int r, int64_t s, int64_t j) {
  std::vector<float> v(24);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>((static_cast<int64_t>(i) * 13 + r * 29 + s * 7 + j * 3) % 17) * 0.25f - 1.5f + static_cast<float>(r);
  return Tensor<Cpu>::from_vector(v, {6, 4});
}

struct BnState {
  std::vector<float> mean, var;
  int64_t count = 0;
  bool operator==(const BnState&) const = default;
};
BnState state_of(const nn::BatchNorm<Cpu>& bn) {
  return {to_vector<float>(bn.running_mean()), to_vector<float>(bn.running_var()), item<int64_t>(bn.num_batches_tracked())};
}

// 3 steps of 2 micro-batches (the first under no_sync); each rank its own data. Returns the model's
// running statistics, and those of lone BatchNorms fed rank 0's batches and this rank's.
struct BnRun {
  BnState got, rank0, own;
};
BnRun train_bn(bool broadcast_buffers) {
  const int r = dist::rank();
  NormedLinear model;
  dist::DistributedDataParallel<Cpu> ddp(model, {.broadcast_buffers = broadcast_buffers});
  nn::BatchNorm1d<Cpu> rank0({.num_features = 4}), own({.num_features = 4});
  for (int64_t s = 0; s < 3; ++s) {
    model.zero_grad();
    for (int64_t j = 0; j < 2; ++j) {
      {
        const NoGrad ng;
        rank0(Var<Cpu>(bn_batch(0, s, j)));
        own(Var<Cpu>(bn_batch(r, s, j)));
      }
      const Var<Cpu> x(bn_batch(r, s, j));
      if (j == 0) {
        const auto guard = ddp.no_sync();
        model.forward(x).square().mean().backward();
      } else {
        model.forward(x).square().mean().backward();
      }
    }
  }
  return {state_of(model.bn()), state_of(rank0), state_of(own)};
}

}  // namespace

TEST_CASE("DDP broadcast_buffers: BatchNorm running statistics are rank 0's on every rank after each step; off: each rank's own", "[ddp]") {
  const int r = dist::rank();
  const BnRun on = train_bn(true);
  CHECK(on.rank0.count == 6);
  CHECK(on.got == on.rank0);                    // bit for bit, on every rank
  if (r != 0) CHECK_FALSE(on.own == on.rank0);  // the ranks' data differ: the check above is not vacuous
  const BnRun off = train_bn(false);
  CHECK(off.got == off.own);
  if (r != 0) CHECK_FALSE(off.got == off.rank0);
}

#if defined(KILN_HAVE_CUDA_BACKEND)
// Tensor<Cuda> across processes: the buckets go over NCCL (on the emulated device, its stand-in moves
// the bytes with MPI). Every rank's averaged gradients must be those of one Cpu process on the whole
// batch, up to the two backends' rounding.
TEST_CASE("DDP on Cuda: gradients averaged over NCCL = one process on the whole batch", "[cuda-ddp]") {
  const ModelConfig c = mha_config();
  const int N = dist::world_size();
  const int64_t B = 2 * N;
  nn::GPT<Cpu> ref(c);
  ref.init_weights(11);
  lm_loss(ref, batch(0, B, c.vocab_size)).backward();

  auto to_cuda = [](const Tensor<Cpu>& t) { return Tensor<Cuda>::from_vector(to_vector<double>(t), t.shape()).to(t.dtype()); };
  nn::GPT<Cuda> model(c);
  std::map<std::string, Tensor<Cuda>> sd;
  for (const auto& [n, t] : ref.state_dict()) sd.emplace(n, to_cuda(t));
  if (dist::rank() == 0) model.load_state_dict(sd);  // the other ranks get rank 0's weights from DDP
  dist::DistributedDataParallel<Cuda> ddp(model, {.bucket_mb = 0.02, .first_bucket_mb = 0.01});
  const Tensor<Cuda> rows = to_cuda(dist::local_rows(batch(0, B, c.vocab_size)));
  const Tensor<Cuda> x = rows.narrow(1, 0, kT).contiguous(), y = rows.narrow(1, 1, kT).contiguous();
  nn::cross_entropy(model.forward(x).reshape({-1, c.vocab_size}), y.reshape({-1})).backward();
  CHECK(ddp.stats().rounds == 1);

  const auto want = ref.named_parameters();
  const auto got = model.named_parameters();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(got[i].first);
    REQUIRE(got[i].second.grad().defined());
    const auto g = to_vector<double>(got[i].second.grad()), w = to_vector<double>(want[i].second.grad());
    double d2 = 0, n2 = 0;
    for (size_t k = 0; k < w.size(); ++k) {
      d2 += (g[k] - w[k]) * (g[k] - w[k]);
      n2 += w[k] * w[k];
    }
    CHECK(std::sqrt(d2) <= 1e-4 * std::sqrt(n2) + 1e-9);
  }
}
#endif
