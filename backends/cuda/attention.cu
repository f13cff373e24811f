// Flash attention on the Cuda backend, forward and backward (contract: core/fused.hpp; the same
// algorithm and formulas as backends/cpu/attention.cpp). Two kernel sets: the tensor-core kernels
// (below, "tensor-core kernels") for f32 with head dims that are multiples of 8 up to 128, and plain
// SIMT FMA kernels for everything else: f32 in f32 and f64 in f64, head dims d, dv up to 256. bf16/f16
// inputs run the f32 kernels on their widened values, except where their own kernels take them (below,
// "half-precision forward" and "half-precision backward": bf16/f16 products, P and dS rounded to the
// inputs' dtype; d a multiple of 16, dv of 8 forward and of 16 backward). The FMA kernels first:
//
// Every kernel runs 128 threads as 16 groups of 8 consecutive lanes (a group never straddles a warp).
// A group owns one query row (forward, dQ) or one key (dK/dV); its 8 threads split that row's keys
// (scores) or its output columns (thread g owns columns g, g + 8, g + 16, ...: accumulators in
// registers, NC per thread, NC = 8, 16 or 32 by head dim). Row statistics (running max, sum) are
// reduced over the group with xor shuffles, so all 8 threads hold bit-identical copies.
//
// Forward (FlashAttention-2): one block per (batch, head, tile of 16 query rows), heaviest causal
// tiles first. The Q tile is staged in shared memory once; K and V tiles of BC keys (32 for f32, 16
// for f64) are staged in turn. Per key tile: S = scale · Q Kᵀ (+ the user's additive mask), masked
// (causal: key j > pos0 + i, padding: key_padding false, a bool mask false) to −inf, m' = max(m, rowmax S), P = exp(S − m'), l = l·e^(m−m')
// + ΣP, O = O·e^(m−m') + P V. At the end O /= l and LSE = m + log l. Key tiles no row of the block can see (causal) are never visited. A
// row with no visible key keeps l = 0: O = 0 · (1/0) = NaN, LSE = −inf.
//
// Backward (recompute from LSE, deterministic: no atomics):
//   1. D_i = rowsum(dO_i ⊙ O_i) (0 for a row with LSE = −inf), one warp per row.
//   2. dK, dV: one block per (batch, kv head, tile of 16 keys), K and V tiles staged once; it walks
//      the query heads of its GQA group and their tiles of 16 query rows that can see the key tile,
//      and per query tile computes P = exp(S − LSE), dP = dO Vᵀ, dS = scale · P ⊙ (dP − D), then
//      dV += Pᵀ dO, dK += dSᵀ Q (the group of key j accumulates row j in registers).
//   3. dQ: one block per (batch, head, tile of 16 query rows), Q and dO staged once; it walks the key
//      tiles the rows can see, recomputes P and dS and accumulates dQ += dS K in registers.
// Masked keys and rows with no visible key get P = dS = 0, so they contribute nothing.
//
// The user's attention mask (bool or additive) is read straight from its [B, H, T, S] view with the
// view's strides (zero on broadcast dims), one element per score, only where the score is otherwise
// visible: nothing of size T·S is allocated.
//
// Shared memory: tiles read down a column by the 8 threads of a group have an odd leading dimension
// (bank-conflict free). Sizes are computed by one function for the host and the device; above the
// 48 KiB default a kernel opts in (cudaFuncSetAttribute) up to the device's per-block maximum, and
// beyond that (large d with f64 on small GPUs) throws kiln::Error naming the shapes. Largest case,
// d = dv = 256: forward 84 KiB (f32) / 98 KiB (f64), dK/dV 66 / 133 KiB, dQ 98 / 131 KiB.
#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <string_view>

#include "kiln/backends/cuda/cuda.hpp"
#include "kiln/backends/cuda/dense_common.cuh"
#include "kiln/backends/cuda/mma.cuh"

