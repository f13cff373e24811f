// A rank killed mid-step (tests/dist/kill_rank.sh). Each rank trains a small GPT with
// DistributedDataParallel; rank 0 writes a checkpoint after every step; in step 2, rank 1 kills itself
// with SIGKILL from inside backward, while its first gradient buckets are in flight and rank 0 waits
// for them. The job must end within seconds, non-zero, naming rank 1, with the last checkpoint intact.
//   kill_rank CKPT             the job (under mpirun)
//   kill_rank --verify CKPT    reads the checkpoint back (every tensor, finite): exit 0 when intact
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <kiln/dist/ddp.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/optimizer.hpp>

using namespace kiln;

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--verify") == 0) {
    const auto f = safetensors::File::open(argv[2]);
    for (const auto& n : f.names()) {
      const auto v = to_vector<double>(f.load<Cpu>(n));
      for (double x : v)
        if (!std::isfinite(x)) return 1;
    }
    std::printf("checkpoint %s: %zu tensors, intact\n", argv[2], f.names().size());
    return 0;
  }
  if (argc != 2) return 2;
  dist::init();
  ModelConfig c;
  c.vocab_size = 64;
  c.d_model = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.max_seq_len = 32;
  nn::GPT<Cpu> model(c.resolved());
  model.init_weights(1);
  dist::DistributedDataParallel<Cpu> ddp(model, {.bucket_mb = 0.01, .first_bucket_mb = 0.01});
  optim::Adam<Cpu> opt(model.named_parameters(), {.lr = 1e-3});
  int64_t step = 0;
  if (dist::rank() == 1)
    model.parameter("lm_head.weight").register_post_accumulate_hook([&](const Tensor<Cpu>&) {
      if (step == 2) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch());
        std::fprintf(stderr, "kill_rank: rank 1 kills itself (SIGKILL) in backward of step 2 at %lld ms\n",
                     static_cast<long long>(ms.count()));
        std::fflush(stderr);
        std::raise(SIGKILL);
      }
    });
  const std::string path = argv[1];
  for (; step < 5; ++step) {
    opt.zero_grad();
    std::vector<int64_t> ids(8 * 33);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7 + static_cast<size_t>(step) * 13) % 64);
    const Tensor<Cpu> rows = dist::local_rows(Tensor<Cpu>::from_vector(ids, {8, 33}));
    const Tensor<Cpu> x = rows.narrow(1, 0, 32).contiguous(), y = rows.narrow(1, 1, 32).contiguous();
    nn::cross_entropy(model.forward(x).reshape({-1, 64}), y.reshape({-1})).backward();
    opt.step();
    if (dist::is_main_process()) {
      std::vector<std::pair<std::string, Tensor<Cpu>>> ts;
      for (auto& [n, v] : model.state_dict()) ts.emplace_back("model." + n, v);
      for (auto& [n, v] : opt.state_dict()) ts.emplace_back("optim." + n, v);
      safetensors::save<Cpu>(path, ts, {{"step", std::to_string(step + 1)}});  // atomic: temp file, fsync, rename
      std::printf("kill_rank: rank 0 wrote the checkpoint of step %lld\n", static_cast<long long>(step + 1));
      std::fflush(stdout);
    }
  }
  std::printf("kill_rank: rank %d finished, which it must not\n", dist::rank());
  return 0;
}
