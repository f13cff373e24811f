// Reference convolution and pooling: the definition written as loops, accumulated in double.
// Every tensor is contiguous NCHW (core/fused_conv.hpp guarantees it); f32 and f64 only.
//   y[n, o, oh, ow] = b[o] + Σ_{c, i, j} x[n, g·Cg + c, oh·sh − ph + i·dh, ow·sw − pw + j·dw] · w[o, c, i, j]
// with g = o / (O/groups) and out-of-range input positions reading zero; the backward passes visit
// the same (output, tap) pairs and accumulate into dx or dw.
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/backends/reference/reference.hpp"

namespace kiln {
namespace {

using V = Reference::V;
using M = Reference::M;

template <class F> bool float_dispatch(DType d, F&& f) {
  if (d == DType::f32)
    f(float{});
  else if (d == DType::f64)
    f(double{});
  else
    return false;
  return true;
}

template <class T> const T* ptr(const V& v) { return v.storage.as<T>() + v.layout.offset; }
template <class T> T* ptr(const M& m) { return m.storage.as<T>() + m.layout.offset; }

struct Geo {
  int64_t N, C, H, W, O, Ho, Wo, kh, kw, Cg, Og;
};
Geo geometry(const Shape& x, const Shape& w, const Shape& y, int64_t groups) {
  return {x[0], x[1], x[2], x[3], y[1], y[2], y[3], w[2], w[3], x[1] / groups, y[1] / groups};
}

// Calls f(x_index, w_index, y_index) for every (output element, kernel tap) reading inside the input.
template <class F> void for_taps(const Geo& g, const Conv2dParams& p, F&& f) {
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t o = 0; o < g.O; ++o) {
      const int64_t grp = o / g.Og;
      for (int64_t oh = 0; oh < g.Ho; ++oh)
        for (int64_t ow = 0; ow < g.Wo; ++ow) {
          const int64_t yi = ((n * g.O + o) * g.Ho + oh) * g.Wo + ow;
          for (int64_t c = 0; c < g.Cg; ++c)
            for (int64_t i = 0; i < g.kh; ++i) {
              const int64_t ih = oh * p.stride.h - p.padding.h + i * p.dilation.h;
              if (ih < 0 || ih >= g.H) continue;
              for (int64_t j = 0; j < g.kw; ++j) {
                const int64_t iw = ow * p.stride.w - p.padding.w + j * p.dilation.w;
                if (iw < 0 || iw >= g.W) continue;
                f(((n * g.C + grp * g.Cg + c) * g.H + ih) * g.W + iw, ((o * g.Cg + c) * g.kh + i) * g.kw + j, yi);
              }
            }
        }
    }
}

// The window of output (oh, ow) of a pooling: calls f(ih, iw) for its taps inside the input.
template <class F> void for_window(int64_t oh, int64_t ow, int64_t H, int64_t W, const Pool2dParams& p, F&& f) {
  for (int64_t i = 0; i < p.kernel.h; ++i) {
    const int64_t ih = oh * p.stride.h - p.padding.h + i * p.dilation.h;
    if (ih < 0 || ih >= H) continue;
    for (int64_t j = 0; j < p.kernel.w; ++j) {
      const int64_t iw = ow * p.stride.w - p.padding.w + j * p.dilation.w;
      if (iw >= 0 && iw < W) f(ih, iw);
    }
  }
}

// PyTorch's avg_pool2d divisor of output (oh, ow).
double avg_divisor(int64_t oh, int64_t ow, int64_t H, int64_t W, const Pool2dParams& p) {
  int64_t hs = oh * p.stride.h - p.padding.h, ws = ow * p.stride.w - p.padding.w;
  int64_t he = std::min(hs + p.kernel.h, H + p.padding.h), we = std::min(ws + p.kernel.w, W + p.padding.w);
  const int64_t pool = (he - hs) * (we - ws);
  hs = std::max<int64_t>(hs, 0), ws = std::max<int64_t>(ws, 0), he = std::min(he, H), we = std::min(we, W);
  return static_cast<double>(p.count_include_pad ? pool : (he - hs) * (we - ws));
}

}  // namespace

