// gather and scatter_add on the GPU. Both walk the index's shape with three operands (out, index,
// src); the operand addressed through the index has its stride along `axis` zeroed, and the index value
// times that stride is added per element.
//
// scatter_add is deterministic and equals the Cpu backend bit for bit: no atomics. The positions of
// the index are sorted by (row, target) with a stable radix sort (sort.cuh), and one thread per run of
// equal targets (and per broadcast column) adds the run's source elements in ascending position, each
// sum rounded to the element type, as the Cpu backend's loop does. Reruns, and GPUs that schedule
// blocks differently, give the same bits (PyTorch's index_add/scatter_add use atomics and do not).
// One run is summed by one thread: a target hit by m positions costs m sequential adds.
//
// An index outside [0, size) is reported like on the CPU, as a kiln::Error naming the op, the dim and
// its size: the kernels raise a flag that the host reads after the launch (one small device-to-host
// copy, so these two ops wait for the GPU). gather skips such elements; scatter_add checks before it
// writes anything, so a failed call leaves its output untouched.
#include <bit>

#include "kiln/backends/cuda/indexing.cuh"
#include "kiln/backends/cuda/sort.cuh"

namespace kiln {

namespace {

using namespace cuda;

template <class T, class I> struct GatherF {
  T* o;
  const I* ix;
  const T* s;
  int64_t lim, sax;
  int* bad;
  __device__ void operator()(const int64_t (&off)[3]) const {
    const auto k = static_cast<int64_t>(ix[off[1]]);
    if (k < 0 || k >= lim) {
      *bad = 1;
      return;
    }
    o[off[0]] = s[off[2] + k * sax];
  }
};

// scatter_add, step 1: the key of every position of the index walk (its row dims, then the axis,
// innermost): ri * lim + index value, ri the position's row (p / len); the sentinel `bad_key` for an
// out-of-range index. A 0-d output takes every element whatever the index says: key 0.
template <class I> struct ScatterKeyF {
  uint64_t* key;
  const I* ix;
  int64_t lim, len;
  uint64_t bad_key;
  bool scalar;
  int* bad;
  __device__ void operator()(int64_t p, int64_t off) const {
    if (scalar) {
      key[p] = 0;
      return;
    }
    const auto k = static_cast<int64_t>(ix[off]);
    if (k < 0 || k >= lim) {
      *bad = 1;
      key[p] = bad_key;
      return;
    }
    key[p] = static_cast<uint64_t>(p / len) * static_cast<uint64_t>(lim) + static_cast<uint64_t>(k);
  }
};
template <class I> __global__ void __launch_bounds__(256) scatter_keys(const Walk<1> w, const ScatterKeyF<I> f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < w.numel; p += step) {
    int64_t off[1];
    w.offsets(p, off);
    f(p, off[0]);
  }
}

// scatter_add, step 3: one thread per (run of equal keys, broadcast column), the column innermost. It
// adds the run's source elements into the output one by one in ascending position, each sum rounded to
// the element type: the Cpu backend's order and rounding, so the result equals it bit for bit.
// wp walks the positions (operands: src, out with the axis stride zeroed), wb the columns
// (src, out).
template <class T> __global__ void __launch_bounds__(256)
    scatter_runs(T* __restrict__ o, const T* __restrict__ s, const uint64_t* __restrict__ key, const int64_t* __restrict__ pos, int64_t n,
                 const Walk<2> wp, const Walk<2> wb, int64_t lim, int64_t oax, uint64_t bad_key) {
  const int64_t nb = wb.numel, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n * nb; t += step) {
    const int64_t p = t / nb, b = t - p * nb;
    const uint64_t k = key[p];
    if (k >= bad_key || (p > 0 && key[p - 1] == k)) continue;  // not the head of a run
    int64_t ob[2], op[2];
    wb.offsets(b, ob);
    wp.offsets(pos[p], op);
    T* dst = o + op[1] + static_cast<int64_t>(k % static_cast<uint64_t>(lim)) * oax + ob[1];
    T acc = *dst;
    for (int64_t q = p; q < n && key[q] == k; ++q) {
      wp.offsets(pos[q], op);
      acc = from_compute<T>(to_compute(acc) + ld(s + op[0] + ob[0]));
    }
    *dst = acc;
  }
}

// A device flag for out-of-range indices, cleared before the kernel and read after it.
class BadIndexFlag {
 public:
  explicit BadIndexFlag(const char* op) : op_(op), mem_(Cuda::allocate(sizeof(int))) {
    KILN_CUDA_CHECK_OP(op_, cudaMemsetAsync(mem_->data(), 0, sizeof(int), stream()));
  }
  int* get() { return mem_->as<int>(); }
  bool raised() const {
    int v = 0;
    Cuda::read(*mem_, 0, &v, sizeof v);
    return v != 0;
  }

 private:
  const char* op_;
  std::shared_ptr<CudaStorage> mem_;
};

template <class F> void visit_index(DType d, F&& f) {
  if (d == DType::i64)
    f(type_tag<int64_t>{});
  else
    f(type_tag<int32_t>{});
}

}  // namespace

