#pragma once
// The one-line runtime switch between backends:
//   kiln::dispatch(device, [&]<kiln::Backend B>() { train<B>(cfg); });
// device: "cpu", "reference" (the slow oracle), or "cuda" (when built with the CUDA backend).
#include <string_view>

#include "backends/backends.hpp"

namespace kiln {

template <class F> decltype(auto) dispatch(std::string_view device, F&& f) {
  if (device == "cpu") return f.template operator()<Cpu>();
  if (device == "reference") return f.template operator()<Reference>();
  if (device == "cuda") fail("device 'cuda': this kiln was built without the CUDA backend (configure with -DKILN_WITH_CUDA=ON)");
  fail("unknown device '{}' (valid: cpu, reference, cuda)", device);
}

}  // namespace kiln