namespace kiln {

namespace {

using namespace cuda;
using namespace cuda::dense;

constexpr int kThreads = 128;           // threads per block, every kernel
constexpr int kTPR = 8;                 // threads per group (per query row / per key)
constexpr int kRows = kThreads / kTPR;  // 16 groups: query rows per block (forward, dQ), keys per block (dK/dV)
constexpr int kQTile = 16;              // dK/dV: query rows per tile
constexpr int kNU2 = kQTile / kTPR;     // dK/dV: query rows per thread in the score phase
constexpr int kMaxHead = 256;           // d, dv <= this (NC <= 32)
constexpr int kDeltaWarps = 4;          // D kernel: rows (warps) per block
template <class T> constexpr int kKeyTile = sizeof(T) == 4 ? 32 : 16;  // forward, dQ: keys per tile
static_assert(kThreads % kWarp == 0 && kWarp % kTPR == 0 && kQTile % kTPR == 0 && kKeyTile<float> % kTPR == 0 &&
              kKeyTile<double> % kTPR == 0 && kKeyTile<float> <= kThreads && kRows <= kThreads && kQTile <= kThreads);

// An odd leading dimension >= n.
__host__ __device__ constexpr int odd(int n) { return n | 1; }

// A [B, heads, rows, width] operand with a unit-stride last dim: element (b, h, t, x) at
// p + b sb + h sh + t st + x.
template <class T> struct Rows4 {
  const T* p = nullptr;
  int64_t sb = 0, sh = 0, st = 0;
  __device__ const T* row(int64_t b, int64_t h, int64_t t) const { return p + b * sb + h * sh + t * st; }
};

template <class T> struct Params {
  Rows4<T> q, k, v, o, g;        // o, g (dO): backward only
  const unsigned char* kp;       // key_padding [B, S] (bool bytes) or nullptr
  const void* mask;              // the user's mask, a [B, H, T, S] view, or nullptr
  int mkind;                     // 0 none, 1 bool, 2 additive (T)
  int64_t msb, msh, mst, mss;    // the mask view's strides
  int64_t nb, nh, nhkv, tq, sk;  // B, H, Hkv, T, S
  int d, dv, rep;                // head dims, H / Hkv
  compute_t<T> scale;            // (f32 for bf16/f16 operands, as an additive mask's values)
  bool causal;
  int64_t pos0;
  bool v4;  // q, k, v (and o, dO) rows start 16-byte aligned: the tensor-core kernels load them as float4
};

// Group (8 lanes) reductions: every lane of the group gets the result. Must be reached by all 32
// lanes of the warp.
template <class T> __device__ __forceinline__ T group_max(T v) {
#pragma unroll
  for (int off = kTPR / 2; off > 0; off /= 2) {
    const T u = __shfl_xor_sync(0xffffffffu, v, off);
    v = u > v ? u : v;
  }
  return v;
}
template <class T> __device__ __forceinline__ T group_sum(T v) {
#pragma unroll
  for (int off = kTPR / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Copies rows [t0, t0 + n) of one (b, h) of an operand into a [R, ld] shared tile (R = the tile's
// rows: rows >= n are zero-filled). All threads of the block take part.
template <class T>
__device__ __forceinline__ void load_tile(T* dst, int ld, int R, const T* src, int64_t st, int64_t t0, int n, int width) {
  for (int e = static_cast<int>(threadIdx.x); e < R * width; e += kThreads) {
    const int r = e / width, x = e - r * width;
    dst[r * ld + x] = r < n ? src[(t0 + r) * st + x] : T(0);
  }
}

// The user's mask at (b, h, i, j) for a score that is otherwise visible (vis): a bool mask clears vis,
// an additive one is returned (0 when there is none). Rows i >= T (a last tile's padding rows) read
// nothing.
template <class T>
__device__ __forceinline__ compute_t<T> user_mask(const Params<T>& P, int64_t b, int64_t h, int64_t i, int64_t j, bool& vis) {
  using C = compute_t<T>;
  if (P.mkind == 0 || !vis || i >= P.tq) return C(0);
  const int64_t off = b * P.msb + h * P.msh + i * P.mst + j * P.mss;
  if (P.mkind == 1) {
    vis = static_cast<const unsigned char*>(P.mask)[off] != 0;
    return C(0);
  }
  return static_cast<const C*>(P.mask)[off];
}

// ------------------------------------------------------------------------------- shared memory plans
// Offsets in elements of T; the int key flags follow the last T array.
struct FwdSmem {
  int q, k, v, p, kval;
  size_t bytes;
};
template <class T> __host__ __device__ constexpr FwdSmem fwd_smem(int d, int dv) {
  constexpr int BC = kKeyTile<T>;
  FwdSmem s{};
  s.q = 0;                          // Q   [kRows, odd(d)]
  s.k = s.q + kRows * odd(d);       // K   [BC, odd(d)]
  s.v = s.k + BC * odd(d);          // V   [BC, dv]
  s.p = s.v + BC * dv;              // P   [kRows, BC + 1]
  s.kval = s.p + kRows * (BC + 1);  // key visible (padding, range) [BC] ints
  s.bytes = static_cast<size_t>(s.kval) * sizeof(T) + BC * sizeof(int);
  return s;
}

struct DkvSmem {
  int k, v, q, g, p, ds, l, dd, kval;
  size_t bytes;
};
template <class T> __host__ __device__ constexpr DkvSmem dkv_smem(int d, int dv) {
  DkvSmem s{};
  s.k = 0;                            // K   [kRows, odd(d)]
  s.v = s.k + kRows * odd(d);         // V   [kRows, odd(dv)]
  s.q = s.v + kRows * odd(dv);        // Q   [kQTile, odd(d)]
  s.g = s.q + kQTile * odd(d);        // dO  [kQTile, odd(dv)]
  s.p = s.g + kQTile * odd(dv);       // P   [kQTile, kRows + 1]
  s.ds = s.p + kQTile * (kRows + 1);  // dS  [kQTile, kRows + 1]
  s.l = s.ds + kQTile * (kRows + 1);  // LSE [kQTile]
  s.dd = s.l + kQTile;                // D   [kQTile]
  s.kval = s.dd + kQTile;             // key visible [kRows] ints
  s.bytes = static_cast<size_t>(s.kval) * sizeof(T) + kRows * sizeof(int);
  return s;
}

struct DqSmem {
  int q, g, k, v, ds, kval;
  size_t bytes;
};
template <class T> __host__ __device__ constexpr DqSmem dq_smem(int d, int dv) {
  constexpr int BC = kKeyTile<T>;
  DqSmem s{};
  s.q = 0;                           // Q   [kRows, odd(d)]
  s.g = s.q + kRows * odd(d);        // dO  [kRows, odd(dv)]
  s.k = s.g + kRows * odd(dv);       // K   [BC, odd(d)]
  s.v = s.k + BC * odd(d);           // V   [BC, odd(dv)]
  s.ds = s.v + BC * odd(dv);         // dS  [kRows, BC + 1]
  s.kval = s.ds + kRows * (BC + 1);  // key visible [BC] ints
  s.bytes = static_cast<size_t>(s.kval) * sizeof(T) + BC * sizeof(int);
  return s;
}

// Key flags of a tile [j0, j0 + n) in a [R]-entry array: visible unless out of range or padded.
__device__ __forceinline__ void load_kval(int* kval, int R, const unsigned char* kp_row, int64_t j0, int n) {
  for (int c = static_cast<int>(threadIdx.x); c < R; c += kThreads) kval[c] = c < n && (!kp_row || kp_row[j0 + c] != 0) ? 1 : 0;
}

// ------------------------------------------------------------------------------------------ forward
// Grid: kRows-row query tiles × B·H, unit = tile-from-the-end · B·H + (b·H + h).
template <class T, int NC> __global__ void __launch_bounds__(kThreads)
    attn_fwd(const Params<T> P, T* __restrict__ o, T* __restrict__ lse, int64_t nqt) {
  constexpr int BC = kKeyTile<T>;
  constexpr int NU = BC / kTPR;  // keys per thread in the score phase
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const sm = reinterpret_cast<T*>(smem_raw);
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  const int d = P.d, dv = P.dv;
  const FwdSmem L = fwd_smem<T>(d, dv);
  T* const Qs = sm + L.q;
  T* const Ks = sm + L.k;
  T* const Vs = sm + L.v;
  T* const Ps = sm + L.p;
  int* const kval = reinterpret_cast<int*>(sm + L.kval);
  const int ldq = odd(d), ldk = odd(d), ldv = dv, ldp = BC + 1;

  const int64_t BH = P.nb * P.nh;
  const int64_t unit = blockIdx.x;
  const int64_t qt = nqt - 1 - unit / BH, bh = unit % BH;
  const int64_t b = bh / P.nh, h = bh % P.nh, hk = h / P.rep;
  const int64_t i0 = qt * kRows;
  const int br = static_cast<int>(P.tq - i0 < kRows ? P.tq - i0 : kRows);
  const int tid = static_cast<int>(threadIdx.x), r = tid / kTPR, g = tid % kTPR;
  const int64_t i = i0 + r;  // this group's query row (>= T for the padding rows of a last tile)

  load_tile(Qs, ldq, kRows, P.q.row(b, h, 0), P.q.st, i0, br, d);
  const T* const kb = P.k.row(b, hk, 0);
  const T* const vb = P.v.row(b, hk, 0);
  const unsigned char* const kpb = P.kp ? P.kp + b * P.sk : nullptr;
  // keys [0, kend) are visible to some row of the tile
  const int64_t kend = P.causal ? (P.pos0 + i0 + br < P.sk ? P.pos0 + i0 + br : P.sk) : P.sk;

  T m = ninf, l = 0;
  T acc[NC];
#pragma unroll
  for (int k = 0; k < NC; ++k) acc[k] = 0;

  for (int64_t j0 = 0; j0 < kend; j0 += BC) {
    const int bc = static_cast<int>(kend - j0 < BC ? kend - j0 : BC);
    __syncthreads();  // the previous tile's reads of Ks, Vs, Ps are done
    load_tile(Ks, ldk, BC, kb, P.k.st, j0, bc, d);
    load_tile(Vs, ldv, BC, vb, P.v.st, j0, bc, dv);
    load_kval(kval, BC, kpb, j0, bc);
    __syncthreads();

    // scores of keys c = g + kTPR u
    T s[NU];
#pragma unroll
    for (int u = 0; u < NU; ++u) s[u] = 0;
    for (int x = 0; x < d; ++x) {
      const T qx = Qs[r * ldq + x];
#pragma unroll
      for (int u = 0; u < NU; ++u) s[u] += qx * Ks[(g + kTPR * u) * ldk + x];
    }
    T tmax = ninf;
#pragma unroll
    for (int u = 0; u < NU; ++u) {
      const int c = g + kTPR * u;
      bool vis = kval[c] != 0 && (!P.causal || j0 + c <= P.pos0 + i);
      const T madd = user_mask(P, b, h, i, j0 + c, vis);
      s[u] = vis ? P.scale * s[u] + madd : ninf;
      tmax = s[u] > tmax ? s[u] : tmax;
    }
    tmax = group_max(tmax);
    const T mnew = tmax > m ? tmax : m;
    T alpha = 1, psum = 0;
    T p[NU];
    if (mnew != ninf) {
      alpha = m == ninf ? T(0) : dexp(m - mnew);
#pragma unroll
      for (int u = 0; u < NU; ++u) {
        p[u] = dexp(s[u] - mnew);  // exp(−inf) = 0 for masked keys
        psum += p[u];
      }
    } else {  // nothing visible to this row yet
#pragma unroll
      for (int u = 0; u < NU; ++u) p[u] = 0;
    }
    psum = group_sum(psum);
    l = l * alpha + psum;
    m = mnew;
#pragma unroll
    for (int u = 0; u < NU; ++u) Ps[r * ldp + g + kTPR * u] = p[u];
#pragma unroll
    for (int k = 0; k < NC; ++k) acc[k] *= alpha;
    __syncthreads();

    // O += P V for this thread's columns c = g + kTPR k
    for (int j = 0; j < bc; ++j) {
      const T pj = Ps[r * ldp + j];
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        const int c = g + kTPR * k;
        if (c < dv) acc[k] += pj * Vs[j * ldv + c];
      }
    }
  }

  if (r < br) {
    const T inv = T(1) / l;  // l = 0 (no visible key): 0 · inf = NaN, as PyTorch
    T* const orow = o + (bh * P.tq + i) * dv;
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int c = g + kTPR * k;
      if (c < dv) orow[c] = acc[k] * inv;
    }
    if (g == 0) lse[bh * P.tq + i] = m + dlog(l);  // −inf + log 0 = −inf
  }
}

// -------------------------------------------------------------------------------- backward: D = Σ dO·O
// One warp per row x of [B, H, T]; D[x] = 0 where lse[x] = −inf (O is NaN there).
// bf16/f16 operands: D and LSE in f32 (compute_t).
template <class T> __global__ void __launch_bounds__(kDeltaWarps* kWarp)
    attn_bwd_delta(const Params<T> P, const compute_t<T>* __restrict__ lse, compute_t<T>* __restrict__ D) {
  using C = compute_t<T>;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t rows = P.nb * P.nh * P.tq;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kDeltaWarps;
  for (int64_t x = static_cast<int64_t>(blockIdx.x) * kDeltaWarps + threadIdx.x / kWarp; x < rows; x += step) {
    const int64_t t = x % P.tq, bh = x / P.tq, b = bh / P.nh, h = bh % P.nh;
    const T* const orow = P.o.row(b, h, t);
    const T* const grow = P.g.row(b, h, t);
    C acc = 0;
    for (int c = lane; c < P.dv; c += kWarp) acc += ld(orow + c) * ld(grow + c);
    acc = warp_sum(acc);
    if (lane == 0) D[x] = lse[x] == -std::numeric_limits<C>::infinity() ? C(0) : acc;
  }
}

// ----------------------------------------------------------------------------- backward: dK and dV
// Grid: kRows-key tiles × B·Hkv, unit = key tile · B·Hkv + (b·Hkv + hk) (low key tiles, which more
// causal queries see, first). The group of key j (jj = tid / 8) owns dK[j], dV[j].
template <class T, int NC> __global__ void __launch_bounds__(kThreads)
    attn_bwd_dkdv(const Params<T> P, const T* __restrict__ lse, const T* __restrict__ D, T* __restrict__ dk, T* __restrict__ dvo) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const sm = reinterpret_cast<T*>(smem_raw);
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  const int d = P.d, dv = P.dv;
  const DkvSmem L = dkv_smem<T>(d, dv);
  T* const Ks = sm + L.k;
  T* const Vs = sm + L.v;
  T* const Qs = sm + L.q;
  T* const Gs = sm + L.g;
  T* const Ps = sm + L.p;
  T* const Ss = sm + L.ds;
  T* const Ls = sm + L.l;
  T* const Ds = sm + L.dd;
  int* const kval = reinterpret_cast<int*>(sm + L.kval);
  const int ldk = odd(d), ldv = odd(dv), ldq = odd(d), ldg = odd(dv), ldp = kRows + 1;

  const int64_t BHk = P.nb * P.nhkv;
  const int64_t unit = blockIdx.x;
  const int64_t kt = unit / BHk, bk = unit % BHk;
  const int64_t b = bk / P.nhkv, hk = bk % P.nhkv;
  const int64_t j0 = kt * kRows;
  const int bkn = static_cast<int>(P.sk - j0 < kRows ? P.sk - j0 : kRows);
  const int tid = static_cast<int>(threadIdx.x), jj = tid / kTPR, g = tid % kTPR;
  const int64_t j = j0 + jj;  // this group's key (>= S for the padding keys of a last tile)

  load_tile(Ks, ldk, kRows, P.k.row(b, hk, 0), P.k.st, j0, bkn, d);
  load_tile(Vs, ldv, kRows, P.v.row(b, hk, 0), P.v.st, j0, bkn, dv);
  load_kval(kval, kRows, P.kp ? P.kp + b * P.sk : nullptr, j0, bkn);

  T dka[NC], dva[NC];
#pragma unroll
  for (int k = 0; k < NC; ++k) dka[k] = dva[k] = 0;

  // queries i < j0 − pos0 see no key of the tile
  const int64_t i_first = P.causal ? (j0 - P.pos0 > 0 ? j0 - P.pos0 : 0) : 0;
  for (int hr = 0; hr < P.rep; ++hr) {
    const int64_t h = hk * P.rep + hr, bh = b * P.nh + h;
    for (int64_t i0 = i_first; i0 < P.tq; i0 += kQTile) {
      const int bq = static_cast<int>(P.tq - i0 < kQTile ? P.tq - i0 : kQTile);
      __syncthreads();  // the previous tile's reads are done (and, the first time, Ks/Vs/kval are visible after the next one)
      load_tile(Qs, ldq, kQTile, P.q.row(b, h, 0), P.q.st, i0, bq, d);
      load_tile(Gs, ldg, kQTile, P.g.row(b, h, 0), P.g.st, i0, bq, dv);
      for (int e = tid; e < kQTile; e += kThreads) {
        Ls[e] = e < bq ? lse[bh * P.tq + i0 + e] : ninf;  // padding rows: "no visible key"
        Ds[e] = e < bq ? D[bh * P.tq + i0 + e] : T(0);
      }
      __syncthreads();

      // P and dS for query rows il = g + kTPR u and key jj
      const bool key_ok = kval[jj] != 0;
#pragma unroll
      for (int u = 0; u < kNU2; ++u) {
        const int il = g + kTPR * u;
        T s = 0, dp = 0;
        for (int x = 0; x < d; ++x) s += Qs[il * ldq + x] * Ks[jj * ldk + x];
        for (int x = 0; x < dv; ++x) dp += Gs[il * ldg + x] * Vs[jj * ldv + x];
        const T li = Ls[il];
        bool vis = key_ok && li != ninf && (!P.causal || j <= P.pos0 + i0 + il);
        const T madd = user_mask(P, b, h, i0 + il, j, vis);
        const T p = vis ? dexp(P.scale * s + madd - li) : T(0);
        Ps[il * ldp + jj] = p;
        Ss[il * ldp + jj] = vis ? P.scale * p * (dp - Ds[il]) : T(0);
      }
      __syncthreads();

      // dV[j] += Σ_i P[i, j] dO[i],  dK[j] += Σ_i dS[i, j] Q[i]  (columns c = g + kTPR k)
      for (int il = 0; il < bq; ++il) {
        const T p = Ps[il * ldp + jj], ds = Ss[il * ldp + jj];
#pragma unroll
        for (int k = 0; k < NC; ++k) {
          const int c = g + kTPR * k;
          if (c < dv) dva[k] += p * Gs[il * ldg + c];
          if (c < d) dka[k] += ds * Qs[il * ldq + c];
        }
      }
    }
  }

  if (jj < bkn) {
    T* const dkr = dk + ((b * P.nhkv + hk) * P.sk + j) * d;
    T* const dvr = dvo + ((b * P.nhkv + hk) * P.sk + j) * dv;
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int c = g + kTPR * k;
      if (c < d) dkr[c] = dka[k];
      if (c < dv) dvr[c] = dva[k];
    }
  }
}

// ------------------------------------------------------------------------------------ backward: dQ
// Grid as the forward's. The group of query row i owns dQ[i].
template <class T, int NC> __global__ void __launch_bounds__(kThreads)
    attn_bwd_dq(const Params<T> P, const T* __restrict__ lse, const T* __restrict__ D, T* __restrict__ dq, int64_t nqt) {
  constexpr int BC = kKeyTile<T>;
  constexpr int NU = BC / kTPR;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const sm = reinterpret_cast<T*>(smem_raw);
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  const int d = P.d, dv = P.dv;
  const DqSmem L = dq_smem<T>(d, dv);
  T* const Qs = sm + L.q;
  T* const Gs = sm + L.g;
  T* const Ks = sm + L.k;
  T* const Vs = sm + L.v;
  T* const Ss = sm + L.ds;
  int* const kval = reinterpret_cast<int*>(sm + L.kval);
  const int ldq = odd(d), ldg = odd(dv), ldk = odd(d), ldv = odd(dv), ldp = BC + 1;

  const int64_t BH = P.nb * P.nh;
  const int64_t unit = blockIdx.x;
  const int64_t qt = nqt - 1 - unit / BH, bh = unit % BH;
  const int64_t b = bh / P.nh, h = bh % P.nh, hk = h / P.rep;
  const int64_t i0 = qt * kRows;
  const int br = static_cast<int>(P.tq - i0 < kRows ? P.tq - i0 : kRows);
  const int tid = static_cast<int>(threadIdx.x), r = tid / kTPR, g = tid % kTPR;
  const int64_t i = i0 + r;

  load_tile(Qs, ldq, kRows, P.q.row(b, h, 0), P.q.st, i0, br, d);
  load_tile(Gs, ldg, kRows, P.g.row(b, h, 0), P.g.st, i0, br, dv);
  const T li = r < br ? lse[bh * P.tq + i] : ninf;  // padding rows: "no visible key"
  const T di = r < br ? D[bh * P.tq + i] : T(0);
  const T* const kb = P.k.row(b, hk, 0);
  const T* const vb = P.v.row(b, hk, 0);
  const unsigned char* const kpb = P.kp ? P.kp + b * P.sk : nullptr;
  const int64_t kend = P.causal ? (P.pos0 + i0 + br < P.sk ? P.pos0 + i0 + br : P.sk) : P.sk;

  T dqa[NC];
#pragma unroll
  for (int k = 0; k < NC; ++k) dqa[k] = 0;

  for (int64_t j0 = 0; j0 < kend; j0 += BC) {
    const int bc = static_cast<int>(kend - j0 < BC ? kend - j0 : BC);
    __syncthreads();  // the previous tile's reads of Ks, Vs, Ss are done
    load_tile(Ks, ldk, BC, kb, P.k.st, j0, bc, d);
    load_tile(Vs, ldv, BC, vb, P.v.st, j0, bc, dv);
    load_kval(kval, BC, kpb, j0, bc);
    __syncthreads();

    // dS for row r and keys c = g + kTPR u
#pragma unroll
    for (int u = 0; u < NU; ++u) {
      const int c = g + kTPR * u;
      T s = 0, dp = 0;
      for (int x = 0; x < d; ++x) s += Qs[r * ldq + x] * Ks[c * ldk + x];
      for (int x = 0; x < dv; ++x) dp += Gs[r * ldg + x] * Vs[c * ldv + x];
      bool vis = kval[c] != 0 && li != ninf && (!P.causal || j0 + c <= P.pos0 + i);
      const T madd = user_mask(P, b, h, i, j0 + c, vis);
      const T p = vis ? dexp(P.scale * s + madd - li) : T(0);
      Ss[r * ldp + c] = vis ? P.scale * p * (dp - di) : T(0);
    }
    __syncthreads();

    // dQ[i] += Σ_j dS[i, j] K[j]  (columns c = g + kTPR k)
    for (int jl = 0; jl < bc; ++jl) {
      const T ds = Ss[r * ldp + jl];
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        const int c = g + kTPR * k;
        if (c < d) dqa[k] += ds * Ks[jl * ldk + c];
      }
    }
  }

  if (r < br) {
    T* const dqr = dq + (bh * P.tq + i) * d;
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int c = g + kTPR * k;
      if (c < d) dqr[c] = dqa[k];
    }
  }
}

// ------------------------------------------------------------------------- tensor-core kernels (f32)
// The same algorithm with every tile product on the tensor cores (mma.cuh: m16n8k8 TF32 products in
// the 3xTF32 split, so f32 accuracy is kept). Four warps per block; a warp owns 16 rows of a 64-row
// tile (query rows: forward, dQ; keys: dK/dV) and holds its products in mma fragments: a lane holds
// rows g and g + 8 (g = lane / 4) of its warp's block, columns 2t, 2t + 1 of every 8-column piece
// (t = lane % 4), so a row's statistics are reduced over the 4 lanes of a quad. P and dS go through a
// warp-private shared buffer to become the next product's A operand. A step takes BC = 32 or 64
// columns (keys forward and dQ, query rows dK/dV; tc_cols chooses). Tiles come from global memory
// as float4 where rows are 16-byte aligned, eight loads in flight per thread (load_rows). Same
// determinism as the FMA kernels (no atomics; the dK/dV and dQ passes recompute P). Taken for f32 with d
// and dv multiples of 8 up to 128 whose tiles fit the device's shared memory (use_tc), unless
// cuda::set_attention_tensor_cores(false).
constexpr int kTcRows = 64;  // rows per block (4 warps x 16)
constexpr int kTcMaxHead = 128;
static_assert(kTcRows == 16 * (kThreads / kWarp));