void Cuda::gather(M out, V src, int axis, V index) {
  KILN_CHECK(out.dtype == src.dtype, "gather: output dtype {} differs from input dtype {}", out.dtype, src.dtype);
  KILN_CHECK(index.dtype == DType::i64 || index.dtype == DType::i32, "gather: index must be i32 or i64, got {}", index.dtype);
  if (src.layout.rank() == 0) return Cuda::copy(out, src);
  if (index.layout.numel() == 0) return;
  for (const CudaStorage* s : std::initializer_list<const CudaStorage*>{&out.storage, &src.storage, &index.storage})
    check_device(*s, "gather");
  const auto ax = static_cast<size_t>(axis);
  const int64_t lim = src.layout.shape[ax], sax = src.layout.strides[ax];
  Strides ss = src.layout.strides;
  ss[ax] = 0;
  const Walk<3> w = make_walk<3>("gather", index.layout.shape, {&out.layout.strides, &index.layout.strides, &ss},
                                 {out.layout.offset, index.layout.offset, src.layout.offset});
  BadIndexFlag bad("gather");
  visit_width(src.dtype, [&]<class T>(type_tag<T>) {  // gather moves elements: the width is enough
    visit_index(index.dtype, [&]<class I>(type_tag<I>) {
      launch_elementwise("gather", w, GatherF<T, I>{out.storage.as<T>(), index.storage.as<I>(), src.storage.as<T>(), lim, sax, bad.get()});
    });
  });
  KILN_CHECK(!bad.raised(), "gather: index out of range for dimension {} of size {} (input {})", axis, lim, shape_str(src.layout.shape));
}

void Cuda::scatter_add(M out, int axis, V index, V src) {
  const char* op = "scatter_add";
  KILN_CHECK(out.dtype == src.dtype, "scatter_add: output dtype {} differs from src dtype {}", out.dtype, src.dtype);
  KILN_CHECK(index.dtype == DType::i64 || index.dtype == DType::i32, "scatter_add: index must be i32 or i64, got {}", index.dtype);
  KILN_CHECK(out.dtype != DType::boolean, "scatter_add: not supported for dtype bool (shape {})", shape_str(out.layout.shape));
  if (index.layout.numel() == 0) return;
  for (const CudaStorage* s : std::initializer_list<const CudaStorage*>{&out.storage, &src.storage, &index.storage}) check_device(*s, op);
  // The index's dims split three ways: the axis; "row" dims, along which the index varies (each row
  // is sorted on its own: the key carries the row); "column" dims, along which it is broadcast or has
  // size 1 (every column shares its row's runs). Positions are walked row-major over (rows..., axis),
  // so that equal keys of a row come out of the stable sort in ascending axis order.
  // A 0-d output takes every element of src (the index's shape) in order, whatever the index says.
  const bool scalar = out.layout.rank() == 0;
  const Shape& is = index.layout.shape;
  Shape ps, cs;
  Strides pi, psrc, pout, csrc, cout;
  int64_t lim = 1, oax = 0;
  for (size_t d = 0; d < is.size(); ++d) {
    const bool row = scalar || (static_cast<int>(d) != axis && is[d] > 1 && index.layout.strides[d] != 0);
    if (static_cast<int>(d) == axis && !scalar) continue;
    (row ? ps : cs).push_back(is[d]);
    (row ? psrc : csrc).push_back(src.layout.strides[d]);
    (row ? pout : cout).push_back(scalar ? 0 : out.layout.strides[d]);
    if (row) pi.push_back(index.layout.strides[d]);
  }
  int64_t len = 1;
  if (!scalar) {
    const auto ax = static_cast<size_t>(axis);
    len = is[ax];
    lim = out.layout.shape[ax];
    oax = out.layout.strides[ax];
    ps.push_back(len);
    pi.push_back(index.layout.strides[ax]);
    psrc.push_back(src.layout.strides[ax]);
    pout.push_back(0);
  }
  const Walk<1> wi = make_walk<1>(op, ps, {&pi}, {index.layout.offset});
  const Walk<2> wp = make_walk<2>(op, ps, {&psrc, &pout}, {src.layout.offset, out.layout.offset});
  const Walk<2> wc = make_walk<2>(op, cs, {&csrc, &cout}, {0, 0});
  const int64_t n = wi.numel, rows = n / len;
  uint64_t bad_key = 0;
  KILN_CHECK(!__builtin_mul_overflow(static_cast<uint64_t>(rows), static_cast<uint64_t>(lim), &bad_key) && bad_key < (uint64_t{1} << 62),
             "scatter_add: {} index rows x {} outputs along dim {} exceed the key range", rows, lim, axis);
  // 1. keys, and the range check before the output is touched
  auto keys = Cuda::allocate(static_cast<size_t>(n) * sizeof(uint64_t));
  {
    BadIndexFlag bad(op);
    visit_index(index.dtype, [&]<class I>(type_tag<I>) {
      scatter_keys<I><<<grid_for(n, 256), 256, 0, stream()>>>(
          wi, ScatterKeyF<I>{keys->as<uint64_t>(), index.storage.as<I>(), lim, len, bad_key, scalar, bad.get()});
      after_launch(op, __FILE__, __LINE__);
    });
    KILN_CHECK(!bad.raised(), "scatter_add: index out of range for dimension {} of size {} (output {})", axis, lim,
               shape_str(out.layout.shape));
  }
  // 2. positions grouped by key, ascending within a key; 3. each run summed in order
  const SortedByKey sorted = sort_by_key(op, keys, n, static_cast<int>(std::bit_width(bad_key)));
  visit_dtype(src.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (!std::is_same_v<T, bool>) {
      scatter_runs<T><<<grid_for(n * wc.numel, 256), 256, 0, stream()>>>(
          out.storage.as<T>(), src.storage.as<T>(), sorted.keys->as<uint64_t>(), sorted.pos->as<int64_t>(), n, wp, wc, lim, oax, bad_key);
      after_launch(op, __FILE__, __LINE__);
    }
  });
}

}  // namespace kiln
