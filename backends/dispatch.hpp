#pragma once
// The one-line runtime switch between backends:
//   kiln::dispatch(device, [&]<kiln::Backend B>() { train<B>(cfg); });
// device: "cpu", "reference" (the slow oracle), or "cuda" / "cuda:N" (when built with the CUDA backend).
#include <charconv>
#include <string_view>

#include "kiln/backends/backends.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

template <class F> decltype(auto) dispatch(std::string_view device, F&& f) {
#if !defined(KILN_REFERENCE_ONLY)  // fuzz/'s reduced build has the Reference backend only (backends.hpp)
  if (device == "cpu") return f.template operator()<Cpu>();
#endif
#if defined(KILN_REFERENCE_ONLY) || defined(KILN_HAVE_REFERENCE_BACKEND)
  if (device == "reference") return f.template operator()<Reference>();
#else
  if (device == "reference")
    fail("device 'reference': this kiln was built without the Reference backend (configure with -DKILN_WITH_REFERENCE=ON)");
#endif
#if defined(KILN_HAVE_CUDA_BACKEND)
  if (device == "cuda" || device.starts_with("cuda:")) {
    KILN_CHECK(cuda::available(), "device '{}': no CUDA device ({})", device, cuda::unavailable_reason());
    if (device.size() > 5) {
      int idx = -1;
      const auto r = std::from_chars(device.data() + 5, device.data() + device.size(), idx);
      KILN_CHECK(r.ec == std::errc() && r.ptr == device.data() + device.size(), "unknown device '{}' (valid: cpu, reference, cuda, cuda:N)",
                 device);
      cuda::set_device(idx);
    }
    return f.template operator()<Cuda>();
  }
#else
  if (device == "cuda" || device.starts_with("cuda:"))
    fail("device '{}': this kiln was built without the CUDA backend (configure with -DKILN_WITH_CUDA=ON)", device);
#endif
  fail("unknown device '{}' (valid: cpu, reference, cuda, cuda:N)", device);
}

}  // namespace kiln
#pragma GCC visibility pop
