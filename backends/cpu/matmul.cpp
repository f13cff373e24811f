// matmul: [..., M, K] @ [..., K, N] -> [..., M, N] through OpenBLAS (sgemm/dgemm) or oneDNN.
//
// The plan is backends/gemm_plan.hpp's, shared with the Cuda backend: operands go to the library as
// they lie (NoTrans or Trans with their leading dimension; x @ W^T with W [N, K] costs no copy), only
// a matrix with no unit stride is staged (an output stored transposed too), batch dims are coalesced,
// and [B, T, K] @ [K, N] folds the batch into M (one large GEMM).
//
// Library choice (measured on this machine, 2 threads, see bench/RESULTS.md):
//  * f32 with oneDNN available: oneDNN's matmul primitive (cached per thread and shape/stride
//    signature), which takes batch strides, broadcast batch dims and transposed operands natively, for
//    batched products and for single GEMMs of 32^3 <= M N K < 1024^3 (oneDNN measured 5-60% faster
//    there: 256^3, 512^3, 1024x256x1024, per-head 128x64x128); single GEMMs of M N K >= 1024^3 go to
//    OpenBLAS, which measured equal or a few % faster there (1024^3, 1024x1024x4096, 1024x4096x4096);
//    tiny products go to OpenBLAS too, whose call overhead is lower than oneDNN's execute.
//    Where OpenBLAS's kernels predate the CPU (blas_core_predates_cpu: it took a pre-AVX2 core's, as
//    Debian 12's does on CPUs newer than it), the single GEMMs of M N K >= 1024^3 go to oneDNN too.
//  * f64, f32 without oneDNN: OpenBLAS. Batched: when each GEMM is small (< kSmallGemmFlops) and there
//    are at least as many items as threads, the batch loop is parallel and each GEMM single-threaded
//    (OpenBLAS runs single-threaded inside a parallel region); else the batch loop is serial and each
//    GEMM uses all threads.
//  * bf16 where the CPU has AVX512-BF16 or AMX (oneDNN's effective ISA, asked once at run time):
//    oneDNN's bf16 matmul (bf16 operands, f32 accumulation, the bf16 output rounded once), cached like
//    the f32 one; autocast (autograd/autocast.hpp) sends its matmuls here.
//  * bf16 elsewhere, f16 (oneDNN 2.6 has no f16 CPU matmul short of AVX512-FP16), or a bf16 layout
//    oneDNN declines: converted to f32, multiplied with f32 accumulation, rounded back; the first such
//    product prints one line on stderr saying so (the numbers are the same either way, only slower).
// Which library: set_matmul_library (cpu.hpp), KILN_CPU_MATMUL=auto|blas|onednn the initial value (an
// unknown name is a kiln::Error): auto is the rules above; blas or onednn that library for every f32
// product (blas also sends bf16 to the f32 path), for benchmarking (bench_mfu --compare-matmul).
#include <cblas.h>

#include <array>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/backends/cpu/common.hpp"
#include "kiln/backends/gemm_plan.hpp"

#ifdef KILN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace kiln {
using namespace cpu;

