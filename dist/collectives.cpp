// kiln::dist's collectives (dist/process_group.hpp) for every backend: the checks, the cross-rank
// consistency check (detail::agree, dist/consistency.cpp), staging into contiguous buffers of the wire
// dtype (bf16/f16 travel as f32), and the backend's transport (detail::Transport<B>, dist/detail.hpp).
#include <climits>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/dist/detail.hpp"

namespace kiln::dist {

namespace {

DType wire_dtype(DType d) { return is_half(d) ? DType::f32 : d; }

template <Backend B> bool writable(const Tensor<B>& t) {
  const Layout& l = t.layout();
  for (size_t i = 0; i < l.shape.size(); ++i)
    if (l.strides[i] == 0 && l.shape[i] > 1) return false;
  return true;
}

template <Backend B> std::string tensor_error(const char* op, const char* what, const Tensor<B>& t, bool write) {
  if (!t.defined()) return fmt::format("{}: {} is an undefined tensor", op, what);
  if (write && !writable(t))
    return fmt::format("{}: {} (shape {}, strides {}) has overlapping elements (an expanded view) and cannot be written", op, what,
                       shape_str(t.shape()), shape_str(t.layout().strides));
  return "";
}

std::string op_error(const char* op, ReduceOp r, DType d) {
  if (r == ReduceOp::avg && !is_floating(d))
    return fmt::format("{}: avg needs a floating dtype, got {} (reduce with sum and divide)", op, d);
  return "";
}

#if defined(KILN_HAVE_CUDA_BACKEND)
template <Backend B> constexpr bool is_cuda = std::is_same_v<B, Cuda>;
#else
template <Backend B> constexpr bool is_cuda = false;
#endif

template <Backend B> void* raw(const Tensor<B>& t) {
  return static_cast<char*>(t.storage()->data()) + t.layout().offset * static_cast<int64_t>(dtype_size(t.dtype()));
}
template <Backend B> int device_of([[maybe_unused]] const Tensor<B>& t) {
  if constexpr (is_cuda<B>)
    return t.storage()->device();
  else
    return -1;
}

// A contiguous tensor of dtype d with t's values: t itself when it already is one.
template <Backend B> Tensor<B> staged(const Tensor<B>& t, DType d) {
  if (t.dtype() == d && t.is_contiguous()) return t;
  return t.to(d).contiguous();
}
template <Backend B> bool same_memory(const Tensor<B>& a, const Tensor<B>& b) {
  return a.storage() == b.storage() && a.layout().offset == b.layout().offset && a.dtype() == b.dtype();
}

// After the wire op: avg's division and the copy back into `out` (in its dtype, rounding once).
template <Backend B> std::function<void()> finisher(Tensor<B> out, Tensor<B> buf, ReduceOp op, int n) {
  return [out, buf, op, n]() mutable {
    if (op == ReduceOp::avg && n > 1) buf.div_(Tensor<B>::full({}, n, buf.dtype()));
    if (!same_memory(out, buf)) out.copy_(buf.view(out.shape()));
  };
}

template <Backend B> std::vector<std::shared_ptr<const void>> keep_of(std::initializer_list<Tensor<B>> ts) {
  std::vector<std::shared_ptr<const void>> k;
  for (const auto& t : ts) k.push_back(t.storage());
  return k;
}

// ------------------------------------------------------------------------------------ on the wire
// One collective of backend B's tensors through its transport (detail::Transport<B>: MPI for host
// memory, NCCL for Cuda), on buffers staged contiguous in the wire dtype; `finish` (avg's division,
// the copy back) runs when it completes. blocking: complete before returning.
template <Backend B> std::shared_ptr<Work::Impl> on_wire(detail::Coll coll, const Tensor<B>& send, const Tensor<B>& recv, int64_t count,
                                                         DType dtype, ReduceOp op, int root, const char* what, std::function<void()> finish,
                                                         std::vector<std::shared_ptr<const void>> keep, bool blocking = true) {
  const detail::WireCall c{.coll = coll,
                           .send = raw(send),
                           .recv = raw(recv),
                           .count = count,
                           .dtype = dtype,
                           .op = op,
                           .root = root,
                           .device = device_of(send),
                           .what = what};
  return detail::Transport<B>::start(c, std::move(finish), std::move(keep), blocking);
}

// all_reduce of t (validated) on the wire; blocking completes it before returning.
template <Backend B> std::shared_ptr<Work::Impl> start_all_reduce(const Tensor<B>& t, ReduceOp op, const char* what, bool blocking) {
  const DType wire = wire_dtype(t.dtype());
  const Tensor<B> buf = staged(t, wire);
  return on_wire<B>(detail::Coll::all_reduce, buf, buf, buf.numel(), wire, op, 0, what, finisher(t, buf, op, detail::group_size()),
                    keep_of<B>({t, buf}), blocking);
}

template <Backend B> void run_broadcast(const Tensor<B>& t, int root) {
  const Tensor<B> buf = staged(t, t.dtype());
  on_wire<B>(detail::Coll::broadcast, buf, buf, buf.numel(), t.dtype(), ReduceOp::sum, root, "broadcast",
             finisher(t, buf, ReduceOp::sum, detail::group_size()), keep_of<B>({t, buf}));
}

template <Backend B> void run_all_gather(const Tensor<B>& out, const Tensor<B>& t) {
  const Tensor<B> send = staged(t, t.dtype());
  const Tensor<B> recv = staged(out, out.dtype());
  on_wire<B>(detail::Coll::all_gather, send, recv, send.numel(), t.dtype(), ReduceOp::sum, 0, "all_gather",
             finisher(out, recv, ReduceOp::sum, detail::group_size()), keep_of<B>({t, out, send, recv}));
}

template <Backend B> void run_reduce_scatter(const Tensor<B>& out, const Tensor<B>& t, ReduceOp op) {
  const DType wire = wire_dtype(t.dtype());
  const Tensor<B> send = staged(t, wire);
  const Tensor<B> recv = out.dtype() == wire && out.is_contiguous() ? out : Tensor<B>::empty({out.numel()}, wire);
  on_wire<B>(detail::Coll::reduce_scatter, send, recv, out.numel(), wire, op, 0, "reduce_scatter",
             finisher(out, recv, op, detail::group_size()), keep_of<B>({t, out, send, recv}));
}

std::string count_error(const char* op, int64_t n) {
  if (n > INT_MAX) return fmt::format("{}: {} elements per rank exceed one MPI call's count (2^31 - 1); split the tensor", op, n);
  return "";
}

}  // namespace

// ------------------------------------------------------------------------------------ collectives
// The checks and the cross-rank agreement of all_reduce and all_reduce_async (`kind`).
template <Backend B> void agree_all_reduce(const char* what, detail::Kind kind, const Tensor<B>& t, ReduceOp op) {
  detail::require_init(what);
  std::string err = tensor_error(what, "the tensor", t, true);
  if (err.empty()) err = op_error(what, op, t.dtype());
  detail::agree(what, kind, t.defined() ? t.dtype() : DType::f32, t.defined() ? t.numel() : -1, static_cast<int64_t>(op),
                t.defined() ? t.shape() : Shape{}, err);
}

template <Backend B> void all_reduce(const Tensor<B>& t, ReduceOp op) {
  agree_all_reduce("all_reduce", detail::Kind::all_reduce, t, op);
  if (detail::group_size() == 1) return;  // the sum (max, min, mean) over one rank
  start_all_reduce(t, op, "all_reduce", true);
}

template <Backend B> Work all_reduce_async(const Tensor<B>& t, ReduceOp op) {
  agree_all_reduce("all_reduce_async", detail::Kind::all_reduce_async, t, op);  // blocking, at issue (process_group.hpp)
  if (detail::group_size() == 1) return Work();
  return Work(start_all_reduce(t, op, "all_reduce_async", false));
}

template <Backend B> void broadcast(const Tensor<B>& t, int root) {
  detail::require_init("broadcast");
  const int n = detail::group_size();
  std::string err = tensor_error("broadcast", "the tensor", t, true);
  if (err.empty() && (root < 0 || root >= n))
    err = fmt::format("broadcast: root {} is not a rank of this group of {} (0..{})", root, n, n - 1);
  detail::agree("broadcast", detail::Kind::broadcast, t.defined() ? t.dtype() : DType::f32, t.defined() ? t.numel() : -1, root,
                t.defined() ? t.shape() : Shape{}, err);
  if (n == 1) return;
  run_broadcast(t, root);
}

template <Backend B> void all_gather_into(const Tensor<B>& out, const Tensor<B>& t) {
  detail::require_init("all_gather");
  const int n = detail::group_size();
  std::string err = tensor_error("all_gather", "the input", t, false);
  if (err.empty()) err = tensor_error("all_gather", "the output", out, true);
  if (err.empty() && (out.dtype() != t.dtype() || out.numel() != n * t.numel()))
    err = fmt::format("all_gather: the output is {} {} ({} elements); {} ranks of {} {} need {} {} elements", out.dtype(),
                      shape_str(out.shape()), out.numel(), n, t.dtype(), shape_str(t.shape()), n * t.numel(), t.dtype());
  if (err.empty()) err = count_error("all_gather", t.numel());
  detail::agree("all_gather", detail::Kind::all_gather, t.defined() ? t.dtype() : DType::f32, t.defined() ? t.numel() : -1, 0,
                t.defined() ? t.shape() : Shape{}, err);
  if (n == 1) {
    Tensor<B> o = out;  // a handle on the same elements
    o.copy_(t.reshape(out.shape()));
    return;
  }
  run_all_gather(out, t);
}

template <Backend B> Tensor<B> all_gather(const Tensor<B>& t) {
  detail::require_init("all_gather");
  Shape s{detail::group_size()};
  if (t.defined()) s.insert(s.end(), t.shape().begin(), t.shape().end());
  const Tensor<B> out = Tensor<B>::empty(s, t.defined() ? t.dtype() : DType::f32);
  all_gather_into(out, t);
  return out;
}

template <Backend B> void reduce_scatter_into(const Tensor<B>& out, const Tensor<B>& t, ReduceOp op) {
  detail::require_init("reduce_scatter");
  const int n = detail::group_size();
  std::string err = tensor_error("reduce_scatter", "the input", t, false);
  if (err.empty()) err = tensor_error("reduce_scatter", "the output", out, true);
  if (err.empty()) err = op_error("reduce_scatter", op, t.dtype());
  if (err.empty() && (out.dtype() != t.dtype() || t.numel() != n * out.numel()))
    err = fmt::format(
        "reduce_scatter: the input is {} {} ({} elements); {} ranks with an output of {} {} ({} elements) need {} {} elements", t.dtype(),
        shape_str(t.shape()), t.numel(), n, out.dtype(), shape_str(out.shape()), out.numel(), n * out.numel(), out.dtype());
  if (err.empty()) err = count_error("reduce_scatter", out.numel());
  detail::agree("reduce_scatter", detail::Kind::reduce_scatter, t.defined() ? t.dtype() : DType::f32, t.defined() ? t.numel() : -1,
                static_cast<int64_t>(op), t.defined() ? t.shape() : Shape{}, err);
  if (n == 1) {
    Tensor<B> o = out;
    o.copy_(t.reshape(out.shape()));
    return;
  }
  run_reduce_scatter(out, t, op);
}

template <Backend B> Tensor<B> reduce_scatter(const Tensor<B>& t, ReduceOp op) {
  detail::require_init("reduce_scatter");
  const int n = detail::group_size();
  std::string err = tensor_error("reduce_scatter", "the input", t, false);
  if (err.empty() && (t.dim() < 1 || t.size(0) != n))
    err = fmt::format(
        "reduce_scatter: the input's first axis must have one row per rank: shape {} for {} ranks (or use "
        "reduce_scatter_into)",
        shape_str(t.shape()), n);
  if (!err.empty()) {  // every rank learns of it
    detail::agree("reduce_scatter", detail::Kind::reduce_scatter, t.defined() ? t.dtype() : DType::f32, t.defined() ? t.numel() : -1,
                  static_cast<int64_t>(op), t.defined() ? t.shape() : Shape{}, err);
  }
  const Shape s(t.shape().begin() + 1, t.shape().end());
  const Tensor<B> out = Tensor<B>::empty(s, t.dtype());
  reduce_scatter_into(out, t, op);
  return out;
}

double all_reduce_scalar(double x, ReduceOp op) {
  const Tensor<HostValues> t = Tensor<HostValues>::full({}, x, DType::f64);
  all_reduce(t, op);
  return item<double>(t);
}

void all_reduce_scalars(std::vector<double>& xs, ReduceOp op) {
  const Tensor<HostValues> t = Tensor<HostValues>::from_vector(xs, {static_cast<int64_t>(xs.size())});
  all_reduce(t, op);
  xs = t.to_vector<double>();
}

RowSlice batch_slice(int64_t batch_size, int rank, int world_size) {
  KILN_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "batch_slice: rank {} of a group of {}", rank, world_size);
  KILN_CHECK(batch_size >= 0 && batch_size % world_size == 0,
             "batch_slice: a global batch of {} rows does not divide among {} ranks (each rank takes an equal, contiguous slice "
             "of the rows): use a batch size that is a multiple of {}",
             batch_size, world_size, world_size);
  const int64_t per = batch_size / world_size;
  return {rank * per, per};
}
RowSlice batch_slice(int64_t batch_size) { return batch_slice(batch_size, rank(), world_size()); }

template <Backend B> Tensor<B> local_rows(const Tensor<B>& batch) {
  KILN_CHECK(batch.defined() && batch.dim() >= 1, "local_rows: the batch needs a first axis of rows, got {}",
             batch.defined() ? shape_str(batch.shape()) : std::string("an undefined tensor"));
  const RowSlice s = batch_slice(batch.size(0));
  return batch.narrow(0, s.start, s.count);
}

#define KILN_INST(B)                                                                  \
  template void all_reduce<B>(const Tensor<B>&, ReduceOp);                            \
  template Work all_reduce_async<B>(const Tensor<B>&, ReduceOp);                      \
  template void broadcast<B>(const Tensor<B>&, int);                                  \
  template Tensor<B> all_gather<B>(const Tensor<B>&);                                 \
  template void all_gather_into<B>(const Tensor<B>&, const Tensor<B>&);               \
  template Tensor<B> reduce_scatter<B>(const Tensor<B>&, ReduceOp);                   \
  template void reduce_scatter_into<B>(const Tensor<B>&, const Tensor<B>&, ReduceOp); \
  template Tensor<B> local_rows<B>(const Tensor<B>&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::dist
