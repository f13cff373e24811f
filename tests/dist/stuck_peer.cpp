// A peer that is stuck without dying (tests/dist/stuck_peer.sh). Rank 1 sleeps through a blocking
// collective that rank 0 waits in; under KILN_DIST_TIMEOUT=2 rank 0's watchdog names the op and the rank
// and ends the job (MPI_Abort) long before rank 1 wakes. (Were the wait to raise a kiln::Error
// instead, the catch below reports it and exits 1, which ends the job too.)
//   stuck_peer OP CHECK    OP: all_reduce, broadcast, all_gather, reduce_scatter, barrier, scalars;
//                          CHECK: on|off, the consistency check (on: the wait is in its exchange)
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include <kiln/backends/cpu/cpu.hpp>
#include <kiln/dist/process_group.hpp>

using namespace kiln;

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const std::string op = argv[1];
  dist::init();
  dist::set_consistency_check(std::strcmp(argv[2], "on") == 0);
  if (dist::world_size() != 2) return 2;
  if (dist::rank() == 1) {  // stuck: alive, never calling
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    const Tensor<Cpu> t = Tensor<Cpu>::ones({2, 3}, DType::f32);
    if (op == "all_reduce")
      dist::all_reduce(t);
    else if (op == "broadcast")
      dist::broadcast(t, 1);  // from the stuck rank (a root may finish an eager send alone)
    else if (op == "all_gather")
      (void)dist::all_gather(t);
    else if (op == "reduce_scatter")
      (void)dist::reduce_scatter(t);
    else if (op == "barrier")
      dist::barrier();
    else if (op == "scalars") {
      std::vector<double> xs{1.0, 2.0};
      dist::all_reduce_scalars(xs);
    } else {
      return 2;
    }
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "stuck_peer: rank 0 gave up after %.1f s: %s\n", s, e.what());
    return 1;
  }
  std::printf("stuck_peer: rank 0 completed %s with its peer asleep, which it cannot\n", op.c_str());
  return 0;
}