namespace {

constexpr double kSmallGemmFlops = 2.0 * 256 * 256 * 256;

using gemm::Operand;

void sync_omp_threads() {
  const int n = num_threads();
  if (!omp_in_parallel() && omp_get_max_threads() != n) omp_set_num_threads(n);
}

// A batched GEMM problem in element offsets; every batch item is out[i] = a[i] @ b[i].
struct Problem {
  int64_t M = 0, N = 0, K = 0;
  Operand a, b;
  int64_t ldc = 0;
  std::vector<int64_t> oa, ob, oc;  // per batch item offsets
  // coalesced batch dims (outermost first) with per-operand strides, for oneDNN
  std::vector<int64_t> bdims, bsa, bsb, bsc;
};

enum class Lib { automatic, blas, onednn };
constexpr std::array<std::string_view, 3> kLibNames{"auto", "blas", "onednn"};

Lib parse_lib(std::string_view v, std::string_view where) {
  for (size_t i = 0; i < kLibNames.size(); ++i) {
    if (v != kLibNames[i]) continue;
    const auto lib = static_cast<Lib>(i);
#ifndef KILN_HAVE_ONEDNN
    KILN_CHECK(lib != Lib::onednn, "{}: matmul library 'onednn': this kiln was built without oneDNN", where);
#endif
    return lib;
  }
  fail("{}: unknown matmul library '{}' (valid: auto, blas, onednn)", where, v);
}
// KILN_CPU_MATMUL until set_matmul_library changes it (an unknown name in the variable throws at every
// matmul: the static then stays uninitialised).
std::atomic<Lib>& lib_setting() {
  static std::atomic<Lib> l{[] {
    const char* v = std::getenv("KILN_CPU_MATMUL");
    return v ? parse_lib(v, "KILN_CPU_MATMUL") : Lib::automatic;
  }()};
  return l;
}
Lib current_lib() { return lib_setting().load(std::memory_order_relaxed); }

// OpenBLAS picks its kernels by the CPU's model, so a CPU newer than the library gets an older core's
// kernels: on an Intel Xeon of family 6 model 207 (Emerald Rapids, AVX-512) Debian 12's 0.3.21 takes its
// generic SSE3 "Prescott" kernels, 3.5x slower than its SkylakeX ones there, and single f32 products of
// 1024^3 or more (an LM head over a 32,000-word vocabulary) went to them: a GPT step 3-4x slower than
// with oneDNN (bench/RESULTS.md, "OpenBLAS on a CPU newer than it"). oneDNN reads the CPU's features.
bool blas_lags() {
  static const bool lags = blas_core_predates_cpu();
  return lags;
}

// Products that OpenBLAS runs while its kernels predate the CPU: say once where they are slow and what
// helps (f64 always goes to OpenBLAS; f32 of 32^3 or more only under KILN_CPU_MATMUL=blas or in a build
// without oneDNN).
void note_blas_lags() {
  static const bool noted = [] {
    std::fprintf(stderr,
                 "kiln: OpenBLAS runs its '%s' kernels, which predate this CPU (it has AVX2 or better): the matmuls it runs (f64; "
                 "f32 under KILN_CPU_MATMUL=blas or without oneDNN) are several times slower than they could be; "
                 "OPENBLAS_CORETYPE=Haswell, or SkylakeX where the CPU has AVX-512, set before the program starts chooses "
                 "faster ones\n",
                 std::string(blas_core()).c_str());
    return true;
  }();
  (void)noted;
}

template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
  const auto TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  const auto m = static_cast<blasint>(M), n = static_cast<blasint>(N), k = static_cast<blasint>(K);
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, TA, TB, m, n, k, 1.0f, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), 0.0f, c,
                static_cast<blasint>(ldc));
  else
    cblas_dgemm(CblasRowMajor, TA, TB, m, n, k, 1.0, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), 0.0, c,
                static_cast<blasint>(ldc));
}

template <class T> void run_blas(const Problem& p, const T* a, const T* b, T* c) {
  const auto one = [&](size_t i) {
    gemm<T>(p.a.trans, p.b.trans, p.M, p.N, p.K, a + p.oa[i], p.a.ld, b + p.ob[i], p.b.ld, c + p.oc[i], p.ldc);
  };
  const auto bt = static_cast<int64_t>(p.oa.size());
  const double flops = 2.0 * static_cast<double>(p.M) * static_cast<double>(p.N) * static_cast<double>(p.K);
  sync_omp_threads();
  if (bt > 1 && flops < kSmallGemmFlops && bt >= num_threads()) {
    parallel_for(
        bt, 1,
        [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) one(static_cast<size_t>(i));
        },
        1);
  } else {
    for (size_t i = 0; i < p.oa.size(); ++i) one(i);
  }
}

#ifdef KILN_HAVE_ONEDNN
// ---------------------------------------------------------------------------------- oneDNN
constexpr double kDnnlMinFlops = 2.0 * 32 * 32 * 32;
constexpr double kDnnlMaxFlops = 2.0 * 1024 * 1024 * 1024;  // single GEMMs at least this big: OpenBLAS

// One cache per thread: the primitive and its three memory objects per shape/stride signature, so a
// repeated call costs three set_data_handle calls and an execute (no lock, no descriptor work).
struct DnnlEntry {
  std::shared_ptr<dnnl::matmul> prim;  // null: oneDNN declined this layout
  dnnl::memory a, b, c;
};
struct VecHash {
  size_t operator()(const std::vector<int64_t>& v) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : v) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
    return h;
  }
};
struct DnnlThread {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  std::unordered_map<std::vector<int64_t>, DnnlEntry, VecHash> cache;
};