bool tc_fits(int64_t d, int64_t dv) { return d % 8 == 0 && dv % 8 == 0 && d > 0 && dv > 0 && d <= kTcMaxHead && dv <= kTcMaxHead; }

// Four tiles of kTcRows rows (the first `rows` of them) or BC rows (the others), the P/dS buffer
// [kTcRows, BC + 4], two [BC] row vectors, the key flags [kTcRows]. BC = the columns of a step: keys per
// tile (forward, dQ), query rows per tile (dK/dV). Leading dimensions w + 4 (conflict-free fragment reads
// of X and Xᵀ rows), w + 8 for a tile read as a B operand down its columns; all offsets 16-byte aligned.
struct TcSmem {
  int off[4], ld[4], p, l, dd, kval;
  size_t bytes;
};
__host__ __device__ constexpr TcSmem tc_smem(int bc, int rows, int ld0, int ld1, int ld2, int ld3) {
  TcSmem s{};
  const int lds[4] = {ld0, ld1, ld2, ld3};
  int at = 0;
  for (int x = 0; x < 4; ++x) {
    s.off[x] = at;
    s.ld[x] = lds[x];
    at += (x < rows ? kTcRows : bc) * lds[x];
  }
  s.p = at;
  at += kTcRows * (bc + 4);
  s.l = at;
  at += bc;
  s.dd = at;
  at += bc;
  at = (at + 3) & ~3;
  s.kval = at;
  s.bytes = static_cast<size_t>(at) * sizeof(float) + kTcRows * sizeof(int);
  return s;
}
__host__ __device__ constexpr TcSmem tc_fwd_smem(int bc, int d, int dv) { return tc_smem(bc, 1, d + 4, d + 4, dv + 8, 0); }  // Q, K, V
// dK/dV: K, V, Q, dO; dQ: Q, dO, K, V
__host__ __device__ constexpr TcSmem tc_bwd_smem(int bc, int d, int dv) { return tc_smem(bc, 2, d + 4, dv + 4, d + 4, dv + 4); }

// load_tile for the tensor-core kernels: rows [t0, t0 + n) of one (b, h) into a [R, ld] shared tile
// (rows >= n zero), as float4 where the rows allow it (P.v4; ld and width multiples of 4), kBatch loads
// in flight per thread before their stores, so a tile's global reads overlap.
__device__ __forceinline__ void load_rows(bool v4, float* dst, int ld, int R, const float* src, int64_t st, int64_t t0, int n, int width) {
  if (!v4) return load_tile(dst, ld, R, src, st, t0, n, width);
  constexpr int kBatch = 8;
  const int vpr = width / 4, total = R * vpr;
  for (int e0 = static_cast<int>(threadIdx.x); e0 < total; e0 += kBatch * kThreads) {
    float4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = e0 + u * kThreads, r = e / vpr, c = 4 * (e - r * vpr);
      v[u] = e < total && r < n ? *reinterpret_cast<const float4*>(src + (t0 + r) * st + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = e0 + u * kThreads, r = e / vpr, c = 4 * (e - r * vpr);
      if (e < total) *reinterpret_cast<float4*>(dst + r * ld + c) = v[u];
    }
  }
}

// Max and sum over the 4 lanes of a quad (one row of a fragment).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Writes a warp's 16 x 8nt fragments into the warp's rows of a row-major buffer (ld).
template <int NT> __device__ __forceinline__ void store_frags(float* W, int ld, const float (&c)[NT][4], int g, int t) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    W[g * ld + 8 * n + 2 * t] = c[n][0];
    W[g * ld + 8 * n + 2 * t + 1] = c[n][1];
    W[(g + 8) * ld + 8 * n + 2 * t] = c[n][2];
    W[(g + 8) * ld + 8 * n + 2 * t + 1] = c[n][3];
  }
}

template <int N> __device__ __forceinline__ void zero(float (&c)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0;
}

// The block of the forward and the dQ pass: (b, h), its tile of `rows` query rows from i0 (br of them
// real), the keys [0, kend) some row of the tile sees, and of the warp's `wrows` rows from r0: the keys
// [0, wend) some row sees and [0, wall) every row sees.
struct QueryTile {
  int64_t bh, b, h, hk, i0, kend, wend, wall;
  int br;
  template <class T> __device__ QueryTile(const Params<T>& P, int64_t nqt, int r0, int rows = kTcRows, int wrows = 16) {
    const int64_t BH = P.nb * P.nh, unit = blockIdx.x;
    bh = unit % BH;
    b = bh / P.nh, h = bh % P.nh, hk = h / P.rep;
    i0 = (nqt - 1 - unit / BH) * rows;
    br = static_cast<int>(P.tq - i0 < rows ? P.tq - i0 : rows);
    kend = P.causal ? (P.pos0 + i0 + br < P.sk ? P.pos0 + i0 + br : P.sk) : P.sk;
    wend = P.causal ? (P.pos0 + i0 + r0 + wrows < kend ? P.pos0 + i0 + r0 + wrows : kend) : kend;
    wall = P.causal ? (P.pos0 + i0 + r0 + 1 < kend ? P.pos0 + i0 + r0 + 1 : kend) : kend;
  }
  // Whether the key tile [j0, j0 + BC) is whole for the warp: no key padding and no user mask, and every
  // row of the warp sees every key of the tile (the rows past T of a last tile are computed and not
  // stored). Its scores then skip the per-element masks, which would all say "visible, add 0".
  template <class T> __device__ bool whole(const Params<T>& P, int64_t j0, int BC) const {
    return !P.kp && P.mkind == 0 && j0 + BC <= wall;
  }
};

// Stages the key tile [j0, j0 + BC) of a QueryTile's (b, kv head): K, V and the key flags (keys past the
// tile's end zero / invisible); returns how many keys are real. All threads of the block take part,
// between two barriers.
template <int BC> __device__ __forceinline__ int stage_keys(const Params<float>& P, const QueryTile& q, int64_t j0, float* Ks, int ldk,
                                                            float* Vs, int ldv, int* kval) {
  const int bc = static_cast<int>(q.kend - j0 < BC ? q.kend - j0 : BC);
  __syncthreads();  // the previous tile's reads of Ks, Vs are done
  load_rows(P.v4, Ks, ldk, BC, P.k.row(q.b, q.hk, 0), P.k.st, j0, bc, P.d);
  load_rows(P.v4, Vs, ldv, BC, P.v.row(q.b, q.hk, 0), P.v.st, j0, bc, P.dv);
  load_kval(kval, BC, P.kp ? P.kp + q.b * P.sk : nullptr, j0, bc);
  __syncthreads();
  return bc;
}

// The forward's online-softmax step on a warp's score fragments s (16 rows x BC keys from j0, this
// lane's rows irow): scale, the causal and key masks and the user's mask, the new row maxima m, P =
// exp(S − m) in place of s, the row sums l and O's accumulators acc rescaled. Shared by the f32 and the
// half-precision kernels. kWhole (QueryTile::whole): no masks to apply; the same floats (a visible
// score adds 0, as the masked form does).
template <bool kWhole, class T, int NB, int NV>
__device__ __forceinline__ void softmax_step_as(const Params<T>& P, int64_t b, int64_t h, const int64_t (&irow)[2], int64_t j0,
                                                const int* kval, int t, float (&s)[NB][4], float (&m)[2], float (&l)[2],
                                                float (&acc)[NV][4]) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  float mx[2] = {ninf, ninf};
#pragma unroll
  for (int n = 0; n < NB; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = 8 * n + 2 * t + (e & 1), rr = e >> 1;
      bool vis = kWhole || (kval[c] != 0 && (!P.causal || j0 + c <= P.pos0 + irow[rr]));
      const float madd = kWhole ? 0.f : user_mask(P, b, h, irow[rr], j0 + c, vis);
      s[n][e] = vis ? P.scale * s[n][e] + madd : ninf;
      mx[rr] = s[n][e] > mx[rr] ? s[n][e] : mx[rr];
    }
  }
  float alpha[2], mnew[2], psum[2] = {0, 0};
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const float tmax = quad_max(mx[rr]);
    mnew[rr] = tmax > m[rr] ? tmax : m[rr];
    alpha[rr] = mnew[rr] == ninf ? 1.f : (m[rr] == ninf ? 0.f : dexp(m[rr] - mnew[rr]));
  }
#pragma unroll
  for (int n = 0; n < NB; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int rr = e >> 1;
      s[n][e] = mnew[rr] == ninf ? 0.f : dexp(s[n][e] - mnew[rr]);  // exp(−inf) = 0 for masked keys
      psum[rr] += s[n][e];
    }
  }
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    l[rr] = l[rr] * alpha[rr] + quad_sum(psum[rr]);
    m[rr] = mnew[rr];
  }
#pragma unroll
  for (int n = 0; n < NV; ++n) {
    acc[n][0] *= alpha[0], acc[n][1] *= alpha[0];
    acc[n][2] *= alpha[1], acc[n][3] *= alpha[1];
  }
}

// The step above for a warp-uniform `whole` (QueryTile::whole): its masked or its unmasked form.
template <class T, int NB, int NV>
__device__ __forceinline__ void softmax_step(bool whole, const Params<T>& P, int64_t b, int64_t h, const int64_t (&irow)[2], int64_t j0,
                                             const int* kval, int t, float (&s)[NB][4], float (&m)[2], float (&l)[2], float (&acc)[NV][4]) {
  if (whole)
    softmax_step_as<true>(P, b, h, irow, j0, kval, t, s, m, l, acc);
  else
    softmax_step_as<false>(P, b, h, irow, j0, kval, t, s, m, l, acc);
}

// The forward's last step for this lane's rows: O = acc / l stored as O's type (rounded once for
// bf16/f16) and LSE = m + log l.
template <class T, int NV, class O>
__device__ __forceinline__ void finish_rows(const Params<T>& P, int64_t bh, const int64_t (&irow)[2], int t, const float (&acc)[NV][4],
                                            const float (&m)[2], const float (&l)[2], O* __restrict__ o, float* __restrict__ lse) {
  const int dv = P.dv, nv = dv / 8;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    if (irow[rr] >= P.tq) continue;
    const float inv = 1.f / l[rr];  // l = 0 (no visible key): 0 · inf = NaN, as PyTorch
    O* const orow = o + (bh * P.tq + irow[rr]) * dv;
#pragma unroll
    for (int n = 0; n < NV; ++n) {
      if (n < nv) {
        st(orow + 8 * n + 2 * t, acc[n][2 * rr] * inv);
        st(orow + 8 * n + 2 * t + 1, acc[n][2 * rr + 1] * inv);
      }
    }
    if (t == 0) lse[bh * P.tq + irow[rr]] = m[rr] + dlog(l[rr]);  // −inf + log 0 = −inf
  }
}

// Forward. Grid as attn_fwd's with kTcRows-row tiles. NV = the O accumulator's 8-column pieces. kExact
// (this and the backward kernels): q, k, v (and dO) hold bf16/f16 values, exact TF32 operands, so their
// products skip the split's zero low parts (mma.cuh): the same results in fewer products.
template <int BC, int NV, bool kExact> __global__ void __launch_bounds__(kThreads)
    attn_fwd_tc(const Params<float> P, float* __restrict__ o, float* __restrict__ lse, int64_t nqt) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* const sm = reinterpret_cast<float*>(smem_raw);
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const int d = P.d, dv = P.dv;
  const TcSmem L = tc_fwd_smem(BC, d, dv);
  float* const Qs = sm + L.off[0];
  float* const Ks = sm + L.off[1];
  float* const Vs = sm + L.off[2];
  int* const kval = reinterpret_cast<int*>(sm + L.kval);
  const int ldq = L.ld[0], ldk = L.ld[1], ldv = L.ld[2];

  const int tid = static_cast<int>(threadIdx.x), r0 = (tid / kWarp) * 16, lane = tid % kWarp, g = lane / 4, t = lane % 4;
  const QueryTile q(P, nqt, r0);
  const int64_t bh = q.bh, b = q.b, h = q.h;
  float* const Pw = sm + L.p + r0 * (BC + 4);
  const int64_t irow[2] = {q.i0 + r0 + g, q.i0 + r0 + g + 8};  // this lane's query rows (>= T: a last tile's padding)
  load_rows(P.v4, Qs, ldq, kTcRows, P.q.row(b, h, 0), P.q.st, q.i0, q.br, d);
  const int nv = dv / 8;

  float m[2] = {ninf, ninf}, l[2] = {0, 0};
  float acc[NV][4];
  zero(acc);
  for (int64_t j0 = 0; j0 < q.kend; j0 += BC) {
    const int bc = stage_keys<BC>(P, q, j0, Ks, ldk, Vs, ldv, kval);
    if (j0 >= q.wend) continue;  // (warp-uniform) no row of this warp sees these keys

    float s[BC / 8][4];
    zero(s);
    mma::warp_gemm<BC / 8, true, kExact, kExact>(s, Qs + r0 * ldq, ldq, Ks, ldk, d, BC / 8, g, t);

    softmax_step(q.whole(P, j0, BC), P, b, h, irow, j0, kval, t, s, m, l, acc);
    store_frags(Pw, (BC + 4), s, g, t);
    __syncwarp();
    mma::warp_gemm<NV, false, false, kExact>(acc, Pw, (BC + 4), Vs, ldv, (bc + 7) & ~7, nv, g, t);  // O += P V (keys past bc are zero)
    __syncwarp();  // the reads of Pw are done before the next tile's writes
  }

  finish_rows(P, bh, irow, t, acc, m, l, o, lse);
}

