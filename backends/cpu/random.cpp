// rand_uniform / rand_normal: element i (row-major over the output's shape) is the same function of
// (seed, offset, i) as in Reference (core/rng.hpp), computed in double with the same expressions and
// rounded the same way, so both backends give bit-identical tensors. One Philox block serves four
// consecutive elements; one Box-Muller radius serves each pair.
#include "kiln/backends/cpu/common.hpp"
#include "kiln/core/rng.hpp"

namespace kiln {
using namespace cpu;

namespace {

// gen(i, block) -> double for element i, where block = philox4x32_10(offset + i / 4, seed).
// Uniform draws are stored through round_uniform<T> (core/rng.hpp), like Reference, so that a
// rounding up to `hi` in a narrow float type never happens.
template <bool Uniform, class G> void rand_fill(Cpu::M out, uint64_t seed, uint64_t offset, G&& gen, double hi = 0.0) {
  visit_dtype(out.dtype, [&]<class T>(type_tag<T>) {
    const Plan<1> p = make_plan<1>(out.layout.shape, {&out.layout.strides}, {out.layout.offset});
    T* o = out.storage.as<T>();
    const int64_t so = p.inner(0);
    parallel_for(
        p.numel, 1024,
        [&](int64_t b, int64_t e) {
          int64_t pos = b;
          uint64_t cur = ~uint64_t{0};
          Philox4x32 blk{};
          for_range(p, b, e, [&](const std::array<int64_t, 1>& off, int64_t n) {
            for (int64_t j = 0; j < n; ++j, ++pos) {
              const auto i = static_cast<uint64_t>(pos);
              if (i / 4 != cur) {
                cur = i / 4;
                blk = philox4x32_10(offset + cur, seed);
              }
              if constexpr (Uniform && is_float_v<T>)
                o[off[0] + j * so] = round_uniform<T>(gen(i, blk), hi);
              else
                o[off[0] + j * so] = convert<T>(gen(i, blk));
            }
          });
        },
        4);
  });
}

}  // namespace

void Cpu::rand_uniform(M out, uint64_t seed, uint64_t offset, double lo, double hi) {
  rand_fill<true>(
      out, seed, offset, [&](uint64_t i, const Philox4x32& r) { return philox_affine(lo, hi - lo, philox_uniform(r.v[i % 4])); }, hi);
}

void Cpu::rand_normal(M out, uint64_t seed, uint64_t offset, double mean, double std) {
  rand_fill<false>(out, seed, offset, [&](uint64_t i, const Philox4x32& r) {
    return philox_affine(mean, std, philox_normal_from(r, static_cast<unsigned>(i % 4)));
  });
}

}  // namespace kiln