// The memory desc of one operand: batch dims (size 1 where the operand is broadcast) + the matrix.
dnnl::memory::desc dnnl_desc(const std::vector<int64_t>& bdims, const std::vector<int64_t>& bstr, int64_t rows, int64_t cols,
                             const Operand& op, dnnl::memory::data_type dt) {
  dnnl::memory::dims dims, strides;
  for (size_t i = 0; i < bdims.size(); ++i) {
    dims.push_back(bstr[i] == 0 ? 1 : bdims[i]);
    strides.push_back(bstr[i]);
  }
  dims.push_back(rows);
  dims.push_back(cols);
  strides.push_back(op.trans ? 1 : op.ld);
  strides.push_back(op.trans ? op.ld : 1);
  return {dims, dt, strides};
}

template <class T> constexpr dnnl::memory::data_type dnnl_type() {
  return std::is_same_v<T, bf16> ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// Does this CPU run oneDNN's bf16 kernels natively (AVX512-BF16 or AMX)? Without them oneDNN would
// emulate bf16 or fall to a reference kernel, slower than converting to f32 for sgemm.
bool dnnl_bf16_native() {
  static const bool yes = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto want = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (isa & want) == want;
  }();
  return yes;
}

// Runs the problem with oneDNN (batch addressed through bdims and strides from item 0's offsets);
// false when oneDNN declines the layout (or, for bf16, offers only its reference kernel).
template <class T> bool run_dnnl(const Problem& p, const T* a, const T* b, T* c) {
  thread_local DnnlThread t;
  constexpr auto dt = dnnl_type<T>();
  std::vector<int64_t> key{static_cast<int64_t>(dt), p.M, p.N, p.K, p.a.trans, p.a.ld, p.b.trans, p.b.ld, p.ldc};
  for (size_t i = 0; i < p.bdims.size(); ++i) key.insert(key.end(), {p.bdims[i], p.bsa[i], p.bsb[i], p.bsc[i]});
  auto it = t.cache.find(key);
  if (it == t.cache.end()) {
    const dnnl::memory::desc ad = dnnl_desc(p.bdims, p.bsa, p.M, p.K, p.a, dt), bd = dnnl_desc(p.bdims, p.bsb, p.K, p.N, p.b, dt),
                             cd = dnnl_desc(p.bdims, p.bsc, p.M, p.N, Operand{true, false, p.ldc}, dt);
    DnnlEntry e;
    try {
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), t.eng);
      const bool reference_kernel = std::string(pd.impl_info_str()).find("ref") != std::string::npos;
      if (dt != dnnl::memory::data_type::f32 && reference_kernel) throw dnnl::error(dnnl_unimplemented, "ref");
      e.prim = std::make_shared<dnnl::matmul>(pd);
      e.a = dnnl::memory(ad, t.eng, DNNL_MEMORY_NONE);
      e.b = dnnl::memory(bd, t.eng, DNNL_MEMORY_NONE);
      e.c = dnnl::memory(cd, t.eng, DNNL_MEMORY_NONE);
    } catch (const dnnl::error&) {
      e.prim = nullptr;
    }
    if (t.cache.size() > 256) t.cache.clear();
    it = t.cache.emplace(std::move(key), std::move(e)).first;
  }
  DnnlEntry& e = it->second;
  if (!e.prim) return false;
  e.a.set_data_handle(const_cast<T*>(a + p.oa[0]));
  e.b.set_data_handle(const_cast<T*>(b + p.ob[0]));
  e.c.set_data_handle(c + p.oc[0]);
  sync_omp_threads();
  e.prim->execute(t.stream, {{DNNL_ARG_SRC, e.a}, {DNNL_ARG_WEIGHTS, e.b}, {DNNL_ARG_DST, e.c}});
  t.stream.wait();
  return true;
}
#endif

// A contiguous copy of a view in dtype `to` (gemm::staging: a broadcast batch dim is not materialised).
struct Staged {
  std::shared_ptr<HostStorage> storage;
  Layout layout;
};
Staged stage(Cpu::V v, DType to) {
  const gemm::Staging st = gemm::staging(v.layout);
  Staged r{HostStorage::make(static_cast<size_t>(st.elements) * dtype_size(to)), st.layout};
  Cpu::copy(Cpu::M{*r.storage, st.dst, to}, Cpu::V{v.storage, st.src, v.dtype});
  return r;
}

