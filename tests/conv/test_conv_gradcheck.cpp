// float64 central-difference gradients of every convolution and pooling op, on every backend
// (Reference: its loops; Cpu: the composite for f64 conv/avg, its own max-pool loops; Cuda: the
// composite), with non-contiguous inputs.
#include <catch2/catch.hpp>

#include <kiln/autograd/gradcheck.hpp>
#include <kiln/autograd/ops.hpp>
#include <kiln/nn/conv.hpp>
#include <kiln/nn/pool.hpp>

using namespace kiln;
namespace F = kiln::nn::functional;

namespace {

template <Backend B> Tensor<B> rn(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return Tensor<B>::randn(s, DType::f64, &g);
}

template <Backend B>
void check(const std::string& what, const std::function<Var<B>(const std::vector<Var<B>>&)>& f, const std::vector<Tensor<B>>& in) {
  const GradcheckResult<B> r = gradcheck<B>(f, in);
  INFO(what << ": " << r.message);
  CHECK(r.ok);
}

}  // namespace

TEMPLATE_TEST_CASE("gradcheck: conv2d, conv1d, conv_transpose2d", "[conv][gradcheck]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using VV = std::vector<Var<B>>;
  const Tensor<B> x = rn<B>({2, 4, 6, 5}, 1), xt = rn<B>({2, 5, 6, 4}, 2).permute({0, 3, 2, 1});  // [2, 4, 6, 5] non-contiguous
  const Tensor<B> w = rn<B>({6, 2, 3, 2}, 3), b = rn<B>({6}, 4);
  for (const auto& in : {x, xt}) {
    check<B>("conv2d groups 2 stride (2, 1) pad (1, 0) dil (1, 2) bias",
             [](const VV& v) {
               return F::conv2d(v[0], v[1], v[2], {2, 1}, {1, 0}, {1, 2}, 2);
             },
             {in, w, b});
  }
  check<B>("conv2d plain no bias", [](const VV& v) { return F::conv2d(v[0], v[1], Var<B>(), 1, 1); },
           {rn<B>({1, 2, 5, 4}, 5), rn<B>({3, 2, 3, 3}, 6)});
  check<B>("conv2d depthwise", [](const VV& v) { return F::conv2d(v[0], v[1], v[2], 2, 1, 1, 3); },
           {rn<B>({2, 3, 5, 5}, 7), rn<B>({6, 1, 3, 3}, 8), rn<B>({6}, 9)});
  check<B>("conv2d unbatched",
           [](const VV& v) {
             return F::conv2d(v[0], v[1], v[2], 1, {0, 1});
           },
           {rn<B>({2, 4, 3}, 10), rn<B>({3, 2, 2, 2}, 11), rn<B>({3}, 12)});
  check<B>("conv1d stride 2 pad 1 dil 2 groups 2", [](const VV& v) { return F::conv1d(v[0], v[1], v[2], 2, 1, 2, 2); },
           {rn<B>({2, 4, 9}, 13), rn<B>({4, 2, 3}, 14), rn<B>({4}, 15)});
  check<B>("conv1d unbatched", [](const VV& v) { return F::conv1d(v[0], v[1]); }, {rn<B>({3, 7}, 16), rn<B>({2, 3, 4}, 17)});
  check<B>("conv_transpose2d stride 2 pad 1 out_pad 1 groups 2 bias",
           [](const VV& v) { return F::conv_transpose2d(v[0], v[1], v[2], 2, 1, 1, 2); },
           {rn<B>({2, 4, 3, 4}, 18), rn<B>({4, 3, 3, 2}, 19), rn<B>({6}, 20)});
  check<B>("conv_transpose2d dilation 2, output_padding 1 < dilation (stride 1)",
           [](const VV& v) { return F::conv_transpose2d(v[0], v[1], Var<B>(), 1, 0, 1, 1, 2); },
           {rn<B>({1, 2, 4, 3}, 21), rn<B>({2, 3, 2, 3}, 22)});
  check<B>("conv_transpose2d non-contiguous input",
           [](const VV& v) {
             return F::conv_transpose2d(v[0], v[1], v[2], {1, 2}, {0, 1});
           },
           {rn<B>({2, 5, 4, 3}, 23).permute({0, 3, 2, 1}), rn<B>({3, 2, 2, 3}, 24), rn<B>({2}, 25)});
}

TEMPLATE_TEST_CASE("gradcheck: max_pool2d, avg_pool2d, adaptive_avg_pool2d", "[pool][gradcheck]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using VV = std::vector<Var<B>>;
  // distinct values, spread apart so central differences never cross a tie
  const auto spread = [](const Shape& s, uint64_t seed) {
    const int64_t n = kiln::numel(s);
    Generator g(seed);
    const Tensor<B> perm = Tensor<B>::rand({n}, DType::f64, &g);
    std::vector<double> r = perm.template to_vector<double>(), v(static_cast<size_t>(n));
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b2) { return r[static_cast<size_t>(a)] < r[static_cast<size_t>(b2)]; });
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(order[static_cast<size_t>(i)])] = 0.1 * static_cast<double>(i) - 2.0;
    return Tensor<B>::from_vector(v, s);
  };
  const Tensor<B> x = spread({2, 3, 7, 6}, 1);
  check<B>("max_pool2d 3x3 stride 2 pad 1", [](const VV& v) { return F::max_pool2d(v[0], 3, 2, 1); }, {x});
  check<B>("max_pool2d ceil_mode dilation 2", [](const VV& v) { return F::max_pool2d(v[0], {2, 3}, Size2{2, 1}, {1, 0}, 2, true); }, {x});
  check<B>("max_pool2d overlapping windows, permuted input", [](const VV& v) { return F::max_pool2d(v[0], 3, 1); },
           {spread({2, 6, 7, 3}, 2).permute({0, 3, 2, 1})});
  check<B>("avg_pool2d include pad", [](const VV& v) { return F::avg_pool2d(v[0], 3, 2, 1); }, {rn<B>({2, 3, 7, 6}, 3)});
  check<B>("avg_pool2d exclude pad ceil_mode",
           [](const VV& v) {
             return F::avg_pool2d(v[0], {3, 2}, Size2{2, 2}, {1, 1}, true, false);
           },
           {rn<B>({2, 3, 7, 6}, 4)});
  check<B>("avg_pool2d include pad ceil_mode overhang", [](const VV& v) { return F::avg_pool2d(v[0], 2, 2, 1, true, true); },
           {rn<B>({1, 2, 6, 5}, 5)});
  check<B>("adaptive_avg_pool2d (3, 4) of 7x6", [](const VV& v) { return F::adaptive_avg_pool2d(v[0], {3, 4}); }, {rn<B>({2, 3, 7, 6}, 6)});
  check<B>("adaptive_avg_pool2d upsampling (5, 8) of 3x6",
           [](const VV& v) {
             return F::adaptive_avg_pool2d(v[0], {5, 8});
           },
           {rn<B>({1, 2, 3, 6}, 7)});
  check<B>("adaptive_avg_pool2d divisible (2, 3) of 6x6",
           [](const VV& v) {
             return F::adaptive_avg_pool2d(v[0], {2, 3});
           },
           {rn<B>({1, 2, 6, 6}, 8)});
}
