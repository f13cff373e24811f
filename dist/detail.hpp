#pragma once
// kiln::dist's insides shared by dist/*.cpp and dist/cuda/nccl.cpp. Not a public header (cmake/
// KilnInstall.cmake leaves it out); it names neither MPI nor NCCL.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backends/backends.hpp"
#include "kiln/dist/process_group.hpp"

#pragma GCC visibility push(default)
namespace kiln::dist {

// The backend of the group's own host-side values (scalars, hashes, flags): Cpu, or Reference in
// fuzz/'s reduced build, which has no other (backends/backends.hpp, KILN_REFERENCE_ONLY).
#if defined(KILN_REFERENCE_ONLY)
using HostValues = Reference;
#else
using HostValues = Cpu;
#endif

struct Work::Impl {
  virtual ~Impl() = default;
  virtual bool test() = 0;  // advances it; true once complete and finished (the result is in place)
  virtual void wait() = 0;  // completes and finishes it, or raises
  bool done = false;
};

namespace detail {

// The group, checked started: "<op>: the process group is not initialised ...".
void require_init(const char* op);
int group_rank();
int group_size();
double timeout_s();
// Sends n bytes from root to every rank over MPI (the Cuda side: NCCL's unique id).
void broadcast_bytes(void* data, size_t n, int root, const char* op);
// Runs at finalize(), before MPI is finalised (NCCL communicators).
void at_shutdown(std::function<void()> fn);

// The Cuda transport (dist/cuda/nccl.cpp, built with the Cuda backend): NCCL on raw device pointers of
// `device`, on the communication stream, ordered after what the device's stream queued so far. dtype
// is f32, f64, i32, i64 or bool (dist's staging turns bf16/f16 into f32); op is sum, max or min. The
// Work completes when the NCCL op has (test: its event; wait: the device stream waits for it, the host
// does not), then runs `finish` (queued on the device stream). `keep` holds the buffers until then.
enum class NcclColl { all_reduce, broadcast, all_gather, reduce_scatter };
struct NcclCall {
  NcclColl coll = NcclColl::all_reduce;
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t count = 0;  // elements: all_reduce/broadcast the tensor; all_gather/reduce_scatter per rank
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  int device = 0;
  const char* what = "";
};
std::shared_ptr<Work::Impl> nccl_start(const NcclCall& c, std::function<void()> finish, std::vector<std::shared_ptr<const void>> keep);

}  // namespace detail
}  // namespace kiln::dist
#pragma GCC visibility pop