bool Reference::conv2d_forward(M y, V x, V w, const V* bias, const Conv2dParams& p) {
  return float_dispatch(x.dtype, [&]<class T>(T) {
    const Geo g = geometry(x.layout.shape, w.layout.shape, y.layout.shape, p.groups);
    std::vector<double> acc(static_cast<size_t>(y.layout.numel()), 0.0);
    const T *xp = ptr<T>(x), *wp = ptr<T>(w);
    for_taps(g, p, [&](int64_t xi, int64_t wi, int64_t yi) {
      acc[static_cast<size_t>(yi)] += static_cast<double>(xp[xi]) * static_cast<double>(wp[wi]);
    });
    T* yp = ptr<T>(y);
    const int64_t plane = g.Ho * g.Wo;
    for (int64_t i = 0; i < y.layout.numel(); ++i)
      yp[i] = static_cast<T>(acc[static_cast<size_t>(i)] + (bias ? static_cast<double>(ptr<T>(*bias)[(i / plane) % g.O]) : 0.0));
  });
}

bool Reference::conv2d_backward_input(M dx, V dy, V w, const Conv2dParams& p) {
  return float_dispatch(dy.dtype, [&]<class T>(T) {
    const Geo g = geometry(dx.layout.shape, w.layout.shape, dy.layout.shape, p.groups);
    std::vector<double> acc(static_cast<size_t>(dx.layout.numel()), 0.0);
    const T *gp = ptr<T>(dy), *wp = ptr<T>(w);
    for_taps(g, p, [&](int64_t xi, int64_t wi, int64_t yi) {
      acc[static_cast<size_t>(xi)] += static_cast<double>(gp[yi]) * static_cast<double>(wp[wi]);
    });
    T* o = ptr<T>(dx);
    for (size_t i = 0; i < acc.size(); ++i) o[i] = static_cast<T>(acc[i]);
  });
}

bool Reference::conv2d_backward_weight(M dw, M* db, V dy, V x, const Conv2dParams& p) {
  return float_dispatch(dy.dtype, [&]<class T>(T) {
    const Geo g = geometry(x.layout.shape, dw.layout.shape, dy.layout.shape, p.groups);
    std::vector<double> acc(static_cast<size_t>(dw.layout.numel()), 0.0);
    const T *gp = ptr<T>(dy), *xp = ptr<T>(x);
    for_taps(g, p, [&](int64_t xi, int64_t wi, int64_t yi) {
      acc[static_cast<size_t>(wi)] += static_cast<double>(gp[yi]) * static_cast<double>(xp[xi]);
    });
    T* o = ptr<T>(dw);
    for (size_t i = 0; i < acc.size(); ++i) o[i] = static_cast<T>(acc[i]);
    if (db) {
      std::vector<double> b(static_cast<size_t>(g.O), 0.0);
      const int64_t plane = g.Ho * g.Wo;
      for (int64_t i = 0; i < dy.layout.numel(); ++i) b[static_cast<size_t>((i / plane) % g.O)] += static_cast<double>(gp[i]);
      T* bo = ptr<T>(*db);
      for (size_t i = 0; i < b.size(); ++i) bo[i] = static_cast<T>(b[i]);
    }
  });
}

