// safetensors::File (formats/safetensors.cpp): open, names, metadata, every tensor loaded; then the
// round trip: what was read, saved again, reads back with the same names, metadata and bytes.
#include <kiln/backends/reference/reference.hpp>
#include <kiln/formats/safetensors.hpp>

#include "fuzz.hpp"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::file(data, size);
  try {
    const auto f = safetensors::File::open(path);
    std::vector<std::pair<std::string, Tensor<Reference>>> all;
    for (const std::string& name : f.names()) {
      const auto& info = f.info(name);
      all.emplace_back(name, f.load<Reference>(name));
      KILN_FUZZ_ASSERT(all.back().second.shape() == info.shape && all.back().second.dtype() == info.dtype, "'{}' loads as declared", name);
    }
    const std::string out = path + ".rt";
    safetensors::save<Reference>(out, all, f.metadata());
    const auto g = safetensors::File::open(out);
    KILN_FUZZ_ASSERT(g.names() == f.names() && g.metadata() == f.metadata(), "round trip keeps names and metadata");
    for (const auto& [name, t] : all) {
      const Tensor<Reference> u = g.load<Reference>(name);
      const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
      std::vector<unsigned char> a(bytes), b(bytes);
      KILN_FUZZ_ASSERT(u.dtype() == t.dtype() && u.shape() == t.shape(), "round trip keeps '{}''s dtype and shape", name);
      if (bytes) {
        t.copy_to_host(a.data(), bytes);
        u.copy_to_host(b.data(), bytes);
      }
      KILN_FUZZ_ASSERT(a == b, "round trip keeps the bytes of '{}'", name);
    }
    std::remove(out.c_str());
  } catch (const Error&) {
  }
  return 0;
}