// ------------------------------------------------------------------------- half-precision forward
// bf16/f16 q, k, v on the tensor cores in their own precision (cuda::set_attention_half_products):
// S = Q·Kᵀ and O += P·V as m16n8k16 products of H values with f32 accumulation (mma::mma_h), the softmax
// in f32 (softmax_step), P rounded to H for its product, as FlashAttention-2 does; O rounded once to H,
// LSE f32. Tiles in shared memory as H bits, row-major: Q [64·MT, d + 8], K [BC, d + 8], V [BC,
// dv + 8] (fragments by ldmatrix, V's transposing). d a multiple of 16, dv of 8, both at most
// kTcMaxHead. Grid and blocks as attn_fwd_tc's.
struct HSmem {
  int k, v, kval;
  size_t bytes;
};
__host__ __device__ constexpr HSmem h_fwd_smem(int bc, int d, int dv, int rows) {
  const int k = rows * (d + 8), v = k + bc * (d + 8), kval = v + bc * (dv + 8);  // in H values (each 16-byte aligned)
  return {k, v, kval, static_cast<size_t>(kval) * 2 + static_cast<size_t>(bc) * sizeof(int)};
}
bool h_fits(int64_t d, int64_t dv) { return d % 16 == 0 && dv % 8 == 0 && d > 0 && dv > 0 && d <= kTcMaxHead && dv <= kTcMaxHead; }

// Rows [t0, t0 + n) of one (b, h) of a bf16/f16 operand into [R, ld] shared H bits (rows >= n zero), 8
// values (16 bytes) at a time where v8 (rows 16-byte aligned, width a multiple of 8). All threads.
// Where v8, the rows < n come as cp.async copies (device.cuh), in place once the issuing threads waited
// for them and a barrier followed; every other store is made at once.
template <class H>
__device__ __forceinline__ void load_h_rows(bool v8, uint16_t* dst, int ld, int R, const H* src, int64_t st, int64_t t0, int n, int width) {
  if (v8) {
    const int vpr = width / 8;
    for (int e = static_cast<int>(threadIdx.x); e < R * vpr; e += kThreads) {
      const int r = e / vpr, c = 8 * (e - r * vpr);
      if (r < n)
        cp_async16(dst + r * ld + c, src + (t0 + r) * st + c);
      else
        *reinterpret_cast<uint4*>(dst + r * ld + c) = make_uint4(0, 0, 0, 0);  // one 16-byte store (ld, c multiples of 8)
    }
    return;
  }
  for (int e = static_cast<int>(threadIdx.x); e < R * width; e += kThreads) {
    const int r = e / width, x = e - r * width;
    dst[r * ld + x] = r < n ? src[(t0 + r) * st + x].bits : uint16_t{0};
  }
}

// The fragment reads below are ldmatrix's (mma::ldsm_x4): row-major H tiles whose leading dimension is
// a multiple of 8 values (16-byte rows) and, 8 more than the width, puts the 8 rows of a matrix on
// distinct banks. Each operand is staged once, row-major, whichever side of a product it is on.

// c[m][n] += A Xᵀ[:, 8n : 8n + 8] for n < nt (<= NT), m < MT, on H values in shared memory: A is a
// warp's 16·MT rows (from A, leading dimension lda; row block m in c[m]) of K columns, X's rows are B's
// columns (B(k, n) = X[n ldx + k]: Kᵀ, Vᵀ, Qᵀ, dOᵀ of row-major K, V, Q, dO); K a multiple of 16. One
// warp, every lane: each row block's four 8 x 8 matrices by one ldmatrix, B's for two column blocks by
// another, used by every row block (the second column block's lanes repeat the first's rows where
// n + 1 = nt, so no read passes X's rows).
template <class H, int MT, int NT> __device__ __forceinline__ void warp_gemm_h(float (*c)[NT][4], const uint16_t* A, int lda,
                                                                               const uint16_t* X, int ldx, int K, int nt, int lane) {
  static_assert(NT % 2 == 0);
  const uint16_t* const ap = A + (lane % 16) * lda + 8 * (lane / 16);      // matrices: rows 0-7, 8-15 of columns 0-7, then of 8-15
  const uint16_t* const xp = X + (lane % 8) * ldx + 8 * ((lane / 8) % 2);  // matrices: B rows k 0-7, 8-15 of column block n, n + 1
  const bool upper = lane >= 16;
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) mma::ldsm_x4<false>(a[m], ap + 16 * m * lda + k0);
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      if (n < nt) {
        uint32_t b[4];
        mma::ldsm_x4<false>(b, xp + (8 * n + (upper && n + 1 < nt ? 8 : 0)) * ldx + k0);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma::mma_h<H>(c[m][n], a[m], {b[0], b[1]});
          if (n + 1 < nt) mma::mma_h<H>(c[m][n + 1], a[m], {b[2], b[3]});
        }
      }
    }
  }
}
// One row block (MT = 1).
template <class H, int NT> __device__ __forceinline__ void warp_gemm_h(float (&c)[NT][4], const uint16_t* A, int lda, const uint16_t* X,
                                                                       int ldx, int K, int nt, int lane) {
  warp_gemm_h<H, 1, NT>(&c, A, lda, X, ldx, K, nt, lane);
}

// c[m][n] += F_m X[:, 8n : 8n + 8] for n < nt, m < MT, F_m row block m's 16 x 8NF score fragments f[m]
// (P or dS, f32, as a product left them) rounded to H as the A operand where they stand (fragments 2kk,
// 2kk + 1 are A's 16 columns kk: no shared-memory round trip), over F's first K columns (K <= 8NF; X's
// rows past K must be zero, or F's columns). X is row-major [k][n] (V, dO, Q, K, each a product's
// right side over its rows): B's fragments by a transposing ldmatrix, two column blocks at a time as
// warp_gemm_h's, used by every row block.
template <class H, int MT, int NF, int NT> __device__ __forceinline__ void warp_gemm_h_frags(float (*c)[NT][4], const float (*f)[NF][4],
                                                                                             const uint16_t* X, int ldx, int K, int nt,
                                                                                             int lane) {
  static_assert(NF % 2 == 0 && NT % 2 == 0);
  const uint16_t* const xp = X + (lane % 16) * ldx;  // matrices: rows k 0-7, 8-15 of column block n, then of n + 1
  const bool upper = lane >= 16;
#pragma unroll
  for (int kk = 0; kk < NF / 2; ++kk) {
    if (16 * kk >= K) break;
    uint32_t a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      a[m][0] = mma::pack_h<H>(f[m][2 * kk][0], f[m][2 * kk][1]);
      a[m][1] = mma::pack_h<H>(f[m][2 * kk][2], f[m][2 * kk][3]);
      a[m][2] = mma::pack_h<H>(f[m][2 * kk + 1][0], f[m][2 * kk + 1][1]);
      a[m][3] = mma::pack_h<H>(f[m][2 * kk + 1][2], f[m][2 * kk + 1][3]);
    }
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      if (n < nt) {
        uint32_t b[4];
        mma::ldsm_x4<true>(b, xp + 16 * kk * ldx + 8 * n + (upper && n + 1 < nt ? 8 : 0));
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma::mma_h<H>(c[m][n], a[m], {b[0], b[1]});
          if (n + 1 < nt) mma::mma_h<H>(c[m][n + 1], a[m], {b[2], b[3]});
        }
      }
    }
  }
}
// One row block (MT = 1).
template <class H, int NF, int NT> __device__ __forceinline__ void warp_gemm_h_frags(float (&c)[NT][4], const float (&f)[NF][4],
                                                                                     const uint16_t* X, int ldx, int K, int nt, int lane) {
  warp_gemm_h_frags<H, 1, NF, NT>(&c, &f, X, ldx, K, nt, lane);
}

// MT = the row blocks of 16 per warp: a block takes 64·MT query rows, and each fragment of K and V read
// from shared memory serves MT row blocks (FlashAttention-2's forward takes 128 rows, MT = 2).
template <class H, int BC, int NV, int MT> __global__ void __launch_bounds__(kThreads)
    attn_fwd_h(const Params<H> P, H* __restrict__ o, float* __restrict__ lse, int64_t nqt) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* const sm = reinterpret_cast<uint16_t*>(smem_raw);
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  constexpr int kRowsB = kTcRows * MT, kRowsW = 16 * MT;  // query rows per block, per warp
  const int d = P.d, dv = P.dv, ldq = d + 8, ldk = d + 8, ldv = dv + 8, nv = dv / 8;
  const HSmem L = h_fwd_smem(BC, d, dv, kRowsB);
  uint16_t* const Qs = sm;
  uint16_t* const Ks = sm + L.k;
  uint16_t* const Vs = sm + L.v;
  int* const kval = reinterpret_cast<int*>(sm + L.kval);

  const int tid = static_cast<int>(threadIdx.x), r0 = (tid / kWarp) * kRowsW, lane = tid % kWarp, g = lane / 4, t = lane % 4;
  const QueryTile q(P, nqt, r0, kRowsB, kRowsW);
  const int64_t bh = q.bh, b = q.b, h = q.h;
  int64_t irow[MT][2];  // this lane's query rows in row block m (>= T: a last tile's padding)
#pragma unroll
  for (int m = 0; m < MT; ++m) irow[m][0] = q.i0 + r0 + 16 * m + g, irow[m][1] = irow[m][0] + 8;
  const bool v8 = P.v4 && dv % 8 == 0;  // (d is a multiple of 16)
  const auto kv_tile = [&](int64_t j0) { return static_cast<int>(q.kend - j0 < BC ? q.kend - j0 : BC); };
  const auto load_k = [&](int64_t j0) {
    load_h_rows(v8, Ks, ldk, BC, P.k.row(b, q.hk, 0), P.k.st, j0, kv_tile(j0), d);
    load_kval(kval, BC, P.kp ? P.kp + b * P.sk : nullptr, j0, kv_tile(j0));
  };
  // The loads run ahead of the products (FlashAttention-2's order): a key tile's V arrives during its
  // S = Q Kᵀ, the next tile's K during this one's P V (asynchronous copies where v8).
  load_h_rows(v8, Qs, ldq, kRowsB, P.q.row(b, h, 0), P.q.st, q.i0, q.br, d);
  if (q.kend > 0) load_k(0);
  cp_async_commit();

  float mx[MT][2], l[MT][2];
  float acc[MT][NV][4];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    mx[m][0] = mx[m][1] = ninf, l[m][0] = l[m][1] = 0;
    zero(acc[m]);
  }
  for (int64_t j0 = 0; j0 < q.kend; j0 += BC) {
    const int bc = kv_tile(j0);
    const bool sees = j0 < q.wend;                                          // (warp-uniform) some row of this warp sees these keys
    load_h_rows(v8, Vs, ldv, BC, P.v.row(b, q.hk, 0), P.v.st, j0, bc, dv);  // (every read of Vs passed the last barrier)
    cp_async_commit();
    cp_async_wait<1>();  // this thread's copies of Q and K are in (V may not be)
    __syncthreads();     // ... and everyone's

    float s[MT][BC / 8][4];
    if (sees) {
#pragma unroll
      for (int m = 0; m < MT; ++m) zero(s[m]);
      warp_gemm_h<H, MT>(s, Qs + r0 * ldq, ldq, Ks, ldk, d, BC / 8, lane);  // S = Q Kᵀ
      const bool whole = q.whole(P, j0, BC);                                // (for every row of the warp)
#pragma unroll
      for (int m = 0; m < MT; ++m) softmax_step(whole, P, b, h, irow[m], j0, kval, t, s[m], mx[m], l[m], acc[m]);
    }
    __syncthreads();  // every read of Ks and kval is done
    if (j0 + BC < q.kend) load_k(j0 + BC);
    cp_async_commit();
    cp_async_wait<1>();  // V is in (the next K may not be)
    __syncthreads();
    if (sees) warp_gemm_h_frags<H, MT>(acc, s, Vs, ldv, bc, nv, lane);  // O += P V (P rounded to H; keys past bc have P = 0 and V = 0)
    __syncthreads();                                                    // every read of Vs is done
  }
  cp_async_wait<0>();

#pragma unroll
  for (int m = 0; m < MT; ++m) finish_rows(P, bh, irow[m], t, acc[m], mx[m], l[m], o, lse);
}

// The block of a dK/dV pass: unit = key tile · B·Hkv + (b·Hkv + hk) (low key tiles, which more causal
// queries see, first), its kTcRows keys from j0 (bkn of them real) and the first query row that sees
// any of them.
struct KeyTile {
  int64_t b, hk, j0, i_first;
  int bkn;
  template <class T> __device__ explicit KeyTile(const Params<T>& P) {
    const int64_t BHk = P.nb * P.nhkv, unit = blockIdx.x, bk = unit % BHk;
    b = bk / P.nhkv, hk = bk % P.nhkv;
    j0 = unit / BHk * kTcRows;
    bkn = static_cast<int>(P.sk - j0 < kTcRows ? P.sk - j0 : kTcRows);
    i_first = P.causal ? (j0 - P.pos0 > 0 ? j0 - P.pos0 : 0) : 0;
  }
  // Whether the query tile from i0 is whole for warp `r0 / 16`'s 16 keys: no key padding and no user
  // mask, the keys all real, and every query row of the tile sees every one of them (rows past T keep
  // their "no visible key" from LSE). Its scores then skip the per-element masks (the same floats).
  template <class T> __device__ bool whole(const Params<T>& P, int64_t i0, int r0) const {
    return !P.kp && P.mkind == 0 && j0 + r0 + 16 <= P.sk && (!P.causal || j0 + r0 + 15 <= P.pos0 + i0);
  }
};

// LSE and D of a query tile's n real rows into [R] shared arrays (padding rows: LSE −inf, "no visible
// key", and D 0). All threads.
__device__ __forceinline__ void load_lse_d(float* Ls, float* Ds, int R, const float* lse, const float* D, int n) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  for (int e = static_cast<int>(threadIdx.x); e < R; e += kThreads) {
    Ls[e] = e < n ? lse[e] : ninf;
    Ds[e] = e < n ? D[e] : 0.f;
  }
}

// LSE and D of this lane's query rows irow (rows >= T, a last tile's padding: LSE −inf, "no visible
// key", and D 0).
template <class T> __device__ __forceinline__ void row_lse_d(const Params<T>& P, const float* lse, const float* D, const int64_t (&irow)[2],
                                                             float (&li)[2], float (&di)[2]) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    li[rr] = irow[rr] < P.tq ? lse[irow[rr]] : -std::numeric_limits<float>::infinity();
    di[rr] = irow[rr] < P.tq ? D[irow[rr]] : 0.f;
  }
}

