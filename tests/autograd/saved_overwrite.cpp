// autograd::saved_input_is_dead (autograd/var.hpp), seen through its user, the SwiGLU op: its backward
// writes da over the gate's value and db over the up's when nothing can read them again. Every way
// something still could (a Var or tensor the caller keeps, a retained graph, a leaf or a view of one,
// an op still to be replayed that saved the value) must leave the values intact and the gradients
// bit-identical; the plain graph (a product, reshaped, as nn::Linear) must take the in-place path.
#include <kiln/autograd/layer_ops.hpp>
#include <kiln/core/host_alloc.hpp>

#include "helpers.hpp"

using namespace kiln;

namespace {

using V = Var<Cpu>;
using T = Tensor<Cpu>;

V swiglu(const V& a, const V& b) { return autograd::SwiGLUOps<Cpu>::swiglu(a, b); }

T rnd(const Shape& s, uint64_t seed) { return test::randn<Cpu>(s, seed).to(DType::f32); }

void same_bits(const T& got, const T& want, const char* what) {
  INFO(what);
  REQUIRE(got.defined());
  CHECK(got.to_vector<float>() == want.to_vector<float>());
}

// [256, 16] @ [16, 1024] products: gate and up are 1 MiB each (large blocks, counted by host_cache_stats).
struct Net {
  V x = V(rnd({256, 16}, 1), true), wg = V(rnd({16, 1024}, 2), true), wu = V(rnd({16, 1024}, 3), true);
  V gate() const { return x.matmul(wg).reshape({4, 64, 1024}); }
  V up() const { return x.matmul(wu).reshape({4, 64, 1024}); }
};

int64_t large_allocations() {
  const HostCacheStats s = host_cache_stats();
  return s.hits + s.misses;
}

}  // namespace

TEST_CASE("autograd: a backward overwrites a saved value only when nothing can read it again", "[autograd]") {
  // The reference: the caller keeps the gate and up Vars, so nothing is overwritten.
  Net ref;
  V gate = ref.gate(), up = ref.up();
  const T gate0 = gate.value().clone(), up0 = up.value().clone();
  swiglu(gate, up).sum().backward();
  same_bits(gate.value(), gate0, "the kept gate");
  same_bits(up.value(), up0, "the kept up");

  SECTION("the graph alone holds them: in place, the same gradients") {
    // Large blocks the backward takes, with the gate and up kept by the caller or not: in place, da and
    // db take no fresh 1 MiB buffer (the contiguous copy of the sum's broadcast gradient still does).
    const auto allocations = [](bool keep) {
      Net m;
      V g = m.gate(), u = m.up();
      V loss = swiglu(g, u).sum();
      if (!keep) g = u = V();
      const int64_t before = large_allocations();
      loss.backward();
      return large_allocations() - before;
    };
    const int64_t kept = allocations(true), in_place = allocations(false);
    INFO("large allocations in the backward: " << kept << " kept, " << in_place << " in place");
    CHECK(kept - in_place == 2);
    Net n;
    swiglu(n.gate(), n.up()).sum().backward();
    same_bits(n.x.grad(), ref.x.grad(), "x grad");
    same_bits(n.wg.grad(), ref.wg.grad(), "gate weight grad");
    same_bits(n.wu.grad(), ref.wu.grad(), "up weight grad");
  }
  SECTION("the caller keeps a tensor of the gate: intact") {
    Net n;
    T kept;
    V loss;
    {
      const V g = n.gate();
      kept = g.value();
      loss = swiglu(g, n.up()).sum();
    }
    loss.backward();
    same_bits(kept, gate0, "the kept tensor");
    same_bits(n.wg.grad(), ref.wg.grad(), "gate weight grad");
  }
  SECTION("a retained graph: nothing overwritten, so the second pass gives the same gradients") {
    Net n;
    V loss = swiglu(n.gate(), n.up()).sum();
    loss.backward(true);
    same_bits(n.wg.grad(), ref.wg.grad(), "gate weight grad, first pass");
    n.wg.zero_grad();
    n.wu.zero_grad();
    loss.backward();
    same_bits(n.wg.grad(), ref.wg.grad(), "gate weight grad, second pass");
    same_bits(n.wu.grad(), ref.wu.grad(), "up weight grad, second pass");
  }
  SECTION("a leaf, or a view of one: intact") {
    V a(gate0.clone(), true), b(up0.clone(), true);  // the leaves alone hold their memory
    swiglu(a, b).sum().backward();
    same_bits(a.value(), gate0, "a leaf gate");
    V c(gate0.reshape({256, 1024}).clone(), true);
    swiglu(c.reshape({4, 64, 1024}), b).sum().backward();
    same_bits(c.value().reshape({4, 64, 1024}), gate0, "a leaf seen through a reshape");
  }
  SECTION("an op made earlier that saved the gate, replayed after: intact for it") {
    Net n;
    V loss;
    {
      const V g = n.gate();
      const V earlier = (g * g).sum();  // saves g; numbered before the swiglu, replayed after it
      loss = swiglu(g, n.up()).sum() + earlier;
    }
    loss.backward();
    Net m;
    V g = m.gate();
    const V earlier = (g * g).sum();
    (swiglu(g, m.up()).sum() + earlier).backward();  // g kept: nothing overwritten
    same_bits(n.wg.grad(), m.wg.grad(), "gate weight grad");
    same_bits(n.x.grad(), m.x.grad(), "x grad");
  }
}
