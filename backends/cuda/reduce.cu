// reduce<Op> along one axis on the GPU: sum, prod, max, min, argmax, argmin.
//
// Accumulators as in the Cpu backend: double for sum/prod of the float types, the compute type for
// max/min (exact), the element type for integers. Results are deterministic: every combination order
// is fixed by the launch shape, never by timing (no atomics).
//
// Kernels by the shape of the work (n = length of the reduced axis, M = outputs):
//  * unit-stride axis, n <= 32: a thread per output;
//  * unit-stride axis, longer: a block per output; its threads fold interleaved elements (coalesced),
//    then a warp-shuffle tree;
//  * strided axis (summing [N, D] over N): 32 x 8 thread tiles, x over neighbouring outputs
//    (coalesced), y over the axis, combined in order through shared memory;
//  * few outputs and a long axis: the last two kernels fold P consecutive pieces of each row into a
//    scratch buffer (so every SM has work), and a second pass combines each row's pieces in order.
// argmax/argmin return the first index of the extreme value; a NaN counts as the extreme, and the
// first NaN wins (the Reference's loop). Partial results carry their index, and equal values combine
// to the smaller index, so the split into pieces never changes the answer.
#include <algorithm>
#include <memory>

#include "kiln/backends/checks.hpp"
#include "kiln/backends/cuda/indexing.cuh"

namespace kiln {

namespace {

using namespace cuda;

constexpr int kBlock = 256;

template <class Op, class T> using acc_t =
    std::conditional_t<(std::is_same_v<Op, op::Sum> || std::is_same_v<Op, op::Prod>)&&is_float_v<T>, double, compute_t<T>>;

// A partial result: the accumulated value, and for index ops the position (kNone: no element yet).
constexpr int64_t kNone = INT64_MAX;
template <class A> struct Part {
  A v;
  int64_t at;
};

template <class Op, class A> __device__ __forceinline__ Part<A> part_init() { return {Op::template init<A>(), kNone}; }

// Folds element x at position k into p.
template <class Op, class A> __device__ __forceinline__ void part_step(Part<A>& p, A x, int64_t k) {
  if constexpr (Op::index) {
    if (p.at == kNone || Op::template better<A>(x, p.v)) p = {x, k};
  } else {
    p.v = Op::template step<A>(p.v, x);
  }
}

// Combines two partials of disjoint element sets; for index ops independent of the order.
template <class Op, class A> __device__ __forceinline__ Part<A> part_combine(Part<A> a, Part<A> b) {
  if constexpr (Op::index) {
    if (a.at == kNone) return b;
    if (b.at == kNone) return a;
    const bool an = a.v != a.v, bn = b.v != b.v;
    if (an || bn) {
      if (an && bn) return a.at <= b.at ? a : b;
      return an ? a : b;
    }
    if (Op::template better<A>(b.v, a.v)) return b;
    if (Op::template better<A>(a.v, b.v)) return a;
    return a.at <= b.at ? a : b;
  } else if constexpr (std::is_same_v<Op, op::Sum>) {
    return {a.v + b.v, a.at};
  } else if constexpr (std::is_same_v<Op, op::Prod>) {
    return {a.v * b.v, a.at};
  } else {
    return {Op::template step<A>(a.v, b.v), a.at};
  }
}

template <class Op, class A> __device__ __forceinline__ Part<A> warp_combine(Part<A> p) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    Part<A> q;
    q.v = __shfl_down_sync(0xffffffffu, p.v, o);
    q.at = __shfl_down_sync(0xffffffffu, p.at, o);
    p = part_combine<Op, A>(p, q);
  }
  return p;
}

// Stores a final result.
template <class Op, class T, class A> __device__ __forceinline__ void put(void* out, int64_t off, const Part<A>& p) {
  if constexpr (Op::index)
    static_cast<int64_t*>(out)[off] = p.at;
  else
    static_cast<T*>(out)[off] = convert_elem<T>(p.v);
}

// Loads element k of a row.
template <class T, class A> __device__ __forceinline__ A load(const T* row, int64_t k, int64_t sa) {
  return static_cast<A>(ld(row + k * sa));
}