// The backward's scores for one warp of the dK/dV pass (its 16 keys krow of the tile from j0, the query
// tile from i0 with LSE Ls and D Ds; s = Sᵀ, dp = dPᵀ as products left them): P in place of s, dS =
// scale P ⊙ (dP − D) in place of dp, both 0 where a key is masked or a row sees no key. Shared by the
// f32 and the half-precision kernels. kWhole (KeyTile::whole): no masks to apply (the same floats).
template <bool kWhole, class T, int NB> __device__ __forceinline__ void dkdv_scores_as(const Params<T>& P, int64_t b, int64_t h, int64_t i0,
                                                                                       int64_t j0, const int (&krow)[2], const int* kval,
                                                                                       const float* Ls, const float* Ds, int t,
                                                                                       float (&s)[NB][4], float (&dp)[NB][4]) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
#pragma unroll
  for (int n = 0; n < NB; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = 8 * n + 2 * t + (e & 1), kr = krow[e >> 1];
      const int64_t i = i0 + c, j = j0 + kr;
      const float li = Ls[c];
      bool vis = li != ninf && (kWhole || (kval[kr] != 0 && (!P.causal || j <= P.pos0 + i)));
      const float madd = kWhole ? 0.f : user_mask(P, b, h, i, j, vis);
      const float p = vis ? dexp(P.scale * s[n][e] + madd - li) : 0.f;
      s[n][e] = p;
      dp[n][e] = vis ? P.scale * p * (dp[n][e] - Ds[c]) : 0.f;
    }
  }
}

// The same for one warp of the dQ pass (this lane's query rows irow with LSE li and D di, the key tile
// from j0; s = S, dp = dP): dS in place of dp. kWhole: QueryTile::whole.
template <bool kWhole, class T, int NB> __device__ __forceinline__ void dq_scores_as(const Params<T>& P, int64_t b, int64_t h,
                                                                                     const int64_t (&irow)[2], int64_t j0, const int* kval,
                                                                                     const float (&li)[2], const float (&di)[2], int t,
                                                                                     const float (&s)[NB][4], float (&dp)[NB][4]) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
#pragma unroll
  for (int n = 0; n < NB; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = 8 * n + 2 * t + (e & 1), rr = e >> 1;
      bool vis = li[rr] != ninf && (kWhole || (kval[c] != 0 && (!P.causal || j0 + c <= P.pos0 + irow[rr])));
      const float madd = kWhole ? 0.f : user_mask(P, b, h, irow[rr], j0 + c, vis);
      const float p = vis ? dexp(P.scale * s[n][e] + madd - li[rr]) : 0.f;
      dp[n][e] = vis ? P.scale * p * (dp[n][e] - di[rr]) : 0.f;
    }
  }
}

// The two above for a warp-uniform `whole` (KeyTile::whole, QueryTile::whole): each its masked or its
// unmasked form.
template <class T, int NB> __device__ __forceinline__ void dkdv_scores(bool whole, const Params<T>& P, int64_t b, int64_t h, int64_t i0,
                                                                       int64_t j0, const int (&krow)[2], const int* kval, const float* Ls,
                                                                       const float* Ds, int t, float (&s)[NB][4], float (&dp)[NB][4]) {
  if (whole)
    dkdv_scores_as<true>(P, b, h, i0, j0, krow, kval, Ls, Ds, t, s, dp);
  else
    dkdv_scores_as<false>(P, b, h, i0, j0, krow, kval, Ls, Ds, t, s, dp);
}
template <class T, int NB> __device__ __forceinline__ void dq_scores(bool whole, const Params<T>& P, int64_t b, int64_t h,
                                                                     const int64_t (&irow)[2], int64_t j0, const int* kval,
                                                                     const float (&li)[2], const float (&di)[2], int t,
                                                                     const float (&s)[NB][4], float (&dp)[NB][4]) {
  if (whole)
    dq_scores_as<true>(P, b, h, irow, j0, kval, li, di, t, s, dp);
  else
    dq_scores_as<false>(P, b, h, irow, j0, kval, li, di, t, s, dp);
}

// dK and dV. Grid as attn_bwd_dkdv's with kTcRows-key tiles; warp w owns keys j0 + 16w ..; per query
// tile Sᵀ = K Qᵀ, Pᵀ = exp(scale Sᵀ − LSE), dPᵀ = V dOᵀ, dSᵀ = scale Pᵀ ⊙ (dPᵀ − D), then dV += Pᵀ dO and
// dK += dSᵀ Q. ND, NV = dK's and dV's 8-column pieces.
template <int BC, int ND, int NV, bool kExact> __global__ void __launch_bounds__(kThreads)
    attn_bwd_dkdv_tc(const Params<float> P, const float* __restrict__ lse, const float* __restrict__ D, float* __restrict__ dk,
                     float* __restrict__ dvo) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* const sm = reinterpret_cast<float*>(smem_raw);
  const int d = P.d, dv = P.dv;
  const TcSmem L = tc_bwd_smem(BC, d, dv);
  float* const Ks = sm + L.off[0];
  float* const Vs = sm + L.off[1];
  float* const Qs = sm + L.off[2];
  float* const Gs = sm + L.off[3];
  float* const Ls = sm + L.l;
  float* const Ds = sm + L.dd;
  int* const kval = reinterpret_cast<int*>(sm + L.kval);
  const int ldk = L.ld[0], ldv = L.ld[1], ldq = L.ld[2], ldg = L.ld[3];

  const KeyTile kt(P);
  const int64_t b = kt.b, hk = kt.hk, j0 = kt.j0;
  const int bkn = kt.bkn;
  const int tid = static_cast<int>(threadIdx.x), r0 = (tid / kWarp) * 16, lane = tid % kWarp, g = lane / 4, t = lane % 4;
  float* const Pw = sm + L.p + r0 * (BC + 4);
  const int krow[2] = {r0 + g, r0 + g + 8};  // this lane's keys in the tile (j0 + krow >= S: padding)
  const int nd = d / 8, nv = dv / 8;

  load_rows(P.v4, Ks, ldk, kTcRows, P.k.row(b, hk, 0), P.k.st, j0, bkn, d);
  load_rows(P.v4, Vs, ldv, kTcRows, P.v.row(b, hk, 0), P.v.st, j0, bkn, dv);
  load_kval(kval, kTcRows, P.kp ? P.kp + b * P.sk : nullptr, j0, bkn);

  float dka[ND][4], dva[NV][4];
  zero(dka);
  zero(dva);

  for (int hr = 0; hr < P.rep; ++hr) {
    const int64_t h = hk * P.rep + hr, bh = b * P.nh + h;
    for (int64_t i0 = kt.i_first; i0 < P.tq; i0 += BC) {
      const int bq = static_cast<int>(P.tq - i0 < BC ? P.tq - i0 : BC);
      __syncthreads();  // the previous tile's reads are done (and, the first time, Ks/Vs/kval are visible after the next one)
      load_rows(P.v4, Qs, ldq, BC, P.q.row(b, h, 0), P.q.st, i0, bq, d);
      load_rows(P.v4, Gs, ldg, BC, P.g.row(b, h, 0), P.g.st, i0, bq, dv);
      load_lse_d(Ls, Ds, BC, lse + bh * P.tq + i0, D + bh * P.tq + i0, bq);
      __syncthreads();

      float s[BC / 8][4], dp[BC / 8][4];
      zero(s);
      zero(dp);
      mma::warp_gemm<BC / 8, true, kExact, kExact>(s, Ks + r0 * ldk, ldk, Qs, ldq, d, BC / 8, g, t);    // Sᵀ = K Qᵀ
      mma::warp_gemm<BC / 8, true, kExact, kExact>(dp, Vs + r0 * ldv, ldv, Gs, ldg, dv, BC / 8, g, t);  // dPᵀ = V dOᵀ
      dkdv_scores(kt.whole(P, i0, r0), P, b, h, i0, j0, krow, kval, Ls, Ds, t, s, dp);
      const int kq = (bq + 7) & ~7;  // query rows past bq are zero
      store_frags(Pw, (BC + 4), s, g, t);
      __syncwarp();
      mma::warp_gemm<NV, false, false, kExact>(dva, Pw, (BC + 4), Gs, ldg, kq, nv, g, t);  // dV += Pᵀ dO
      __syncwarp();
      store_frags(Pw, (BC + 4), dp, g, t);
      __syncwarp();
      mma::warp_gemm<ND, false, false, kExact>(dka, Pw, (BC + 4), Qs, ldq, kq, nd, g, t);  // dK += dSᵀ Q
      __syncwarp();
    }
  }

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    if (krow[rr] >= bkn) continue;
    const int64_t j = j0 + krow[rr];
    float* const dkr = dk + ((b * P.nhkv + hk) * P.sk + j) * d;
    float* const dvr = dvo + ((b * P.nhkv + hk) * P.sk + j) * dv;
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      if (n < nd) {
        dkr[8 * n + 2 * t] = dka[n][2 * rr];
        dkr[8 * n + 2 * t + 1] = dka[n][2 * rr + 1];
      }
    }
#pragma unroll
    for (int n = 0; n < NV; ++n) {
      if (n < nv) {
        dvr[8 * n + 2 * t] = dva[n][2 * rr];
        dvr[8 * n + 2 * t + 1] = dva[n][2 * rr + 1];
      }
    }
  }
}

// dQ. Grid as the forward's; warp w owns query rows i0 + 16w ..; per key tile S = Q Kᵀ, dP = dO Vᵀ,
// dS = scale P ⊙ (dP − D), dQ += dS K. ND = dQ's 8-column pieces.
template <int BC, int ND, bool kExact> __global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_tc(const Params<float> P, const float* __restrict__ lse, const float* __restrict__ D, float* __restrict__ dq, int64_t nqt) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* const sm = reinterpret_cast<float*>(smem_raw);
  const int d = P.d, dv = P.dv;
  const TcSmem L = tc_bwd_smem(BC, d, dv);
  float* const Qs = sm + L.off[0];
  float* const Gs = sm + L.off[1];
  float* const Ks = sm + L.off[2];
  float* const Vs = sm + L.off[3];
  int* const kval = reinterpret_cast<int*>(sm + L.kval);
  const int ldq = L.ld[0], ldg = L.ld[1], ldk = L.ld[2], ldv = L.ld[3];

  const int tid = static_cast<int>(threadIdx.x), r0 = (tid / kWarp) * 16, lane = tid % kWarp, g = lane / 4, t = lane % 4;
  const QueryTile q(P, nqt, r0);
  const int64_t bh = q.bh, b = q.b, h = q.h;
  float* const Pw = sm + L.p + r0 * (BC + 4);
  const int64_t irow[2] = {q.i0 + r0 + g, q.i0 + r0 + g + 8};
  float li[2], di[2];
  row_lse_d(P, lse + bh * P.tq, D + bh * P.tq, irow, li, di);

  load_rows(P.v4, Qs, ldq, kTcRows, P.q.row(b, h, 0), P.q.st, q.i0, q.br, d);
  load_rows(P.v4, Gs, ldg, kTcRows, P.g.row(b, h, 0), P.g.st, q.i0, q.br, dv);
  const int nd = d / 8;

  float dqa[ND][4];
  zero(dqa);
  for (int64_t j0 = 0; j0 < q.kend; j0 += BC) {
    const int bc = stage_keys<BC>(P, q, j0, Ks, ldk, Vs, ldv, kval);
    if (j0 >= q.wend) continue;  // (warp-uniform) no row of this warp sees these keys

    float s[BC / 8][4], dp[BC / 8][4];
    zero(s);
    zero(dp);
    mma::warp_gemm<BC / 8, true, kExact, kExact>(s, Qs + r0 * ldq, ldq, Ks, ldk, d, BC / 8, g, t);    // S = Q Kᵀ
    mma::warp_gemm<BC / 8, true, kExact, kExact>(dp, Gs + r0 * ldg, ldg, Vs, ldv, dv, BC / 8, g, t);  // dP = dO Vᵀ
    dq_scores(q.whole(P, j0, BC), P, b, h, irow, j0, kval, li, di, t, s, dp);
    store_frags(Pw, (BC + 4), dp, g, t);
    __syncwarp();
    mma::warp_gemm<ND, false, false, kExact>(dqa, Pw, (BC + 4), Ks, ldk, (bc + 7) & ~7, nd, g, t);  // dQ += dS K (keys past bc are zero)
    __syncwarp();
  }

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    if (irow[rr] >= P.tq) continue;
    float* const dqr = dq + (bh * P.tq + irow[rr]) * d;
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      if (n < nd) {
        dqr[8 * n + 2 * t] = dqa[n][2 * rr];
        dqr[8 * n + 2 * t + 1] = dqa[n][2 * rr + 1];
      }
    }
  }
}

// ------------------------------------------------------------------------ half-precision backward
// bf16/f16 q, k, v, dO on the tensor cores in their own precision (cuda::set_attention_half_products),
// as FlashAttention-2's backward: S, dP and their transposes as m16n8k16 products of H values with f32
// accumulation, P and dS in f32 (D from the f32 delta kernel), then rounded to H as the A operands of
// dV += Pᵀ dO, dK += dSᵀ Q and dQ += dS K (from their fragments' registers, warp_gemm_h_frags); dQ,
// dK, dV accumulated in f32 and rounded once. Tiles as H bits in shared memory, row-major, each staged
// once: Q, dO (dK/dV pass) and K (dQ pass) are the right side of a product against their transpose
// (Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, S = Q Kᵀ) and of one over their rows (dK += dSᵀ Q, dV += Pᵀ dO, dQ += dS K),
// read by plain and by transposing ldmatrix. d and dv multiples of 16 (both are a product's depth
// somewhere), at most kTcMaxHead. Grids, tiles and loops as the f32 tensor-core kernels'
// (attn_bwd_dkdv_tc, attn_bwd_dq_tc).
bool h_bwd_fits(int64_t d, int64_t dv) { return h_fits(d, dv) && dv % 16 == 0; }

