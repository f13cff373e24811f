// kiln::dist's consistency check (dist/detail.hpp, detail::agree): before a collective moves data, the
// ranks compare what each was given (op, dtype, shape, root or reduction) in one small MPI_Allreduce,
// so a mismatch or a rank whose own checks failed raises a kiln::Error on every rank instead of a hang
// or a silent wrong result. InitOptions::consistency_check / set_consistency_check turn it off.
#include <algorithm>
#include <string>
#include <vector>

#include "kiln/dist/mpi.hpp"

namespace kiln::dist::detail {

#if defined(KILN_HAVE_MPI)
namespace {  // what the ranks compare, and how a rank's part reads in the error (MPI builds only)
const char* kind_name(int64_t k) {
  static const char* names[] = {"?", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "all_reduce_async"};
  return k >= 1 && k <= 6 ? names[k] : "?";
}
constexpr int kShapeSlots = 6;
constexpr int kSig = 6 + kShapeSlots;  // kind, dtype, numel, arg, bad, ndim, shape...

std::string describe(const int64_t* v) {
  const auto kind = v[0];
  std::string s = kind_name(kind);
  if (kind == static_cast<int64_t>(Kind::barrier)) return s;
  s += fmt::format(" {} [", static_cast<DType>(v[1]));
  const int64_t nd = v[5];
  for (int64_t i = 0; i < std::min<int64_t>(nd, kShapeSlots); ++i) s += fmt::format("{}{}", i ? ", " : "", v[6 + i]);
  if (nd > kShapeSlots) s += ", ...";
  s += fmt::format("] ({} elements)", v[2]);
  if (kind == static_cast<int64_t>(Kind::broadcast))
    s += fmt::format(" root {}", v[3]);
  else if (kind == static_cast<int64_t>(Kind::all_reduce) || kind == static_cast<int64_t>(Kind::all_reduce_async) ||
           kind == static_cast<int64_t>(Kind::reduce_scatter))
    s += fmt::format(" {}", reduce_op_name(static_cast<ReduceOp>(v[3])));
  return s;
}

}  // namespace
#endif

// Every rank passes what it was given; a difference, or a rank whose own checks failed, raises on
// every rank. Off (or a group of one): only this rank's own error.

void agree(const char* op, Kind kind, DType d, int64_t numel, int64_t arg, const Shape& shape, const std::string& local_error) {
#if defined(KILN_HAVE_MPI)
  const int size = group_size();
  if (consistency_check() && size > 1) {
    int64_t v[kSig] = {};
    v[0] = static_cast<int64_t>(kind);
    v[1] = static_cast<int64_t>(d);
    v[2] = numel;
    v[3] = arg;
    v[4] = local_error.empty() ? 0 : 1;
    v[5] = static_cast<int64_t>(shape.size());
    for (size_t i = 0; i < shape.size() && i < kShapeSlots; ++i) v[6 + i] = shape[i];
    int64_t mm[2 * kSig];
    for (int i = 0; i < kSig; ++i) {
      mm[i] = v[i];
      mm[kSig + i] = -v[i];
    }
    {
      const Watched w(op);
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, mm, 2 * kSig, MPI_INT64_T, MPI_MAX, comm()), op, "MPI_Allreduce (consistency check)");
    }
    bool same = true;
    for (int i = 0; i < kSig; ++i) same = same && mm[i] == -mm[kSig + i];
    if (same && mm[4] == 0) return;
    std::vector<int64_t> all(static_cast<size_t>(kSig) * static_cast<size_t>(size));
    {
      const Watched w(op);
      check_mpi(MPI_Allgather(v, kSig, MPI_INT64_T, all.data(), kSig, MPI_INT64_T, comm()), op, "MPI_Allgather (consistency check)");
    }
    if (!local_error.empty()) fail("{}", local_error);
    std::string bad, ranks;
    for (int r = 0; r < size; ++r) {
      const int64_t* w = all.data() + static_cast<size_t>(r) * kSig;
      if (w[4]) bad += fmt::format("{}{}", bad.empty() ? "" : ", ", r);
      ranks += fmt::format("{}rank {}: {}", r ? "; " : "", r, describe(w));
    }
    if (!bad.empty())
      fail("{}: rank {} failed its own checks (its message says why); no rank communicates. The ranks called: {}", op, bad, ranks);
    fail("{}: the ranks disagree: {}", op, ranks);
  }
#else
  (void)op, (void)kind, (void)d, (void)numel, (void)arg, (void)shape;
#endif
  if (!local_error.empty()) fail("{}", local_error);
}

}  // namespace kiln::dist::detail
