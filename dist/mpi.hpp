#pragma once
// kiln::dist's MPI side, shared by dist/process_group.cpp (the group, which defines these),
// dist/mpi_transport.cpp (the host transport) and dist/consistency.cpp. Not a public header (cmake/
// KilnInstall.cmake leaves it out).
#include <climits>
#include <cstdint>

#include "kiln/dist/detail.hpp"  // (and kiln/config.hpp: KILN_HAVE_MPI)

#if defined(KILN_HAVE_MPI)
#include <mpi.h>
#endif

namespace kiln::dist::detail {

#if defined(KILN_HAVE_MPI)
// The group's communicator (a duplicate of MPI_COMM_WORLD), valid between init() and finalize().
MPI_Comm comm();
// A kiln::Error naming op, the MPI call, this rank and MPI's message when rc is not MPI_SUCCESS.
void check_mpi(int rc, const char* op, const char* call);
// Arms the watchdog around one blocking MPI call: past the group's time limit it names the op and
// the rank and ends the job (process_group.cpp).
struct Watched {
  explicit Watched(const char* what);
  ~Watched();
  Watched(const Watched&) = delete;
  Watched& operator=(const Watched&) = delete;
};
MPI_Datatype mpi_reduce_type(DType d);
MPI_Datatype mpi_bits_type(DType d);  // bit-for-bit transfers (broadcast, all_gather)
MPI_Op mpi_op(ReduceOp op, DType d);
constexpr int64_t kMaxCount = INT_MAX;  // elements of one MPI call
#endif

}  // namespace kiln::dist::detail