// Shared memory in H values of the dK/dV pass (dkdv): K [kTcRows, d + 8], V [kTcRows, dv + 8], Q [BC,
// d + 8], dO [BC, dv + 8], then LSE and D [BC] (f32) and the key flags [kTcRows]; of the dQ pass: Q
// [kTcRows, d + 8], dO [kTcRows, dv + 8], K [BC, d + 8], V [BC, dv + 8], the key flags [BC]. Every array
// starts 16-byte aligned (d, dv multiples of 16).
struct HBwdSmem {
  int a0, a1, b0, b1, l, dd, kval;
  size_t bytes;
};
__host__ __device__ constexpr HBwdSmem h_bwd_smem(bool dkdv, int bc, int d, int dv, int rows = kTcRows) {
  HBwdSmem s{};
  s.a0 = 0;
  s.a1 = s.a0 + rows * (d + 8);
  s.b0 = s.a1 + rows * (dv + 8);
  s.b1 = s.b0 + bc * (d + 8);
  s.l = s.b1 + bc * (dv + 8);
  s.dd = s.l + (dkdv ? 2 * bc : 0);
  s.kval = s.dd + (dkdv ? 2 * bc : 0);
  s.bytes = static_cast<size_t>(s.kval) * 2 + static_cast<size_t>(dkdv ? rows : bc) * sizeof(int);
  return s;
}

// Stores a lane's rows of a warp's 16 x 8NT f32 accumulators (rows row[0], row[1] of `out`, width
// columns, rows >= nrows skipped) as H, rounded once.
template <class H, int NT> __device__ __forceinline__ void store_rows_h(H* out, int64_t ld, const int64_t (&row)[2], int64_t nrows,
                                                                        int width, const float (&c)[NT][4], int t) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    if (row[rr] >= nrows) continue;
    H* const o = out + row[rr] * ld;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      if (8 * n < width) {
        st(o + 8 * n + 2 * t, c[n][2 * rr]);
        st(o + 8 * n + 2 * t + 1, c[n][2 * rr + 1]);
      }
    }
  }
}

template <class H, int BC, int ND, int NV> __global__ void __launch_bounds__(kThreads)
    attn_bwd_dkdv_h(const Params<H> P, const float* __restrict__ lse, const float* __restrict__ D, H* __restrict__ dk,
                    H* __restrict__ dvo) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* const sm = reinterpret_cast<uint16_t*>(smem_raw);
  const int d = P.d, dv = P.dv, ldk = d + 8, ldv = dv + 8;
  const HBwdSmem L = h_bwd_smem(true, BC, d, dv);
  uint16_t* const Ks = sm + L.a0;
  uint16_t* const Vs = sm + L.a1;
  uint16_t* const Qs = sm + L.b0;
  uint16_t* const Gs = sm + L.b1;
  float* const Ls = reinterpret_cast<float*>(sm + L.l);
  float* const Ds = reinterpret_cast<float*>(sm + L.dd);
  int* const kval = reinterpret_cast<int*>(sm + L.kval);

  const KeyTile kt(P);
  const int64_t b = kt.b, hk = kt.hk, j0 = kt.j0;
  const int bkn = kt.bkn;
  const int tid = static_cast<int>(threadIdx.x), r0 = (tid / kWarp) * 16, lane = tid % kWarp, g = lane / 4, t = lane % 4;
  const int krow[2] = {r0 + g, r0 + g + 8};  // this lane's keys in the tile (j0 + krow >= S: padding)
  const bool v8 = P.v4;                      // (d, dv multiples of 16)

  // The query tiles in order: (query head hr of the group, tile from i0), hr < P.rep, i0 from
  // kt.i_first while < T.
  const auto q_tile = [&](int64_t i0) { return static_cast<int>(P.tq - i0 < BC ? P.tq - i0 : BC); };
  const auto load_g = [&](int hr, int64_t i0) {  // dO, LSE and D of a query tile
    const int64_t h = hk * P.rep + hr, bh = b * P.nh + h;
    load_h_rows(v8, Gs, ldv, BC, P.g.row(b, h, 0), P.g.st, i0, q_tile(i0), dv);
    load_lse_d(Ls, Ds, BC, lse + bh * P.tq + i0, D + bh * P.tq + i0, q_tile(i0));
  };
  const auto load_q = [&](int hr, int64_t i0) { load_h_rows(v8, Qs, ldk, BC, P.q.row(b, hk * P.rep + hr, 0), P.q.st, i0, q_tile(i0), d); };
  // The loads run ahead of the products, as attn_fwd_h's: the next query tile's dO, LSE and D arrive
  // during this tile's dK, its Q during its own dPᵀ = V dOᵀ (asynchronous copies where v8).
  const bool any = kt.i_first < P.tq;
  load_h_rows(v8, Ks, ldk, kTcRows, P.k.row(b, hk, 0), P.k.st, j0, bkn, d);
  load_h_rows(v8, Vs, ldv, kTcRows, P.v.row(b, hk, 0), P.v.st, j0, bkn, dv);
  load_kval(kval, kTcRows, P.kp ? P.kp + b * P.sk : nullptr, j0, bkn);
  if (any) load_g(0, kt.i_first);
  cp_async_commit();
  if (any) load_q(0, kt.i_first);
  cp_async_commit();

  float dka[ND][4], dva[NV][4];
  zero(dka);
  zero(dva);
  for (int hr = 0; hr < P.rep; ++hr) {
    const int64_t h = hk * P.rep + hr;
    for (int64_t i0 = kt.i_first; i0 < P.tq; i0 += BC) {
      const bool last_i = i0 + BC >= P.tq, next = !last_i || hr + 1 < P.rep;
      const int hn = last_i ? hr + 1 : hr;  // the next tile
      const int64_t in = last_i ? kt.i_first : i0 + BC;
      cp_async_wait<1>();  // this thread's copies of K, V, dO are in (Q may not be)
      __syncthreads();     // ... and everyone's, with kval, LSE and D
      float s[BC / 8][4], dp[BC / 8][4];
      zero(dp);
      warp_gemm_h<H>(dp, Vs + r0 * ldv, ldv, Gs, ldv, dv, BC / 8, lane);  // dPᵀ = V dOᵀ
      cp_async_wait<0>();                                                 // Q is in
      __syncthreads();
      zero(s);
      warp_gemm_h<H>(s, Ks + r0 * ldk, ldk, Qs, ldk, d, BC / 8, lane);  // Sᵀ = K Qᵀ
      dkdv_scores(kt.whole(P, i0, r0), P, b, h, i0, j0, krow, kval, Ls, Ds, t, s, dp);
      warp_gemm_h_frags<H>(dva, s, Gs, ldv, q_tile(i0), dv / 8, lane);  // dV += Pᵀ dO (query rows past the tile's: P = 0, dO = 0)
      __syncthreads();                                                  // every read of Gs, Ls and Ds is done
      if (next) load_g(hn, in);
      cp_async_commit();
      warp_gemm_h_frags<H>(dka, dp, Qs, ldk, q_tile(i0), d / 8, lane);  // dK += dSᵀ Q
      __syncthreads();                                                  // every read of Qs is done
      if (next) load_q(hn, in);
      cp_async_commit();
    }
  }
  cp_async_wait<0>();
  const int64_t jrow[2] = {j0 + krow[0], j0 + krow[1]};
  const int64_t kv = (b * P.nhkv + hk) * P.sk;
  store_rows_h(dk + kv * d, d, jrow, P.sk, d, dka, t);
  store_rows_h(dvo + kv * dv, dv, jrow, P.sk, dv, dva, t);
}

// MT: row blocks of 16 per warp, as attn_fwd_h's (64·MT query rows per block; each fragment of K and V
// read from shared memory serves MT row blocks).
template <class H, int BC, int ND, int MT> __global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_h(const Params<H> P, const float* __restrict__ lse, const float* __restrict__ D, H* __restrict__ dq, int64_t nqt) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* const sm = reinterpret_cast<uint16_t*>(smem_raw);
  constexpr int kRowsB = kTcRows * MT, kRowsW = 16 * MT;  // query rows per block, per warp
  const int d = P.d, dv = P.dv, ldq = d + 8, ldg = dv + 8;
  const HBwdSmem L = h_bwd_smem(false, BC, d, dv, kRowsB);
  uint16_t* const Qs = sm + L.a0;
  uint16_t* const Gs = sm + L.a1;
  uint16_t* const Ks = sm + L.b0;
  uint16_t* const Vs = sm + L.b1;
  int* const kval = reinterpret_cast<int*>(sm + L.kval);

  const int tid = static_cast<int>(threadIdx.x), r0 = (tid / kWarp) * kRowsW, lane = tid % kWarp, g = lane / 4, t = lane % 4;
  const QueryTile q(P, nqt, r0, kRowsB, kRowsW);
  const int64_t bh = q.bh, b = q.b, h = q.h;
  int64_t irow[MT][2];
  float li[MT][2], di[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    irow[m][0] = q.i0 + r0 + 16 * m + g, irow[m][1] = irow[m][0] + 8;
    row_lse_d(P, lse + bh * P.tq, D + bh * P.tq, irow[m], li[m], di[m]);
  }
  const bool v8 = P.v4;  // (d, dv multiples of 16)
  const auto kv_tile = [&](int64_t j0) { return static_cast<int>(q.kend - j0 < BC ? q.kend - j0 : BC); };
  const auto load_k = [&](int64_t j0) {
    load_h_rows(v8, Ks, ldq, BC, P.k.row(b, q.hk, 0), P.k.st, j0, kv_tile(j0), d);
    load_kval(kval, BC, P.kp ? P.kp + b * P.sk : nullptr, j0, kv_tile(j0));
  };
  // The loads run ahead of the products, as attn_fwd_h's: a key tile's K arrives during its dP = dO Vᵀ,
  // the next tile's V during this one's S, dS and dQ (asynchronous copies where v8).
  load_h_rows(v8, Qs, ldq, kRowsB, P.q.row(b, h, 0), P.q.st, q.i0, q.br, d);
  load_h_rows(v8, Gs, ldg, kRowsB, P.g.row(b, h, 0), P.g.st, q.i0, q.br, dv);
  if (q.kend > 0) load_h_rows(v8, Vs, ldg, BC, P.v.row(b, q.hk, 0), P.v.st, 0, kv_tile(0), dv);
  cp_async_commit();
  if (q.kend > 0) load_k(0);
  cp_async_commit();

  float dqa[MT][ND][4];
#pragma unroll
  for (int m = 0; m < MT; ++m) zero(dqa[m]);
  for (int64_t j0 = 0; j0 < q.kend; j0 += BC) {
    const bool sees = j0 < q.wend, next = j0 + BC < q.kend;  // (warp-uniform) some row of this warp sees these keys
    cp_async_wait<1>();                                      // this thread's copies of Q, dO and V are in (K may not be)
    __syncthreads();                                         // ... and everyone's
    float s[MT][BC / 8][4], dp[MT][BC / 8][4];
    if (sees) {
#pragma unroll
      for (int m = 0; m < MT; ++m) zero(dp[m]);
      warp_gemm_h<H, MT>(dp, Gs + r0 * ldg, ldg, Vs, ldg, dv, BC / 8, lane);  // dP = dO Vᵀ
    }
    __syncthreads();  // every read of Vs is done
    if (next) load_h_rows(v8, Vs, ldg, BC, P.v.row(b, q.hk, 0), P.v.st, j0 + BC, kv_tile(j0 + BC), dv);
    cp_async_commit();
    cp_async_wait<1>();  // K is in (the next V may not be)
    __syncthreads();
    if (sees) {
#pragma unroll
      for (int m = 0; m < MT; ++m) zero(s[m]);
      warp_gemm_h<H, MT>(s, Qs + r0 * ldq, ldq, Ks, ldq, d, BC / 8, lane);  // S = Q Kᵀ
      const bool whole = q.whole(P, j0, BC);                                // (for every row of the warp)
#pragma unroll
      for (int m = 0; m < MT; ++m) dq_scores(whole, P, b, h, irow[m], j0, kval, li[m], di[m], t, s[m], dp[m]);
      warp_gemm_h_frags<H, MT>(dqa, dp, Ks, ldq, kv_tile(j0), d / 8, lane);  // dQ += dS K (keys past the tile's: dS = 0, K = 0)
    }
    __syncthreads();  // every read of Ks and kval is done
    if (next) load_k(j0 + BC);
    cp_async_commit();
  }
  cp_async_wait<0>();
#pragma unroll
  for (int m = 0; m < MT; ++m) store_rows_h(dq + bh * P.tq * d, d, irow[m], P.tq, d, dqa[m], t);
}

// ------------------------------------------------------------------------------------------ host side
struct Shapes {
  int64_t B, H, Hkv, T, S, d, dv;
  std::string str(const Cuda::V& q, const Cuda::V& k, const Cuda::V& v) const {
    return fmt::format("q {}, k {}, v {}", shape_str(q.layout.shape), shape_str(k.layout.shape), shape_str(v.layout.shape));
  }
};

void check_operand(const char* op, const char* name, const Cuda::V& x, DType dt, const Shape& want, const std::string& shapes) {
  const Layout& l = x.layout;
  KILN_CHECK(x.dtype == dt && l.shape == want && (l.shape[3] <= 1 || l.strides[3] == 1),
             "{}: {} must be {} {} with unit-stride rows, got {} {} strides {} ({})", op, name, dt, shape_str(want), x.dtype,
             shape_str(l.shape), shape_str(l.strides), shapes);
  cuda::check_device(x.storage, op);
}
void check_output(const char* op, const char* name, const Cuda::M& x, DType dt, const Shape& want, const std::string& shapes) {
  KILN_CHECK(x.dtype == dt && x.layout.shape == want && x.layout.is_contiguous(), "{}: {} must be a contiguous {} {}, got {} {} ({})", op,
             name, dt, shape_str(want), x.dtype, shape_str(x.layout.shape), shapes);
  cuda::check_device(x.storage, op);
}

// Rows of x start 16-byte aligned (every (b, h, t) row, for any index).
template <class T> bool aligned4(const Rows4<T>& x) {
  return reinterpret_cast<uintptr_t>(x.p) % 16 == 0 && (x.sb * sizeof(T)) % 16 == 0 && (x.sh * sizeof(T)) % 16 == 0 &&
         (x.st * sizeof(T)) % 16 == 0;
}

