#pragma once
// Initialisers, in place on a parameter's value, drawing from a Philox generator (the thread's
// default when none is given) so the same seed gives the same model on every backend.
// fan_in/fan_out follow PyTorch: for a weight [out, in, ...], fan_in = in·receptive, fan_out = out·receptive.
#include "kiln/autograd/var.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn::init {

template <Backend B> KILN_API void normal_(Var<B>& p, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
template <Backend B> KILN_API void uniform_(Var<B>& p, double lo = 0.0, double hi = 1.0, Generator* gen = nullptr);
template <Backend B> KILN_API void constant_(Var<B>& p, double value);
template <Backend B> void zeros_(Var<B>& p) { constant_(p, 0.0); }
template <Backend B> void ones_(Var<B>& p) { constant_(p, 1.0); }
// Kaiming (He): uniform with bound gain·sqrt(3/fan_in), gain = sqrt(2/(1+a²)) (leaky ReLU slope a).
template <Backend B> KILN_API void kaiming_uniform_(Var<B>& p, double a = 0.0, Generator* gen = nullptr);
template <Backend B> KILN_API void kaiming_normal_(Var<B>& p, double a = 0.0, Generator* gen = nullptr);
// Xavier (Glorot): uniform bound gain·sqrt(6/(fan_in+fan_out)); normal std gain·sqrt(2/(fan_in+fan_out)).
template <Backend B> KILN_API void xavier_uniform_(Var<B>& p, double gain = 1.0, Generator* gen = nullptr);
template <Backend B> KILN_API void xavier_normal_(Var<B>& p, double gain = 1.0, Generator* gen = nullptr);

// While a SkipInit lives on this thread, the initialisers above leave the values as they are and only
// advance the generator they would have drawn from by as much as they would have drawn, so everything
// drawn afterwards (LoRA adapters, dropout, sampling) is what it would have been. For building a model
// whose every parameter is then loaded: kiln::load_gpt and hf::load_causal_lm use it (at 150M
// parameters the random fill took most of the load). Nests; the values left are unspecified.
class KILN_API SkipInit {
 public:
  SkipInit();
  ~SkipInit();
  SkipInit(const SkipInit&) = delete;
  SkipInit& operator=(const SkipInit&) = delete;
  static bool active();
};

// (fan_in, fan_out) of a shape; throws for rank < 2.
std::pair<int64_t, int64_t> fans(const Shape& shape, const char* op);

}  // namespace kiln::nn::init
#pragma GCC visibility pop
