// Activation kernels: the gated family (act(gate) * up, and the interleaved swigluoai form) and
// the element-wise GELU family. Formulas follow reference_impl/ir/ops/activation.py; everything
// is computed in fp32 and rounded once to the output dtype. NaN inputs propagate as in torch
// (threshold keeps NaN, clamp and relu propagate it).
#include "vec_common.h"

namespace reference_cpu {
namespace {

// Constants are built inside functions (no static initializers compiled for the vector ISA).
inline fVec one() { return fVec(1.0f); }
inline fVec half() { return fVec(0.5f); }

// sigmoid(v); every caller multiplies it by a value that carries a NaN input through.
inline fVec sigmoid(const fVec& v) { return div_by_denominator(one(), one() + fast_exp(v.neg())); }

struct Silu {
  static inline fVec apply(const fVec& v, const fVec&) { return div_by_denominator(v, one() + fast_exp(v.neg())); }
};

// The GELU forms compute 1 + erf / 1 + tanh, which cancels for large negative inputs. In
// gelu_and_mul the `up` factor can amplify the difference between an accurate result and the
// native op's cancelled one beyond the fp32 tolerance, so fp32 gated GELU uses torch's own
// vectorized erf/tanh (the native op's functions, kTorchMath). Elsewhere the tanh form is
// evaluated as the identity 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)): no cancellation, one
// polynomial exp, exact 0 / x saturation; and erf by the rational fast_erf. Their few-ulp error
// is far below the fp32 tolerance and the rounding of 16-bit outputs.
template <bool kTorchMath = false>
struct GeluErf {
  static inline fVec apply(const fVec& v, const fVec&) {
    const fVec k(static_cast<float>(M_SQRT1_2));
    return half() * v * (one() + (kTorchMath ? (v * k).erf() : fast_erf(v * k)));
  }
};

// x * sigmoid(2u) = 0.5 x (1 + tanh(u)).
inline fVec x_sigmoid_2u(const fVec& x, const fVec& u) {
  return div_by_denominator(x, one() + fast_exp(fVec(-2.f) * u));
}

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): gelu(approximate="tanh") and gelu_new.
template <bool kTorchMath = false>
struct GeluTanh {
  static inline fVec apply(const fVec& v, const fVec&) {
    const fVec beta(0.7978845608028654f);
    const fVec kappa(0.044715f);
    const fVec inner = beta * (v + kappa * v * v * v);
    if constexpr (kTorchMath) return half() * v * (one() + inner.tanh());
    return x_sigmoid_2u(v, inner);
  }
};

// 0.5 x (1 + tanh(x * 0.7978845608 * (1 + 0.044715 x^2))).
struct GeluFast {
  static inline fVec apply(const fVec& v, const fVec&) {
    const fVec c(0.7978845608f);
    const fVec kappa(0.044715f);
    return x_sigmoid_2u(v, v * c * (one() + kappa * v * v));
  }
};

struct QuickGelu {
  static inline fVec apply(const fVec& v, const fVec&) { return v * sigmoid(fVec(1.702f) * v); }
};

struct Relu2 {
  static inline fVec apply(const fVec& v, const fVec&) {
    const fVec r = at::vec::maximum(v, fVec(0.f));
    return r * r;
  }
};

// threshold(x, t, 0): x <= t gives 0, otherwise (including NaN) x.
struct FatRelu {
  static inline fVec apply(const fVec& v, const fVec& threshold) {
    return fVec::blendv(v, fVec(0.f), v <= threshold);
  }
};

template <typename T, typename Act, bool kActOnSecond>
void gated_rows(const T* x, RowIndex x_rows, T* out, int64_t rows, int64_t d, float param) {
  const fVec p(param);
  at::parallel_for(0, rows, row_grain(3 * d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* first = x + x_rows(r);
      const T* second = first + d;
      T* o = out + r * d;
      const T* next = r + 1 < end ? x + x_rows(r + 1) : nullptr;
      for (int64_t j = 0; j < d; j += kChunk) {
        const int64_t len = std::min<int64_t>(kChunk, d - j);
        if (next != nullptr) {  // the next row, chunk by chunk (see prefetch_bytes)
          prefetch_bytes(next + j, kChunk * sizeof(T));
          prefetch_bytes(next + d + j, kChunk * sizeof(T));
          prefetch_bytes<true>(o + d + j, kChunk * sizeof(T));
        }
        fVec a0, a1, b0, b1;
        load_n(first + j, len, a0, a1);
        load_n(second + j, len, b0, b1);
        if constexpr (kActOnSecond) {
          a0 = a0 * Act::apply(b0, p);
          a1 = a1 * Act::apply(b1, p);
        } else {
          a0 = Act::apply(a0, p) * b0;
          a1 = Act::apply(a1, p) * b1;
        }
        store_n(o + j, len, a0, a1);
      }
    }
  });
}

