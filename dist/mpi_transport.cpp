// The host transport of kiln::dist: MPI on host memory, for every backend whose Storage is HostStorage
// (dist/detail.hpp: detail::Transport, detail::mpi_start). The buffers arrive contiguous and in the
// wire dtype (the collectives stage them, dist/collectives.cpp); counts beyond one MPI call's int are
// split into several calls where the collective allows (all_reduce, broadcast).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kiln/dist/mpi.hpp"

namespace kiln::dist::detail {

namespace {
#if defined(KILN_HAVE_MPI)
// A started MPI operation: requests, then `finish` (on the host: the data is already in place).
struct MpiWork final : Work::Impl {
  std::vector<MPI_Request> reqs;
  std::function<void()> finish;
  std::vector<std::shared_ptr<const void>> keep;
  std::string what;
  bool failed = false;

  bool test() override {
    if (done) return true;
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), what.c_str(), "MPI_Testall");
    if (flag) complete();
    return done;
  }
  void wait() override {
    if (done) return;
    const double limit = timeout_s();
    if (limit <= 0) {
      check_mpi(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), what.c_str(), "MPI_Waitall");
      complete();
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    while (!test()) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit) {
        failed = true;
        fail("{}: not complete after {} s on rank {} of {}: a peer is stuck or gone (the limit: InitOptions::timeout_s, KILN_DIST_TIMEOUT)",
             what, limit, group_rank(), group_size());
      }
    }
  }
  void complete() {
    done = true;
    if (finish) finish();
    keep.clear();
  }
  ~MpiWork() override {
    if (done) return;
    if (failed) {  // MPI may still write into these buffers: never free them
      new std::vector<std::shared_ptr<const void>>(std::move(keep));
      return;
    }
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kiln::dist: %s\n", e.what());
    }
  }
};
#endif

struct DoneWork final : Work::Impl {
  DoneWork() { done = true; }
  bool test() override { return true; }
  void wait() override {}
};
}  // namespace

#if defined(KILN_HAVE_MPI)
std::shared_ptr<Work::Impl> mpi_start(const WireCall& c, std::function<void()> finish, std::vector<std::shared_ptr<const void>> keep,
                                      bool blocking) {
  char* p = static_cast<char*>(c.recv);
  const int64_t n = c.count;
  const auto es = static_cast<int64_t>(dtype_size(c.dtype));
  switch (c.coll) {
    case Coll::all_reduce: {
      if (blocking) {
        const Watched wd(c.what);
        for (int64_t off = 0; off < n; off += kMaxCount)
          check_mpi(MPI_Allreduce(MPI_IN_PLACE, p + off * es, static_cast<int>(std::min(kMaxCount, n - off)), mpi_reduce_type(c.dtype),
                                  mpi_op(c.op, c.dtype), comm()),
                    c.what, "MPI_Allreduce");
        break;
      }
      auto w = std::make_shared<MpiWork>();
      w->what = c.what;
      for (int64_t off = 0; off < n || (off == 0 && n == 0); off += kMaxCount) {
        MPI_Request r;
        check_mpi(MPI_Iallreduce(MPI_IN_PLACE, p + off * es, static_cast<int>(std::min(kMaxCount, n - off)), mpi_reduce_type(c.dtype),
                                 mpi_op(c.op, c.dtype), comm(), &r),
                  c.what, "MPI_Iallreduce");
        w->reqs.push_back(r);
        if (n == 0) break;
      }
      w->finish = std::move(finish);
      w->keep = std::move(keep);
      return w;
    }
    case Coll::broadcast: {
      const Watched wd(c.what);
      for (int64_t off = 0; off < n; off += kMaxCount)
        check_mpi(MPI_Bcast(p + off * es, static_cast<int>(std::min(kMaxCount, n - off)), mpi_bits_type(c.dtype), c.root, comm()), c.what,
                  "MPI_Bcast");
      break;
    }
    case Coll::all_gather: {
      const MPI_Datatype ty = mpi_bits_type(c.dtype);
      const Watched wd(c.what);
      check_mpi(MPI_Allgather(c.send, static_cast<int>(n), ty, c.recv, static_cast<int>(n), ty, comm()), c.what, "MPI_Allgather");
      break;
    }
    case Coll::reduce_scatter: {
      const Watched wd(c.what);
      check_mpi(MPI_Reduce_scatter_block(c.send, c.recv, static_cast<int>(n), mpi_reduce_type(c.dtype), mpi_op(c.op, c.dtype), comm()),
                c.what, "MPI_Reduce_scatter_block");
      break;
    }
  }
  finish();
  return std::make_shared<DoneWork>();
}
#else
std::shared_ptr<Work::Impl> mpi_start(const WireCall& c, std::function<void()>, std::vector<std::shared_ptr<const void>>, bool) {
  if (c.coll == Coll::all_reduce) fail("dist: no MPI in this build");
  return std::make_shared<DoneWork>();  // a group of one never gets here; without MPI there is no other
}
#endif

}  // namespace kiln::dist::detail
