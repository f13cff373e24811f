// gather and scatter_add on the GPU. Both walk the index's shape with three operands (out, index,
// src); the operand addressed through the index has its stride along `axis` zeroed, and the index value
// times that stride is added per element.
//
// scatter_add accumulates with atomicAdd (f32, f64, i32, i64, and bf16/f16 on sm_80+), so the order in
// which colliding indices add up is not fixed: float results can differ in the last bits from run to
// run (PyTorch's index_add/scatter_add on CUDA behave the same way).
//
// An index outside [0, size) is reported like on the CPU, as a kiln::Error naming the op, the dim and
// its size: the kernels skip such elements and raise a flag that the host reads after the launch (one
// small device-to-host copy, so these two ops wait for the GPU).
#include "backends/cuda/indexing.cuh"

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

template <class T> __device__ __forceinline__ void atomic_add(T* p, T v) {
  if constexpr (std::is_same_v<T, bf16>) {
    __nv_bfloat16 h;
    memcpy(&h, &v, 2);
    atomicAdd(reinterpret_cast<__nv_bfloat16*>(p), h);
  } else if constexpr (std::is_same_v<T, f16>) {
    __half h;
    memcpy(&h, &v, 2);
    atomicAdd(reinterpret_cast<__half*>(p), h);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    // two's complement: unsigned addition is signed addition
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));  // NOLINT(google-runtime-int)
  } else {
    atomicAdd(p, v);
  }
}

template <class T, class I> struct ScatterAddF {
  T* o;
  const I* ix;
  const T* s;
  int64_t lim, oax;
  int* bad;
  __device__ void operator()(const int64_t (&off)[3]) const {
    const auto k = static_cast<int64_t>(ix[off[1]]);
    if (k < 0 || k >= lim) {
      *bad = 1;
      return;
    }
    atomic_add(o + off[0] + k * oax, s[off[2]]);
  }
};

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
  if (d == DType::i64) f(type_tag<int64_t>{});
  else f(type_tag<int32_t>{});
}

}  // namespace

void Cuda::gather(M out, V src, int axis, V index) {
  KILN_CHECK(out.dtype == src.dtype, "gather: output dtype {} differs from input dtype {}", out.dtype, src.dtype);
  KILN_CHECK(index.dtype == DType::i64 || index.dtype == DType::i32, "gather: index must be i32 or i64, got {}", index.dtype);
  if (src.layout.rank() == 0) return Cuda::copy(out, src);
  if (index.layout.numel() == 0) return;
  for (const CudaStorage* s : std::initializer_list<const CudaStorage*>{&out.storage, &src.storage, &index.storage}) check_device(*s, "gather");
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
  KILN_CHECK(out.dtype == src.dtype, "scatter_add: output dtype {} differs from src dtype {}", out.dtype, src.dtype);
  KILN_CHECK(index.dtype == DType::i64 || index.dtype == DType::i32, "scatter_add: index must be i32 or i64, got {}", index.dtype);
  KILN_CHECK(out.dtype != DType::boolean, "scatter_add: not supported for dtype bool (shape {})", shape_str(out.layout.shape));
  if (index.layout.numel() == 0) return;
  for (const CudaStorage* s : std::initializer_list<const CudaStorage*>{&out.storage, &src.storage, &index.storage}) check_device(*s, "scatter_add");
  // A 0-d output takes the one source element whatever the index says (as on the CPU).
  const bool scalar = out.layout.rank() == 0;
  const auto ax = static_cast<size_t>(axis);
  const int64_t lim = scalar ? INT64_MAX : out.layout.shape[ax], oax = scalar ? 0 : out.layout.strides[ax];
  Strides os = out.layout.strides;
  if (!scalar) os[ax] = 0;
  else os.assign(index.layout.shape.size(), 0);
  const Walk<3> w = make_walk<3>("scatter_add", index.layout.shape, {&os, &index.layout.strides, &src.layout.strides},
                                 {out.layout.offset, index.layout.offset, src.layout.offset});
  BadIndexFlag bad("scatter_add");
  visit_dtype(src.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (!std::is_same_v<T, bool>) {
      visit_index(index.dtype, [&]<class I>(type_tag<I>) {
        launch_elementwise("scatter_add", w,
                           ScatterAddF<T, I>{out.storage.as<T>(), index.storage.as<I>(), src.storage.as<T>(), lim, oax, bad.get()});
      });
    }
  });
  KILN_CHECK(!bad.raised(), "scatter_add: index out of range for dimension {} of size {} (output {})", axis, lim,
             shape_str(out.layout.shape));
}

}  // namespace kiln