// PyTorch's rule: the first maximum in scan order wins, a NaN wins over everything (the last NaN);
// a window whose values are all −inf reports its first tap (its start moved past the padding).
bool Reference::max_pool2d_forward(M y, M idx, V x, const Pool2dParams& p) {
  return float_dispatch(x.dtype, [&]<class T>(T) {
    const Shape& xs = x.layout.shape;
    const int64_t H = xs[2], W = xs[3], Ho = y.layout.shape[2], Wo = y.layout.shape[3], planes = xs[0] * xs[1];
    const T* xp = ptr<T>(x);
    T* yp = ptr<T>(y);
    int64_t* ip = ptr<int64_t>(idx);
    for (int64_t pl = 0; pl < planes; ++pl)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          double best = -std::numeric_limits<double>::infinity();
          int64_t h0 = oh * p.stride.h - p.padding.h, w0 = ow * p.stride.w - p.padding.w;
          while (h0 < 0) h0 += p.dilation.h;
          while (w0 < 0) w0 += p.dilation.w;
          int64_t arg = h0 * W + w0;  // PyTorch's index when no tap beats −inf
          for_window(oh, ow, H, W, p, [&](int64_t ih, int64_t iw) {
            const double v = static_cast<double>(xp[(pl * H + ih) * W + iw]);
            if (v > best || std::isnan(v)) {
              best = v;
              arg = ih * W + iw;
            }
          });
          const int64_t o = (pl * Ho + oh) * Wo + ow;
          yp[o] = static_cast<T>(best);
          ip[o] = arg;
        }
  });
}

bool Reference::max_pool2d_backward(M dx, V dy, V idx, const Pool2dParams&) {
  return float_dispatch(dy.dtype, [&]<class T>(T) {
    const Shape& xs = dx.layout.shape;
    const int64_t HW = xs[2] * xs[3], L = dy.layout.shape[2] * dy.layout.shape[3], planes = xs[0] * xs[1];
    std::vector<double> acc(static_cast<size_t>(dx.layout.numel()), 0.0);
    const T* gp = ptr<T>(dy);
    const int64_t* ip = ptr<int64_t>(idx);
    for (int64_t pl = 0; pl < planes; ++pl)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t k = ip[pl * L + l];
        KILN_CHECK(k >= 0 && k < HW, "max_pool2d_backward: index {} out of range [0, {})", k, HW);
        acc[static_cast<size_t>(pl * HW + k)] += static_cast<double>(gp[pl * L + l]);
      }
    T* o = ptr<T>(dx);
    for (size_t i = 0; i < acc.size(); ++i) o[i] = static_cast<T>(acc[i]);
  });
}

bool Reference::avg_pool2d_forward(M y, V x, const Pool2dParams& p) {
  return float_dispatch(x.dtype, [&]<class T>(T) {
    const Shape& xs = x.layout.shape;
    const int64_t H = xs[2], W = xs[3], Ho = y.layout.shape[2], Wo = y.layout.shape[3], planes = xs[0] * xs[1];
    const T* xp = ptr<T>(x);
    T* yp = ptr<T>(y);
    for (int64_t pl = 0; pl < planes; ++pl)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          double s = 0;
          for_window(oh, ow, H, W, p, [&](int64_t ih, int64_t iw) { s += static_cast<double>(xp[(pl * H + ih) * W + iw]); });
          yp[(pl * Ho + oh) * Wo + ow] = static_cast<T>(s / avg_divisor(oh, ow, H, W, p));
        }
  });
}

bool Reference::avg_pool2d_backward(M dx, V dy, const Pool2dParams& p) {
  return float_dispatch(dy.dtype, [&]<class T>(T) {
    const Shape& xs = dx.layout.shape;
    const int64_t H = xs[2], W = xs[3], Ho = dy.layout.shape[2], Wo = dy.layout.shape[3], planes = xs[0] * xs[1];
    std::vector<double> acc(static_cast<size_t>(dx.layout.numel()), 0.0);
    const T* gp = ptr<T>(dy);
    for (int64_t pl = 0; pl < planes; ++pl)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          const double g = static_cast<double>(gp[(pl * Ho + oh) * Wo + ow]) / avg_divisor(oh, ow, H, W, p);
          for_window(oh, ow, H, W, p, [&](int64_t ih, int64_t iw) { acc[static_cast<size_t>((pl * H + ih) * W + iw)] += g; });
        }
    T* o = ptr<T>(dx);
    for (size_t i = 0; i < acc.size(); ++i) o[i] = static_cast<T>(acc[i]);
  });
}

}  // namespace kiln
