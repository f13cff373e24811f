#include "kiln/nn/init.hpp"

#include <cmath>

namespace kiln::nn::init {

std::pair<int64_t, int64_t> fans(const Shape& s, const char* op) {
  KILN_CHECK(s.size() >= 2, "{}: needs a tensor of rank >= 2 to compute fan-in/fan-out, got {}", op, shape_str(s));
  int64_t receptive = 1;
  for (size_t i = 2; i < s.size(); ++i) receptive *= s[i];
  return {s[1] * receptive, s[0] * receptive};
}

namespace {
template <Backend B> Tensor<B> data(Var<B>& p) { return p.value(); }  // a handle sharing the storage
thread_local int skip_depth = 0;
// Under SkipInit: consume what the draw would have consumed, and tell the caller to stop.
template <Backend B> bool skipped(const Var<B>& p, Generator* gen) {
  if (skip_depth == 0) return false;
  (gen ? *gen : default_generator()).advance(static_cast<uint64_t>(p.value().numel()));
  return true;
}
}  // namespace

SkipInit::SkipInit() { ++skip_depth; }
SkipInit::~SkipInit() { --skip_depth; }
bool SkipInit::active() { return skip_depth > 0; }

template <Backend B> void normal_(Var<B>& p, double mean, double std, Generator* gen) {
  if (skipped(p, gen)) return;
  NoGrad ng;
  data(p).normal_(mean, std, gen);
}
template <Backend B> void uniform_(Var<B>& p, double lo, double hi, Generator* gen) {
  if (skipped(p, gen)) return;
  NoGrad ng;
  data(p).uniform_(lo, hi, gen);
}
template <Backend B> void constant_(Var<B>& p, double value) {
  if (SkipInit::active()) return;
  NoGrad ng;
  data(p).fill_(value);
}
template <Backend B> void kaiming_uniform_(Var<B>& p, double a, Generator* gen) {
  const auto [fin, fout] = fans(p.shape(), "kaiming_uniform_");
  const double bound = std::sqrt(2.0 / (1.0 + a * a)) * std::sqrt(3.0 / static_cast<double>(fin));
  uniform_(p, -bound, bound, gen);
}
template <Backend B> void kaiming_normal_(Var<B>& p, double a, Generator* gen) {
  const auto [fin, fout] = fans(p.shape(), "kaiming_normal_");
  normal_(p, 0.0, std::sqrt(2.0 / (1.0 + a * a)) / std::sqrt(static_cast<double>(fin)), gen);
}
template <Backend B> void xavier_uniform_(Var<B>& p, double gain, Generator* gen) {
  const auto [fin, fout] = fans(p.shape(), "xavier_uniform_");
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fin + fout));
  uniform_(p, -bound, bound, gen);
}
template <Backend B> void xavier_normal_(Var<B>& p, double gain, Generator* gen) {
  const auto [fin, fout] = fans(p.shape(), "xavier_normal_");
  normal_(p, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fin + fout)), gen);
}

#define KILN_INST(B)                                              \
  template void normal_<B>(Var<B>&, double, double, Generator*);  \
  template void uniform_<B>(Var<B>&, double, double, Generator*); \
  template void constant_<B>(Var<B>&, double);                    \
  template void kaiming_uniform_<B>(Var<B>&, double, Generator*); \
  template void kaiming_normal_<B>(Var<B>&, double, Generator*);  \
  template void xavier_uniform_<B>(Var<B>&, double, Generator*);  \
  template void xavier_normal_<B>(Var<B>&, double, Generator*);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn::init