// ------------------------------------------------------------------------------------ kernels
template <class Op, class T, class A> __global__ void __launch_bounds__(kBlock)
    reduce_thread(void* out, const T* __restrict__ x, const Walk<2> w, int64_t n, int64_t sa) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < w.numel; j += step) {
    int64_t off[2];
    w.offsets(j, off);
    const T* row = x + off[1];
    Part<A> p = part_init<Op, A>();
    for (int64_t k = 0; k < n; ++k) part_step<Op, A>(p, load<T, A>(row, k, sa), k);
    put<Op, T, A>(out, off[0], p);
  }
}

// Virtual output v = j * pieces + q folds elements [q * piece, min(n, (q + 1) * piece)) of output j's
// row; with pieces == 1 it writes the final result, else the partial goes to scratch[v].
template <class Op, class T, class A> __global__ void __launch_bounds__(kBlock)
    reduce_block(void* out, Part<A>* scratch, const T* __restrict__ x, const Walk<2> w, int64_t n, int64_t sa, int64_t pieces,
                 int64_t piece) {
  __shared__ A sv[kWarp];
  __shared__ int64_t sat[kWarp];
  const int lane = threadIdx.x % kWarp, wid = threadIdx.x / kWarp, nw = blockDim.x / kWarp;
  const int64_t virt = w.numel * pieces;
  for (int64_t v = blockIdx.x; v < virt; v += gridDim.x) {
    const int64_t j = v / pieces, q = v - j * pieces;
    int64_t off[2];
    w.offsets(j, off);
    const T* row = x + off[1];
    const int64_t k0 = q * piece, k1 = min(n, k0 + piece);
    Part<A> p = part_init<Op, A>();
    for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) part_step<Op, A>(p, load<T, A>(row, k, sa), k);
    p = warp_combine<Op, A>(p);
    if (lane == 0) {
      sv[wid] = p.v;
      sat[wid] = p.at;
    }
    __syncthreads();
    if (wid == 0) {
      p = lane < nw ? Part<A>{sv[lane], sat[lane]} : part_init<Op, A>();
      p = warp_combine<Op, A>(p);
      if (lane == 0) {
        if (scratch)
          scratch[v] = p;
        else
          put<Op, T, A>(out, off[0], p);
      }
    }
    __syncthreads();  // sv/sat are reused by the next output
  }
}

// Strided axis (the outputs' inner dim is the input's, e.g. summing [N, D] over N): a block of
// 32 x 8 threads takes 32 consecutive outputs (threadIdx.x: neighbouring addresses, coalesced) and
// piece q of their axis, split over threadIdx.y; the 8 partials of each output combine in order.
constexpr int kColX = 32, kColY = 8;
template <class Op, class T, class A> __global__ void __launch_bounds__(kColX* kColY)
    reduce_cols(void* out, Part<A>* scratch, const T* __restrict__ x, const Walk<2> w, int64_t n, int64_t sa, int64_t pieces,
                int64_t piece) {
  __shared__ A sv[kColY][kColX];
  __shared__ int64_t sat[kColY][kColX];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t groups = ceil_div(w.numel, kColX), virt = groups * pieces;
  for (int64_t v = blockIdx.x; v < virt; v += gridDim.x) {
    const int64_t g = v / pieces, q = v - g * pieces, j = g * kColX + tx;
    const int64_t k0 = q * piece, k1 = min(n, k0 + piece);
    int64_t off[2] = {0, 0};
    Part<A> p = part_init<Op, A>();
    if (j < w.numel) {
      w.offsets(j, off);
      const T* row = x + off[1];
      for (int64_t k = k0 + ty; k < k1; k += kColY) part_step<Op, A>(p, load<T, A>(row, k, sa), k);
    }
    sv[ty][tx] = p.v;
    sat[ty][tx] = p.at;
    __syncthreads();
    if (ty == 0 && j < w.numel) {
      for (int y = 1; y < kColY; ++y) p = part_combine<Op, A>(p, Part<A>{sv[y][tx], sat[y][tx]});
      if (scratch)
        scratch[j * pieces + q] = p;
      else
        put<Op, T, A>(out, off[0], p);
    }
    __syncthreads();
  }
}

// Second pass: output j combines its pieces in order.
template <class Op, class T, class A> __global__ void __launch_bounds__(kBlock)
    reduce_pieces(void* out, const Part<A>* __restrict__ scratch, const Walk<2> w, int64_t pieces) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < w.numel; j += step) {
    int64_t off[2];
    w.offsets(j, off);
    Part<A> p = scratch[j * pieces];
    for (int64_t q = 1; q < pieces; ++q) p = part_combine<Op, A>(p, scratch[j * pieces + q]);
    put<Op, T, A>(out, off[0], p);
  }
}