// false only for bf16 when oneDNN declined: the caller then computes in f32.
template <class T> bool matmul_typed(Cpu::M out, Cpu::V a, Cpu::V b) {
  const Shape& os = out.layout.shape;
  const size_t r = os.size();
  const int64_t M = os[r - 2], N = os[r - 1], K = a.layout.shape[r - 1];
  if (out.layout.numel() == 0) return true;
  if (K == 0) {
    Cpu::fill(out, 0);
    return true;
  }

  // Stage operands BLAS cannot take as they are.
  Staged sa, sb, sc;
  const Layout* la = &a.layout;
  const Layout* lb = &b.layout;
  const Layout* lc = &out.layout;
  const T* pa = a.storage.as<T>();
  const T* pb = b.storage.as<T>();
  T* pc = out.storage.as<T>();
  auto mat = [](const Layout& l, int64_t rows, int64_t cols) { return gemm::classify(l, rows, cols); };
  Operand A = mat(*la, M, K), B = mat(*lb, K, N), C = mat(*lc, M, N);
  if (!A.ok) {
    sa = stage(a, dtype_of<T>);
    la = &sa.layout;
    pa = sa.storage->as<T>();
    A = mat(*la, M, K);
  }
  if (!B.ok) {
    sb = stage(b, dtype_of<T>);
    lb = &sb.layout;
    pb = sb.storage->as<T>();
    B = mat(*lb, K, N);
  }
  const bool stage_c = !C.ok || C.trans;
  if (stage_c) {
    sc = Staged{HostStorage::make(static_cast<size_t>(out.layout.numel()) * sizeof(T)), Layout(os)};
    lc = &sc.layout;
    pc = sc.storage->as<T>();
    C = mat(*lc, M, N);
  }

  Problem p;
  p.M = M;
  p.N = N;
  p.K = K;
  p.a = A;
  p.b = B;
  p.ldc = C.ld;
  const std::vector<gemm::BatchDim> dims = gemm::coalesce(*la, *lb, *lc);  // innermost first
  if (gemm::folds(dims, M, A, C)) {
    p.M = M * dims[0].size;  // fold the batch into M
    p.oa = {la->offset};
    p.ob = {lb->offset};
    p.oc = {lc->offset};
  } else {
    gemm::for_each_item(dims, la->offset, lb->offset, lc->offset, [&](int64_t oa, int64_t ob, int64_t oc) {
      p.oa.push_back(oa);
      p.ob.push_back(ob);
      p.oc.push_back(oc);
    });
    for (size_t d = dims.size(); d-- > 0;) {  // oneDNN's batch dims, outermost first
      p.bdims.push_back(dims[d].size);
      p.bsa.push_back(dims[d].sa);
      p.bsb.push_back(dims[d].sb);
      p.bsc.push_back(dims[d].sc);
    }
  }

  bool done = false;
#ifdef KILN_HAVE_ONEDNN
  if constexpr (std::is_same_v<T, float>) {
    const double flops = 2.0 * static_cast<double>(p.M) * static_cast<double>(N) * static_cast<double>(K);
    const Lib lib = current_lib();
    const bool batched = p.oa.size() > 1 || !p.bdims.empty();
    const bool use =
        lib == Lib::onednn || (lib == Lib::automatic && flops >= kDnnlMinFlops && (batched || flops < kDnnlMaxFlops || blas_lags()));
    // oneDNN addresses the batch through (bdims, strides) from item 0's offsets (p.oa[0], ...).
    if (use) done = run_dnnl<float>(p, pa, pb, pc);
  }
  if constexpr (std::is_same_v<T, bf16>) done = run_dnnl<bf16>(p, pa, pb, pc);
#endif
  if constexpr (std::is_same_v<T, bf16>) {
    if (!done) return false;
  } else if (!done) {
    if (blas_lags() && (std::is_same_v<T, double> || p.M * p.N * p.K >= 32 * 32 * 32)) note_blas_lags();
    run_blas<T>(p, pa, pb, pc);
  }
  if (stage_c) Cpu::copy(out, Cpu::V{*sc.storage, sc.layout, out.dtype});
  return true;
}