// Validates q, k, v and key_padding; fills the common part of the kernel parameters.
template <class T> Params<T> make_params(const char* op, Shapes& s, Cuda::V q, Cuda::V k, Cuda::V v, const Cuda::V* kp, const Cuda::V* mask,
                                         double scale, bool causal, int64_t pos0) {
  KILN_CHECK(q.layout.rank() == 4 && k.layout.rank() == 4 && v.layout.rank() == 4, "{}: q {}, k {}, v {} must be [B, H, T, d]", op,
             shape_str(q.layout.shape), shape_str(k.layout.shape), shape_str(v.layout.shape));
  const Shape &qs = q.layout.shape, &ks = k.layout.shape, &vs = v.layout.shape;
  s = Shapes{qs[0], qs[1], ks[1], qs[2], ks[2], qs[3], vs[3]};
  const std::string shapes = s.str(q, k, v);
  KILN_CHECK(ks[0] == s.B && vs[0] == s.B && ks[3] == s.d && vs[1] == s.Hkv && vs[2] == s.S && s.Hkv >= 1 && s.H % s.Hkv == 0,
             "{}: {} do not fit (H must be a multiple of Hkv, widths and lengths must agree)", op, shapes);
  KILN_CHECK(s.d <= kMaxHead && s.dv <= kMaxHead, "{}: head dims d = {}, dv = {} exceed the Cuda kernel's limit of {} ({})", op, s.d, s.dv,
             kMaxHead, shapes);
  KILN_CHECK(pos0 >= 0, "{}: pos0 must be >= 0, got {} ({})", op, pos0, shapes);
  check_operand(op, "q", q, dtype_of<T>, qs, shapes);
  check_operand(op, "k", k, dtype_of<T>, ks, shapes);
  check_operand(op, "v", v, dtype_of<T>, vs, shapes);
  auto rows = [](const Cuda::V& x) {
    const Layout& l = x.layout;
    return Rows4<T>{x.storage.template as<T>() + l.offset, l.strides[0], l.strides[1], l.strides[2]};
  };
  Params<T> P{};
  P.q = rows(q);
  P.k = rows(k);
  P.v = rows(v);
  P.kp = nullptr;
  if (kp) {
    KILN_CHECK(kp->dtype == DType::boolean && kp->layout.is_contiguous() && kp->layout.shape == Shape({s.B, s.S}),
               "{}: key_padding must be a contiguous bool [{}, {}], got {} {} ({})", op, s.B, s.S, kp->dtype, shape_str(kp->layout.shape),
               shapes);
    cuda::check_device(kp->storage, op);
    P.kp = static_cast<const unsigned char*>(kp->storage.data()) + kp->layout.offset;
  }
  P.mask = nullptr;
  P.mkind = 0;
  P.msb = P.msh = P.mst = P.mss = 0;
  if (mask) {
    KILN_CHECK((mask->dtype == DType::boolean || mask->dtype == dtype_of<compute_t<T>>)&&mask->layout.shape == Shape({s.B, s.H, s.T, s.S}),
               "{}: mask must be a bool or {} [{}, {}, {}, {}] view, got {} {} ({})", op, dtype_of<compute_t<T>>, s.B, s.H, s.T, s.S,
               mask->dtype, shape_str(mask->layout.shape), shapes);
    cuda::check_device(mask->storage, op);
    const Layout& l = mask->layout;
    const size_t esz = mask->dtype == DType::boolean ? 1 : sizeof(compute_t<T>);
    P.mask = static_cast<const unsigned char*>(mask->storage.data()) + static_cast<size_t>(l.offset) * esz;
    P.mkind = mask->dtype == DType::boolean ? 1 : 2;
    P.msb = l.strides[0];
    P.msh = l.strides[1];
    P.mst = l.strides[2];
    P.mss = l.strides[3];
  }
  P.nb = s.B;
  P.nh = s.H;
  P.nhkv = s.Hkv;
  P.tq = s.T;
  P.sk = s.S;
  P.d = static_cast<int>(s.d);
  P.dv = static_cast<int>(s.dv);
  P.rep = static_cast<int>(s.H / s.Hkv);
  P.scale = static_cast<compute_t<T>>(scale);
  P.causal = causal;
  P.pos0 = pos0;
  P.v4 = aligned4(P.q) && aligned4(P.k) && aligned4(P.v) && s.d % 4 == 0 && s.dv % 4 == 0;
  return P;
}

// Accumulator columns per thread for a head dim.
int nc_for(int64_t width) { return width <= 8 * kTPR ? 8 : width <= 16 * kTPR ? 16 : 32; }

// Calls f(std::integral_constant<int, NC>) for NC = nc_for(width).
template <class F> void with_nc(int64_t width, F&& f) {
  switch (nc_for(width)) {
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 16:
      return f(std::integral_constant<int, 16>{});
    default:
      return f(std::integral_constant<int, 32>{});
  }
}

// The environment variable `name` (read once by the caller): 0 where unset or empty, else a or b (any
// other value is a kiln::Error).
int env_either(const char* name, int a, int b) {
  const char* e = std::getenv(name);
  if (!e || !*e) return 0;
  const std::string_view v(e);
  KILN_CHECK(v == std::to_string(a) || v == std::to_string(b), "attention: {} must be {} or {}, got '{}'", name, a, b, v);
  return v == std::to_string(a) ? a : b;
}

// The tensor-core kernels' columns per step (keys per tile forward and dQ, query rows per tile dK/dV),
// 32 or 64, chosen from an H100's timings (bench/RESULTS.md, "Tensor-core flash attention"): 32 columns
// halve the shared memory per block, so more blocks fit an SM; 64 reuse each loaded Q row (forward) or
// K/V row (GQA's dK/dV, which walks the group's heads) over more products. Forward: 64 up to d = 64;
// backward: 32, but 64 for GQA up to d = dv = 64. KILN_CUDA_ATTENTION_COLS=32|64 (read once; any other
// value is an error) overrides it, for the benchmarks.
int tc_cols(bool backward, const Shapes& s) {
  static const int forced = env_either("KILN_CUDA_ATTENTION_COLS", 32, 64);
  if (forced) return forced;
  return (backward ? s.H > s.Hkv && s.d <= 64 && s.dv <= 64 : s.d <= 64) ? 64 : 32;
}

// The half forward's and dQ pass's query rows per block: cuda::set_attention_query_rows, else
// KILN_CUDA_ATTENTION_ROWS (read once), else 64; 128 only where d and dv are at most 64 (the kernels'
// accumulators for two row blocks of wider heads would not fit in registers: ptxas spills them at
// sm_90), so MT = 2 is compiled for NV, ND = 8 only.
int h_query_rows(const Shapes& s) {
  static const int env = env_either("KILN_CUDA_ATTENTION_ROWS", 64, 128);
  const int set = cuda::attention_query_rows(), want = set ? set : env ? env : kTcRows;
  return want == 2 * kTcRows && s.d <= 64 && s.dv <= 64 ? want : kTcRows;
}

// Launches attn_fwd_h or attn_bwd_dq_h (kernel<MT>) for `rows` query rows per block.
template <int N, class K1, class K2, class... Args>
void launch_rows(const char* op, int rows, K1 one, K2 two, unsigned grid, size_t smem, const std::string& shapes, Args&&... args) {
  if constexpr (N == 8) {
    if (rows == 2 * kTcRows) return launch(op, two, grid, smem, shapes, std::forward<Args>(args)...);
  }
  launch(op, one, grid, smem, shapes, std::forward<Args>(args)...);
}

// Whether a tensor-core kernel takes a case: head dims it handles (fits: tc_fits for the f32 kernels,
// h_fits for the half-precision forward), not switched off, and its shared memory within the device's
// per-block limit (GPUs with less than an H100's, e.g. 99 KiB, run the FMA kernels at d = 128).
bool use_tc(bool fits, size_t smem) {
  return cuda::attention_tensor_cores() && fits && smem <= cuda::device_properties().sharedMemPerBlockOptin;
}

// Calls f(std::integral_constant<int, BC>) for bc = 32 or 64.
template <class F> void with_cols(int bc, F&& f) {
  if (bc == 64) return f(std::integral_constant<int, 64>{});
  return f(std::integral_constant<int, 32>{});
}

// Calls f(std::bool_constant<on>).
template <class F> void with_flag(bool on, F&& f) {
  if (on) return f(std::true_type{});
  return f(std::false_type{});
}

// Calls f(std::integral_constant<int, N>) for the tensor-core kernels' 8-column pieces of a head dim
// (8 up to 64, else 16).
template <class F> void with_pieces(int64_t width, F&& f) {
  if (width <= 64) return f(std::integral_constant<int, 8>{});
  return f(std::integral_constant<int, 16>{});
}

unsigned grid_of(const char* op, int64_t units, const std::string& shapes) {
  KILN_CHECK(units <= 0x7fffffff, "{}: {} thread blocks exceed CUDA's grid limit ({})", op, units, shapes);
  return static_cast<unsigned>(units);
}