template <typename T, typename Act>
void unary_rows(const T* x, RowIndex x_rows, T* out, int64_t rows, int64_t hidden) {
  const fVec unused(0.f);
  const bool stream_all = stream_output<T>(rows * hidden * static_cast<int64_t>(sizeof(T)));
  at::parallel_for(0, rows, row_grain(2 * hidden), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + x_rows(r);
      T* o = out + r * hidden;
      const bool stream = stream_all && aligned64(o);
      const T* next = r + 1 < end ? x + x_rows(r + 1) : nullptr;
      for (int64_t j = 0; j < hidden; j += kChunk) {
        const int64_t len = std::min<int64_t>(kChunk, hidden - j);
        if (next != nullptr) {
          prefetch_bytes(next + j, kChunk * sizeof(T));
          if (!stream) prefetch_bytes<true>(o + hidden + j, kChunk * sizeof(T));
        }
        fVec a, b;
        load_n(xr + j, len, a, b);
        store_out(o + j, len, stream, Act::apply(a, unused), Act::apply(b, unused));
      }
    }
    stream_fence();
  });
}

}  // namespace

template <typename T>
void gated_activation(Gated kind, const T* x, RowIndex x_rows, T* out, int64_t rows, int64_t d,
                      float param) {
  switch (kind) {
    case Gated::kSiluAndMul:
      return gated_rows<T, Silu, false>(x, x_rows, out, rows, d, param);
    case Gated::kMulAndSilu:
      return gated_rows<T, Silu, true>(x, x_rows, out, rows, d, param);
    case Gated::kGeluAndMul:
      return gated_rows<T, GeluErf<std::is_same_v<T, float>>, false>(x, x_rows, out, rows, d, param);
    case Gated::kGeluTanhAndMul:
      return gated_rows<T, GeluTanh<std::is_same_v<T, float>>, false>(x, x_rows, out, rows, d, param);
    case Gated::kFatreluAndMul:
      return gated_rows<T, FatRelu, false>(x, x_rows, out, rows, d, param);
  }
}

template <typename T>
void swigluoai_and_mul(const T* x, RowIndex x_rows, T* out, int64_t rows, int64_t d, float alpha,
                       float limit) {
  const fVec va(alpha), vlim(limit), vneg_lim(-limit);
  at::parallel_for(0, rows, row_grain(3 * d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + x_rows(r);
      T* o = out + r * d;
      const T* next = r + 1 < end ? x + x_rows(r + 1) : nullptr;
      for (int64_t j = 0; j < d; j += kChunk) {
        const int64_t len = std::min<int64_t>(kChunk, d - j);  // outputs in this step
        if (next != nullptr) {
          prefetch_bytes(next + 2 * j, 2 * kChunk * sizeof(T));
          prefetch_bytes<true>(o + d + j, kChunk * sizeof(T));
        }
        const int64_t in0 = std::min<int64_t>(2 * len, kChunk);
        const int64_t in1 = 2 * len - in0;
        fVec x0, x1, x2(0.f), x3(0.f);
        load_n(xr + 2 * j, in0, x0, x1);
        if (in1 > 0) load_n(xr + 2 * j + kChunk, in1, x2, x3);
        auto [g0, u0] = at::vec::deinterleave2(x0, x1);
        auto [g1, u1] = at::vec::deinterleave2(x2, x3);
        g0 = min_keep_nan(g0, vlim);
        g1 = min_keep_nan(g1, vlim);
        u0 = clamp_keep_nan(u0, vneg_lim, vlim);
        u1 = clamp_keep_nan(u1, vneg_lim, vlim);
        const fVec o0 = (u0 + one()) * (g0 * sigmoid(g0 * va));
        const fVec o1 = (u1 + one()) * (g1 * sigmoid(g1 * va));
        store_n(o + j, len, o0, o1);
      }
    }
  });
}

template <typename T>
void unary_activation(Unary kind, const T* x, RowIndex x_rows, T* out, int64_t rows, int64_t hidden) {
  switch (kind) {
    case Unary::kGeluNew:
      return unary_rows<T, GeluTanh<>>(x, x_rows, out, rows, hidden);
    case Unary::kGeluFast:
      return unary_rows<T, GeluFast>(x, x_rows, out, rows, hidden);
    case Unary::kQuickGelu:
      return unary_rows<T, QuickGelu>(x, x_rows, out, rows, hidden);
    case Unary::kRelu2:
      return unary_rows<T, Relu2>(x, x_rows, out, rows, hidden);
  }
}

#define INSTANTIATE_ACT(T)                                                                        \
  template void gated_activation<T>(Gated, const T*, RowIndex, T*, int64_t, int64_t, float);     \
  template void swigluoai_and_mul<T>(const T*, RowIndex, T*, int64_t, int64_t, float, float);    \
  template void unary_activation<T>(Unary, const T*, RowIndex, T*, int64_t, int64_t);
REFERENCE_CPU_INSTANTIATE(INSTANTIATE_ACT)

}  // namespace reference_cpu
