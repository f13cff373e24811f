// IDX (formats/idx.cpp). The first byte picks what is read:
//   even: one file through read_idx, then the round trip (written raw or gzip'ed, read back equal);
//   odd:  an images file and a labels file (the rest split where the next two bytes say) through
//         IdxDataset::load, then its tensors.
#include <algorithm>

#include <kiln/backends/reference/reference.hpp>
#include <kiln/formats/idx.hpp>
#include <kiln/train/dataloader.hpp>

#include "fuzz.hpp"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  try {
    if (data[0] % 2 == 0) {
      const std::string path = fuzz::file(data + 1, size - 1);
      const IdxArray a = read_idx(path);
      KILN_FUZZ_ASSERT(!a.dims.empty(), "rank >= 1");
      const std::string out = path + ".rt";
      write_idx(out, a, /*gzip=*/data[0] & 2);
      const IdxArray b = read_idx(out);
      KILN_FUZZ_ASSERT(b.type == a.type && b.dims == a.dims && b.bytes == a.bytes, "IDX round trip");
      std::remove(out.c_str());
    } else {
      const size_t rest = size - 3, cut = std::min<size_t>(rest, data[1] | size_t{data[2]} << 8);
      const std::string images = fuzz::file(data + 3, cut, "images"), labels = fuzz::file(data + 3 + cut, rest - cut, "labels");
      const IdxDataset d = IdxDataset::load(images, labels, {.mean = 0.5, .std = 0.25});
      const auto [x, y] = d.tensors<Reference>();
      const TensorDataset<Reference> t(x, y);
      KILN_FUZZ_ASSERT(t.size() == d.size(), "tensors hold every sample");
    }
  } catch (const Error&) {
  }
  return 0;
}
