// A backend whose fused override does not match its Has* concept must not compile
// (core/fused_overrides.hpp). Built by tests/house/CMakeLists.txt once per KILN_CASE:
//   0: overrides with the right signatures (compiles: the control)
//   1: rope without its `bool inverse`                  -> "rope does not match HasRope"
//   2: cross_entropy_backward without the smoothing     -> "... do not match HasCrossEntropy"
//   3: conv2d_forward returning void instead of bool    -> "... do not match HasConv2d"
//   4: sum_squares taking one View instead of a vector  -> "sum_squares does not match HasSumSquares"
#include "kiln/backends/cpu/cpu.hpp"
#include "kiln/core/fused_overrides.hpp"

namespace {
using S = kiln::Cpu::Storage;
using MV = kiln::MutView<S>;
using V = kiln::View<S>;

struct Toy {
  using Storage = S;
#if KILN_CASE == 0
  static void rope(MV, V, V, V, bool);
  static void cross_entropy_forward(MV, MV, V, V, int64_t, double);
  static void cross_entropy_backward(MV, V, V, V, V, int64_t, double);
  static bool conv2d_forward(MV, V, V, const V*, const kiln::Conv2dParams&);
  static bool conv2d_backward_input(MV, V, V, const kiln::Conv2dParams&);
  static bool conv2d_backward_weight(MV, MV*, V, V, const kiln::Conv2dParams&);
  static void sum_squares(MV, const std::vector<V>&);
#elif KILN_CASE == 1
  static void rope(MV, V, V, V);
#elif KILN_CASE == 2
  static void cross_entropy_forward(MV, MV, V, V, int64_t, double);
  static void cross_entropy_backward(MV, V, V, V, V, int64_t);
#elif KILN_CASE == 3
  static void conv2d_forward(MV, V, V, const V*, const kiln::Conv2dParams&);
  static bool conv2d_backward_input(MV, V, V, const kiln::Conv2dParams&);
  static bool conv2d_backward_weight(MV, MV*, V, V, const kiln::Conv2dParams&);
#elif KILN_CASE == 4
  static void sum_squares(MV, V);
#endif
};
}  // namespace

static_assert(kiln::fused::overrides_checked<Toy>());
#if KILN_CASE == 0
static_assert(kiln::fused::HasRope<Toy> && kiln::fused::HasCrossEntropy<Toy> && kiln::fused::HasConv2d<Toy> &&
              kiln::fused::HasSumSquares<Toy>);
#endif