template <class Op, class T> void reduce_launch(Cuda::M out, Cuda::V in, int axis) {
  using A = acc_t<Op, T>;
  const auto ax = static_cast<size_t>(axis);
  const int64_t n = in.layout.shape[ax];
  const int64_t sa = n == 1 ? 1 : in.layout.strides[ax];
  // Outputs and their rows: out's shape has 1 at `axis`, so the walk skips that dim.
  const Walk<2> w =
      make_walk<2>(Op::name, out.layout.shape, {&out.layout.strides, &in.layout.strides}, {out.layout.offset, in.layout.offset});
  const int64_t m = w.numel;
  if (m == 0) return;
  void* o = out.storage.data();
  const T* x = in.storage.as<T>();
  const int sms = device_properties().multiProcessorCount;
  const cudaStream_t st = stream();

  const auto scratch_for = [&](int64_t pieces) -> std::shared_ptr<CudaStorage> {
    if (pieces == 1) return nullptr;
    return Cuda::allocate(static_cast<size_t>(m * pieces) * sizeof(Part<A>));
  };
  const auto second_pass = [&](const std::shared_ptr<CudaStorage>& scratch, int64_t pieces) {
    if (!scratch) return;
    reduce_pieces<Op, T, A><<<grid_for(m, kBlock), kBlock, 0, st>>>(o, scratch->as<Part<A>>(), w, pieces);
    after_launch(Op::name, __FILE__, __LINE__);
  };
  // Pieces per row: enough blocks for every SM (about 4 each), each piece at least min_piece long.
  const auto pieces_for = [&](int64_t blocks_per_piece, int64_t min_piece) {
    int64_t pieces = std::clamp<int64_t>(ceil_div(4 * sms, blocks_per_piece), 1, std::max<int64_t>(1, n / min_piece));
    const int64_t piece = ceil_div(n, pieces);
    return std::pair{ceil_div(n, piece), piece};  // every piece non-empty
  };

  if (sa != 1) {
    const int64_t groups = ceil_div(m, kColX);
    const auto [pieces, piece] = pieces_for(groups, 256);
    const std::shared_ptr<CudaStorage> scratch = scratch_for(pieces);
    reduce_cols<Op, T, A><<<grid_for(groups * pieces, 1, int64_t{1} << 20), dim3(kColX, kColY), 0, st>>>(
        o, scratch ? scratch->as<Part<A>>() : nullptr, x, w, n, sa, pieces, piece);
    after_launch(Op::name, __FILE__, __LINE__);
    return second_pass(scratch, pieces);
  }
  if (n <= 32) {
    reduce_thread<Op, T, A><<<grid_for(m, kBlock), kBlock, 0, st>>>(o, x, w, n, sa);
    return after_launch(Op::name, __FILE__, __LINE__);
  }
  const auto [pieces, piece] = pieces_for(m, 8192);
  const std::shared_ptr<CudaStorage> scratch = scratch_for(pieces);
  const int threads = n >= kBlock ? kBlock : static_cast<int>(ceil_div(n, kWarp) * kWarp);
  reduce_block<Op, T, A><<<grid_for(m * pieces, 1, int64_t{1} << 20), threads, 0, st>>>(o, scratch ? scratch->as<Part<A>>() : nullptr, x, w,
                                                                                        n, sa, pieces, piece);
  after_launch(Op::name, __FILE__, __LINE__);
  second_pass(scratch, pieces);
  // scratch goes back to the caching allocator, stream-ordered: a later allocation on this stream
  // runs after the second pass.
}

}  // namespace

template <class Op> void Cuda::reduce(M out, V in, int axis) {
  checks::reduce<Op>(out, in, axis);
  check_device(out.storage, Op::name);
  check_device(in.storage, Op::name);
  visit_dtype(in.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (checks::reduce_supported_v<T>) reduce_launch<Op, T>(out, in, axis);
  });
}

#define KILN_INST_REDUCE(OP) template void Cuda::reduce<op::OP>(M, V, int);
KILN_REDUCE_OPS(KILN_INST_REDUCE)
KILN_INDEX_REDUCE_OPS(KILN_INST_REDUCE)
#undef KILN_INST_REDUCE

}  // namespace kiln