// Launches kernel<<<grid, kThreads, smem>>>(args...), opting in to more than 48 KiB of dynamic
// shared memory where needed.
template <class... KArgs, class... Args>
void launch(const char* op, void (*kernel)(KArgs...), unsigned grid, size_t smem, const std::string& shapes, Args&&... args) {
  constexpr size_t kDefault = 48 * 1024;
  if (smem > kDefault) {
    const size_t optin = cuda::device_properties().sharedMemPerBlockOptin;
    KILN_CHECK(smem <= optin, "{}: needs {} bytes of shared memory per block, the device allows {} ({}): use smaller head dims or f32", op,
               smem, optin, shapes);
    KILN_CUDA_CHECK_OP(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  kernel<<<grid, kThreads, smem, cuda::stream()>>>(std::forward<Args>(args)...);
  KILN_CUDA_LAUNCHED(op);
}

// exact: q, k, v hold bf16/f16 values (the half entry points below), which the tensor-core kernels take
// as exact TF32 operands.
template <class T> void forward(Cuda::M o, Cuda::M lse, Cuda::V q, Cuda::V k, Cuda::V v, const Cuda::V* kp, const Cuda::V* mask,
                                double scale, bool causal, int64_t pos0, bool exact = false) {
  const char* op = "attention_forward";
  Shapes s{};
  const Params<T> P = make_params<T>(op, s, q, k, v, kp, mask, scale, causal, pos0);
  const std::string shapes = s.str(q, k, v);
  check_output(op, "o", o, dtype_of<T>, {s.B, s.H, s.T, s.dv}, shapes);
  check_output(op, "lse", lse, dtype_of<T>, {s.B, s.H, s.T}, shapes);
  if (s.B * s.H * s.T == 0) return;  // nothing to write (S = 0 is handled by the kernel: O = NaN, LSE = −inf)
  if constexpr (std::is_same_v<T, float>) {
    const int cols = tc_cols(false, s);
    if (use_tc(tc_fits(s.d, s.dv), tc_fwd_smem(cols, P.d, P.dv).bytes)) {
      const int64_t nqt = ceil_div(s.T, kTcRows);
      const unsigned grid = grid_of(op, nqt * s.B * s.H, shapes);
      float* const op_ = o.storage.as<float>() + o.layout.offset;
      float* const lp = lse.storage.as<float>() + lse.layout.offset;
      with_cols(cols, [&](auto bc) {
        const size_t smem = tc_fwd_smem(bc, P.d, P.dv).bytes;
        with_pieces(s.dv, [&](auto nv) {
          with_flag(exact, [&](auto ex) {
            launch(op, attn_fwd_tc<decltype(bc)::value, decltype(nv)::value, decltype(ex)::value>, grid, smem, shapes, P, op_, lp, nqt);
          });
        });
      });
      return;
    }
  }
  const int64_t nqt = ceil_div(s.T, kRows);
  const unsigned grid = grid_of(op, nqt * s.B * s.H, shapes);
  T* const op_ = o.storage.as<T>() + o.layout.offset;
  T* const lp = lse.storage.as<T>() + lse.layout.offset;
  const size_t smem = fwd_smem<T>(P.d, P.dv).bytes;
  with_nc(s.dv, [&](auto nc) { launch(op, attn_fwd<T, decltype(nc)::value>, grid, smem, shapes, P, op_, lp, nqt); });
}

template <class T> T* out_ptr(const Cuda::M& x) { return x.storage.as<T>() + x.layout.offset; }

// What the backward passes share: LSE (compute_t<T>: f32 for bf16/f16) and the buffer of D.
template <class T> struct BwdCommon {
  const compute_t<T>* lse = nullptr;
  std::shared_ptr<CudaStorage> D;  // null: no query row or no key, nothing to compute
};

// Validates o, dout (T), lse (compute_t<T>) and the outputs dq, dk, dv (contiguous T, arriving
// zero-filled), binds o and dO to P, and launches D = rowsum(dO ⊙ O) into a fresh buffer.
template <class T> BwdCommon<T> backward_common(const char* op, Params<T>& P, const Shapes& s, const std::string& shapes, const Cuda::M& dq,
                                                const Cuda::M& dk, const Cuda::M& dv, const Cuda::V& o, const Cuda::V& lse,
                                                const Cuda::V& dout) {
  using C = compute_t<T>;
  check_operand(op, "o", o, dtype_of<T>, {s.B, s.H, s.T, s.dv}, shapes);
  check_operand(op, "dout", dout, dtype_of<T>, {s.B, s.H, s.T, s.dv}, shapes);
  KILN_CHECK(lse.dtype == dtype_of<C> && lse.layout.shape == Shape({s.B, s.H, s.T}) && lse.layout.is_contiguous(),
             "{}: lse must be a contiguous {} [{}, {}, {}], got {} {} ({})", op, dtype_of<C>, s.B, s.H, s.T, lse.dtype,
             shape_str(lse.layout.shape), shapes);
  cuda::check_device(lse.storage, op);
  check_output(op, "dq", dq, dtype_of<T>, {s.B, s.H, s.T, s.d}, shapes);
  check_output(op, "dk", dk, dtype_of<T>, {s.B, s.Hkv, s.S, s.d}, shapes);
  check_output(op, "dv", dv, dtype_of<T>, {s.B, s.Hkv, s.S, s.dv}, shapes);
  BwdCommon<T> c;
  c.lse = lse.storage.as<C>() + lse.layout.offset;
  if (s.B * s.H * s.T == 0 || s.S == 0) return c;  // with no query row or no key there is nothing to add
  const auto rows = [](const Cuda::V& x) {
    const Layout& l = x.layout;
    return Rows4<T>{x.storage.template as<T>() + l.offset, l.strides[0], l.strides[1], l.strides[2]};
  };
  P.o = rows(o);
  P.g = rows(dout);
  P.v4 = P.v4 && aligned4(P.o) && aligned4(P.g);
  const int64_t n = s.B * s.H * s.T;
  c.D = Cuda::allocate(static_cast<size_t>(n) * sizeof(C));
  attn_bwd_delta<T><<<grid_for(n, kDeltaWarps), kDeltaWarps * kWarp, 0, cuda::stream()>>>(P, c.lse, c.D->template as<C>());
  KILN_CUDA_LAUNCHED(op);
  return c;
}

// exact: q, k, v and dout hold bf16/f16 values (as forward's).
template <class T> void backward(Cuda::M dq, Cuda::M dk, Cuda::M dv, Cuda::V q, Cuda::V k, Cuda::V v, Cuda::V o, Cuda::V lse, Cuda::V dout,
                                 const Cuda::V* kp, const Cuda::V* mask, double scale, bool causal, int64_t pos0, bool exact = false) {
  const char* op = "attention_backward";
  Shapes s{};
  Params<T> P = make_params<T>(op, s, q, k, v, kp, mask, scale, causal, pos0);
  const std::string shapes = s.str(q, k, v);
  // 1. D = rowsum(dO ⊙ O)
  const BwdCommon<T> c = backward_common<T>(op, P, s, shapes, dq, dk, dv, o, lse, dout);
  if (!c.D) return;
  const T *const lp = c.lse, *const Dp = c.D->template as<T>();
  T *const dqp = out_ptr<T>(dq), *const dkp = out_ptr<T>(dk), *const dvp = out_ptr<T>(dv);

  if constexpr (std::is_same_v<T, float>) {
    const int cols = tc_cols(true, s);
    if (use_tc(tc_fits(s.d, s.dv), tc_bwd_smem(cols, P.d, P.dv).bytes)) {
      const unsigned grid_kv = grid_of(op, ceil_div(s.S, kTcRows) * s.B * s.Hkv, shapes);
      const int64_t nqt = ceil_div(s.T, kTcRows);
      const unsigned grid_q = grid_of(op, nqt * s.B * s.H, shapes);
      with_cols(cols, [&](auto bc) {
        const size_t smem = tc_bwd_smem(bc, P.d, P.dv).bytes;
        with_flag(exact, [&](auto ex) {
          constexpr int kBc = decltype(bc)::value;
          constexpr bool kEx = decltype(ex)::value;
          with_pieces(s.d, [&](auto nd) {
            with_pieces(s.dv, [&](auto nv) {
              launch(op, attn_bwd_dkdv_tc<kBc, decltype(nd)::value, decltype(nv)::value, kEx>, grid_kv, smem, shapes, P, lp, Dp, dkp, dvp);
            });
            launch(op, attn_bwd_dq_tc<kBc, decltype(nd)::value, kEx>, grid_q, smem, shapes, P, lp, Dp, dqp, nqt);
          });
        });
      });
      return;
    }
  }

  // 2. dK, dV
  const int64_t nkt = ceil_div(s.S, kRows);
  const unsigned grid_kv = grid_of(op, nkt * s.B * s.Hkv, shapes);
  const size_t smem_kv = dkv_smem<T>(P.d, P.dv).bytes;
  with_nc(std::max(s.d, s.dv),
          [&](auto nc) { launch(op, attn_bwd_dkdv<T, decltype(nc)::value>, grid_kv, smem_kv, shapes, P, lp, Dp, dkp, dvp); });

  // 3. dQ
  const int64_t nqt = ceil_div(s.T, kRows);
  const unsigned grid_q = grid_of(op, nqt * s.B * s.H, shapes);
  const size_t smem_q = dq_smem<T>(P.d, P.dv).bytes;
  with_nc(s.d, [&](auto nc) { launch(op, attn_bwd_dq<T, decltype(nc)::value>, grid_q, smem_q, shapes, P, lp, Dp, dqp, nqt); });
}

// bf16 / f16 (Cuda::attention_half): the operands widened to contiguous f32 device copies, the f32
// kernels told that they hold half values (exact), the outputs rounded once to the half dtype. LSE and
// an additive mask are f32 already (core/fused.hpp).
struct Wide {
  std::shared_ptr<CudaStorage> s;
  Layout l;
  explicit Wide(const Shape& shape)
      : s(Cuda::allocate(static_cast<size_t>(std::max<int64_t>(numel(shape), 1)) * sizeof(float))), l(shape) {}
  Cuda::V in() const { return {*s, l, DType::f32}; }
  Cuda::M out() { return {*s, l, DType::f32}; }
};
Wide widen(const Cuda::V& x) {
  Wide w(x.layout.shape);
  Cuda::copy(w.out(), x);
  return w;
}
// A zero-filled f32 output for a half one (the backward's outputs arrive zero-filled).
Wide zeros_for(const Cuda::M& x) {
  Wide w(x.layout.shape);
  Cuda::fill(w.out(), Scalar(0.0));
  return w;
}

// bf16/f16 q, k, v on attn_fwd_h where it takes them (tensor cores and half products on, head dims
// h_fits, tiles within the device's shared memory); false otherwise (the caller widens).
template <class H> bool forward_half(Cuda::M o, Cuda::M lse, Cuda::V q, Cuda::V k, Cuda::V v, const Cuda::V* kp, const Cuda::V* mask,
                                     double scale, bool causal, int64_t pos0) {
  const char* op = "attention_forward";
  Shapes s{};
  const Params<H> P = make_params<H>(op, s, q, k, v, kp, mask, scale, causal, pos0);
  const int cols = tc_cols(false, s), rows = h_query_rows(s);
  if (!cuda::attention_half_products() || !use_tc(h_fits(s.d, s.dv), h_fwd_smem(cols, P.d, P.dv, rows).bytes)) return false;
  const std::string shapes = s.str(q, k, v);
  check_output(op, "o", o, dtype_of<H>, {s.B, s.H, s.T, s.dv}, shapes);
  check_output(op, "lse", lse, DType::f32, {s.B, s.H, s.T}, shapes);
  if (s.B * s.H * s.T == 0) return true;
  const int64_t nqt = ceil_div(s.T, rows);
  const unsigned grid = grid_of(op, nqt * s.B * s.H, shapes);
  H* const op_ = o.storage.as<H>() + o.layout.offset;
  float* const lp = lse.storage.as<float>() + lse.layout.offset;
  with_cols(cols, [&](auto bc) {
    const size_t smem = h_fwd_smem(bc, P.d, P.dv, rows).bytes;
    with_pieces(s.dv, [&](auto nv) {
      constexpr int BC = decltype(bc)::value, NV = decltype(nv)::value;
      launch_rows<NV>(op, rows, attn_fwd_h<H, BC, NV, 1>, attn_fwd_h < H, BC, NV, NV == 8 ? 2 : 1 >, grid, smem, shapes, P, op_, lp, nqt);
    });
  });
  return true;
}

// bf16/f16 backward on attn_bwd_dkdv_h / attn_bwd_dq_h where they take it (tensor cores and half
// products on, head dims h_bwd_fits, tiles within the device's shared memory); false otherwise (the
// caller widens). Columns per step as the f32 kernels'.
template <class H> bool backward_half(Cuda::M dq, Cuda::M dk, Cuda::M dv, Cuda::V q, Cuda::V k, Cuda::V v, Cuda::V o, Cuda::V lse,
                                      Cuda::V dout, const Cuda::V* kp, const Cuda::V* mask, double scale, bool causal, int64_t pos0) {
  const char* op = "attention_backward";
  Shapes s{};
  Params<H> P = make_params<H>(op, s, q, k, v, kp, mask, scale, causal, pos0);
  const int cols = tc_cols(true, s), rows = h_query_rows(s);
  if (!cuda::attention_half_products() ||
      !use_tc(h_bwd_fits(s.d, s.dv), std::max(h_bwd_smem(true, cols, P.d, P.dv).bytes, h_bwd_smem(false, cols, P.d, P.dv, rows).bytes)))
    return false;
  const std::string shapes = s.str(q, k, v);
  const BwdCommon<H> c = backward_common<H>(op, P, s, shapes, dq, dk, dv, o, lse, dout);  // D = rowsum(dO ⊙ O) in f32
  if (!c.D) return true;
  const float *const lp = c.lse, *const Dp = c.D->template as<float>();
  H *const dqp = out_ptr<H>(dq), *const dkp = out_ptr<H>(dk), *const dvp = out_ptr<H>(dv);

  const unsigned grid_kv = grid_of(op, ceil_div(s.S, kTcRows) * s.B * s.Hkv, shapes);
  const int64_t nqt = ceil_div(s.T, rows);
  const unsigned grid_q = grid_of(op, nqt * s.B * s.H, shapes);
  with_cols(cols, [&](auto bc) {
    constexpr int kBc = decltype(bc)::value;
    with_pieces(s.d, [&](auto nd) {
      constexpr int ND = decltype(nd)::value;
      with_pieces(s.dv, [&](auto nv) {
        launch(op, attn_bwd_dkdv_h<H, kBc, ND, decltype(nv)::value>, grid_kv, h_bwd_smem(true, kBc, P.d, P.dv).bytes, shapes, P, lp, Dp,
               dkp, dvp);
      });
      launch_rows<ND>(op, rows, attn_bwd_dq_h<H, kBc, ND, 1>, attn_bwd_dq_h < H, kBc, ND, ND == 8 ? 2 : 1 >, grid_q,
                      h_bwd_smem(false, kBc, P.d, P.dv, rows).bytes, shapes, P, lp, Dp, dqp, nqt);
    });
  });
  return true;
}

struct Named {
  const char* name;
  DType dtype;
};
void check_half(const char* op, DType dt, std::initializer_list<Named> xs, DType lse) {
  for (const Named& x : xs) KILN_CHECK(x.dtype == dt, "{}: {} must be {} like q, got {}", op, x.name, dt, x.dtype);
  KILN_CHECK(lse == DType::f32, "{}: lse must be f32 for {} operands, got {}", op, dt, lse);
}

}  // namespace

// softcap: always 0 here (the Cuda kernels have no soft cap, so core/fused.hpp takes the composite path).
void Cuda::attention_forward(M o, M lse, V q, V k, V v, const V* key_padding, const V* mask, double scale, bool causal, int64_t pos0,
                             double softcap) {
  KILN_CHECK(softcap == 0, "attention_forward: the Cuda kernels have no soft cap (got {}; core/fused.hpp takes the composite)", softcap);
  if (is_half(q.dtype)) {
    check_half("attention_forward", q.dtype, {{"k", k.dtype}, {"v", v.dtype}, {"o", o.dtype}}, lse.dtype);
    bool done = false;
    visit_float(q.dtype, "attention_forward", q.layout.shape, [&]<class H>(type_tag<H>) {
      if constexpr (std::is_same_v<H, bf16> || std::is_same_v<H, f16>)
        done = forward_half<H>(o, lse, q, k, v, key_padding, mask, scale, causal, pos0);
    });
    if (done) return;
    const Wide q32 = widen(q), k32 = widen(k), v32 = widen(v);
    Wide o32(o.layout.shape);
    forward<float>(o32.out(), lse, q32.in(), k32.in(), v32.in(), key_padding, mask, scale, causal, pos0, true);
    return copy(o, o32.in());
  }
  visit_f32_f64(q.dtype, "attention_forward", q.layout.shape,
                [&]<class T>(type_tag<T>) { forward<T>(o, lse, q, k, v, key_padding, mask, scale, causal, pos0); });
}

void Cuda::attention_backward(M dq, M dk, M dv, V q, V k, V v, V o, V lse, V dout, const V* key_padding, const V* mask, double scale,
                              bool causal, int64_t pos0, double softcap) {
  KILN_CHECK(softcap == 0, "attention_backward: the Cuda kernels have no soft cap (got {}; core/fused.hpp takes the composite)", softcap);
  if (is_half(q.dtype)) {
    check_half("attention_backward", q.dtype,
               {{"k", k.dtype}, {"v", v.dtype}, {"o", o.dtype}, {"dout", dout.dtype}, {"dq", dq.dtype}, {"dk", dk.dtype}, {"dv", dv.dtype}},
               lse.dtype);
    bool done = false;
    visit_float(q.dtype, "attention_backward", q.layout.shape, [&]<class H>(type_tag<H>) {
      if constexpr (std::is_same_v<H, bf16> || std::is_same_v<H, f16>)
        done = backward_half<H>(dq, dk, dv, q, k, v, o, lse, dout, key_padding, mask, scale, causal, pos0);
    });
    if (done) return;
    const Wide q32 = widen(q), k32 = widen(k), v32 = widen(v), o32 = widen(o), g32 = widen(dout);
    Wide dq32 = zeros_for(dq), dk32 = zeros_for(dk), dv32 = zeros_for(dv);
    backward<float>(dq32.out(), dk32.out(), dv32.out(), q32.in(), k32.in(), v32.in(), o32.in(), lse, g32.in(), key_padding, mask, scale,
                    causal, pos0, true);
    copy(dq, dq32.in());
    copy(dk, dk32.in());
    return copy(dv, dv32.in());
  }
  visit_f32_f64(q.dtype, "attention_backward", q.layout.shape,
                [&]<class T>(type_tag<T>) { backward<T>(dq, dk, dv, q, k, v, o, lse, dout, key_padding, mask, scale, causal, pos0); });
}

}  // namespace kiln

#include "kiln/core/fused.hpp"
static_assert(kiln::fused::HasAttention<kiln::Cuda> && kiln::fused::HasAttentionBackward<kiln::Cuda>,
              "Cuda's flash attention must match the override signatures of core/fused.hpp");