// Half-precision products without a native kernel: f32 compute, one notice per process.
void half_via_f32(Cpu::M out, Cpu::V a, Cpu::V b) {
  static const bool noticed = [&] {
    std::fprintf(stderr, "kiln: %s matmuls on this Cpu compute in f32 (native kernels: bf16 with AVX512-BF16 or AMX only)\n",
                 std::string(dtype_name(a.dtype)).c_str());
    return true;
  }();
  (void)noticed;
  const Staged fa = stage(a, DType::f32), fb = stage(b, DType::f32);
  Staged fc{HostStorage::make(static_cast<size_t>(out.layout.numel()) * 4), Layout(out.layout.shape)};
  matmul_typed<float>(Cpu::M{*fc.storage, fc.layout, DType::f32}, Cpu::V{*fa.storage, fa.layout, DType::f32},
                      Cpu::V{*fb.storage, fb.layout, DType::f32});
  Cpu::copy(out, Cpu::V{*fc.storage, fc.layout, DType::f32});
}

}  // namespace

bool native_bf16_matmul() {
#ifdef KILN_HAVE_ONEDNN
  return dnnl_bf16_native() && current_lib() != Lib::blas;
#else
  return false;
#endif
}

void set_matmul_library(std::string_view name) { lib_setting().store(parse_lib(name, "set_matmul_library"), std::memory_order_relaxed); }
std::string_view matmul_library() { return kLibNames[static_cast<size_t>(current_lib())]; }

std::string_view blas_core() {
  static const std::string core = [] {
    const char* c = openblas_get_corename();
    return std::string(c ? c : "unknown");
  }();
  return core;
}

bool blas_core_predates_cpu() {
  return cpu::blas_core_predates(blas_core(), cpu::best_isa() != cpu::Isa::baseline);  // avx2 and avx512 both have FMA
}

namespace cpu {
bool blas_core_predates(std::string_view core, bool cpu_has_avx2_fma) {
  if (!cpu_has_avx2_fma) return false;
  // OpenBLAS's x86-64 cores from before AVX2 + FMA (its dynamic build's names; "Sandybridge" has AVX
  // without FMA); the AVX2 and AVX-512 ones (Haswell, Excavator, Zen, SkylakeX, Cooperlake,
  // SapphireRapids, and what later versions add) are not listed, so a name this list does not know counts
  // as current.
  static constexpr std::string_view kOld[] = {"unknown",   "katmai", "coppermine",  "northwood", "prescott",  "banias",     "atom",
                                              "core2",     "penryn", "dunnington",  "nehalem",   "athlon",    "opteron",    "opteron_sse3",
                                              "barcelona", "nano",   "sandybridge", "bobcat",    "bulldozer", "piledriver", "steamroller"};
  std::string lower(core);
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (std::string_view old : kOld)
    if (lower == old) return true;
  return false;
}
}  // namespace cpu

void Cpu::matmul(M out, V a, V b) {
  const size_t r = out.layout.shape.size();
  KILN_CHECK(r >= 2 && a.layout.shape.size() == r && b.layout.shape.size() == r, "matmul: ranks differ or < 2: {} @ {} -> {}",
             shape_str(a.layout.shape), shape_str(b.layout.shape), shape_str(out.layout.shape));
  KILN_CHECK(a.dtype == b.dtype && a.dtype == out.dtype, "matmul: dtypes differ: {} @ {} -> {}", a.dtype, b.dtype, out.dtype);
  const int64_t K = a.layout.shape[r - 1];
  KILN_CHECK(
      b.layout.shape[r - 2] == K && a.layout.shape[r - 2] == out.layout.shape[r - 2] && b.layout.shape[r - 1] == out.layout.shape[r - 1],
      "matmul: {} @ {} -> {}: shapes do not match", shape_str(a.layout.shape), shape_str(b.layout.shape), shape_str(out.layout.shape));
  switch (a.dtype) {
    case DType::f32:
      matmul_typed<float>(out, a, b);
      return;
    case DType::f64:
      matmul_typed<double>(out, a, b);
      return;
    case DType::bf16:
#ifdef KILN_HAVE_ONEDNN
      if (native_bf16_matmul() && matmul_typed<bf16>(out, a, b)) return;
#endif
      return half_via_f32(out, a, b);
    case DType::f16:
      return half_via_f32(out, a, b);
    default:
      fail("matmul: not supported for dtype {} ({} @ {})", a.dtype, shape_str(a.layout.shape), shape_str(b.layout.shape));
  }
}

}  // namespace kiln
