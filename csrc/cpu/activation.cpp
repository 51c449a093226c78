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

// Precision of the sigmoid forms per output type: the degree of the exp2 polynomial (see
// fast_exp2: a few fp32 ulp for fp32 outputs, far below the output's rounding step for the 16-bit
// ones) and the reciprocal: for fp32 the Newton-refined one, for 16-bit outputs on AVX512 the bare
// 14-bit one (~6e-5 relative).
template <typename T>
constexpr bool kFullPrecision = std::is_same_v<T, float>;
template <typename T>
constexpr int kExp2Degree = std::is_same_v<T, float> ? 5 : std::is_same_v<T, c10::Half> ? 4 : 3;

constexpr float kLog2e = 1.44269504088896341f;

// v * sigmoid(k v) = v / (1 + exp(-k v)) = v / (1 + 2^w) for w = -k log2(e) v; the divide
// carries a NaN v through.
template <typename T>
REFERENCE_CPU_INLINE fVec x_sigmoid_exp2(const fVec& v, const fVec& w) {
  const fVec denominator = one() + fast_exp2<kExp2Degree<T>>(w);
  return kFullPrecision<T> ? div_by_denominator(v, denominator) : div_by_denominator_16bit(v, denominator);
}

// v * sigmoid(k v); nk2 = -k log2(e).
template <typename T>
REFERENCE_CPU_INLINE fVec x_sigmoid(const fVec& v, const fVec& nk2) { return x_sigmoid_exp2<T>(v, nk2 * v); }

template <typename T>
struct Silu {
  static REFERENCE_CPU_INLINE fVec apply(const fVec& v, const fVec&) { return x_sigmoid<T>(v, fVec(-kLog2e)); }
};

// The GELU forms compute 1 + erf / 1 + tanh, which cancels for large negative inputs. In
// gelu_and_mul the `up` factor can amplify the difference between an accurate result and the
// native op's cancelled one beyond the fp32 tolerance, so fp32 gated GELU uses torch's own
// vectorized erf/tanh (the native op's functions, kTorchMath). Elsewhere the tanh form is
// evaluated as the identity 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)): no cancellation, one
// polynomial exp, exact 0 / x saturation; and erf by the rational fast_erf. Their few-ulp error
// is far below the fp32 tolerance and the rounding of 16-bit outputs.
//
// The erf of torch's vectorized CPU code (at::vec's Vectorized<float>::erf: Abramowitz & Stegun
// 7.1.26, erf = sign(x) (1 - r(t) t exp(-x^2)), t = 1 / (1 + p |x|), same constants and operation
// order), with exp(-x^2) by the inlined fast_exp2 instead of a call into Sleef: within a few fp32
// ulp of it, and the compiler can interleave the four independent vectors of a step, which the
// library call serialized (fp32 gelu_and_mul was 0.90-0.99 of inductor, which calls the same erf).
REFERENCE_CPU_INLINE fVec torch_form_erf(const fVec& x) {
  const fVec sign = x & fVec(-0.f);
  const fVec ax = x ^ sign;
  const fVec t = one() / at::vec::fmadd(fVec(0.3275911f), ax, one());
  fVec r = at::vec::fmadd(fVec(1.061405429f), t, fVec(-1.453152027f));
  r = at::vec::fmadd(r, t, fVec(1.421413741f));
  r = at::vec::fmadd(r, t, fVec(-0.284496736f));
  r = at::vec::fmadd(r, t, fVec(0.254829592f));
  const fVec neg_e = fVec(-0.f) ^ fast_exp2<5>((x * x) * fVec(-kLog2e));
  return at::vec::fmadd(neg_e * t, r, one()) ^ sign;
}

// tanh(u) within about one fp32 ulp, inlined where at::vec's tanh calls Sleef: u + u^3 P(u^2) for
// |u| < 0.55 (P fitted for relative error: at most 0.77 ulp there), else sign(u) (1 - 2 / (1 +
// e^{2|u|})), which does not cancel for |u| >= 0.55. Saturates to +-1 like tanh; a NaN u gives
// +-1 (the caller multiplies by the NaN input, which keeps the NaN).
REFERENCE_CPU_INLINE fVec inline_tanh(const fVec& u) {
  const fVec sign = u & fVec(-0.f);
  const fVec a = u ^ sign;
  const fVec s = u * u;
  fVec p(0.0024048422928899527f);
  p = at::vec::fmadd(p, s, fVec(-0.008422206155955791f));
  p = at::vec::fmadd(p, s, fVec(0.02178565226495266f));
  p = at::vec::fmadd(p, s, fVec(-0.05396009609103203f));
  p = at::vec::fmadd(p, s, fVec(0.1333329677581787f));
  p = at::vec::fmadd(p, s, fVec(-0.3333333134651184f));
  const fVec small = at::vec::fmadd(u * s, p, u);
  const fVec e = fast_exp2<5>(a * fVec(2.f * kLog2e));
  const fVec large = (one() - fVec(2.f) / (e + one())) ^ sign;
  return fVec::blendv(large, small, a < fVec(0.55f));
}

template <bool kTorchMath = false>
struct GeluErf {
  static REFERENCE_CPU_INLINE fVec apply(const fVec& v, const fVec&) {
    const fVec k(static_cast<float>(M_SQRT1_2));
    return half() * v * (one() + (kTorchMath ? torch_form_erf(v * k) : fast_erf(v * k)));
  }
};

// x * sigmoid(2u) = 0.5 x (1 + tanh(u)), for u = v * (c + c k v^2): the exponent of the sigmoid's
// 2^w is w = -2 log2(e) u = v * (-2c log2(e) - 2ck log2(e) v^2).
template <typename T>
REFERENCE_CPU_INLINE fVec x_sigmoid_2u(const fVec& v, float c, float k) {
  const float b = -2.f * c * kLog2e;
  return x_sigmoid_exp2<T>(v, v * at::vec::fmadd(fVec(b * k), v * v, fVec(b)));
}

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): gelu(approximate="tanh") and gelu_new.
template <typename T, bool kTorchMath = false>
struct GeluTanh {
  static REFERENCE_CPU_INLINE fVec apply(const fVec& v, const fVec&) {
    if constexpr (kTorchMath) {
      const fVec inner = fVec(0.7978845608028654f) * (v + fVec(0.044715f) * v * v * v);
      return half() * v * (one() + inline_tanh(inner));
    }
    return x_sigmoid_2u<T>(v, 0.7978845608028654f, 0.044715f);
  }
};

// 0.5 x (1 + tanh(x * 0.7978845608 * (1 + 0.044715 x^2))).
template <typename T>
struct GeluFast {
  static REFERENCE_CPU_INLINE fVec apply(const fVec& v, const fVec&) {
    return x_sigmoid_2u<T>(v, 0.7978845608f, 0.044715f);
  }
};

// x * sigmoid(1.702 x).
template <typename T>
struct QuickGelu {
  static REFERENCE_CPU_INLINE fVec apply(const fVec& v, const fVec&) {
    return x_sigmoid<T>(v, fVec(-1.702f * kLog2e));
  }
};

// relu(x)^2; clamp_min keeps a NaN's own bits (at::vec::maximum makes it all-ones, which the
// bf16 store's rounding does not expect; see bf16_rounding_bits).
struct Relu2 {
  static REFERENCE_CPU_INLINE fVec apply(const fVec& v, const fVec&) {
    const fVec r = clamp_min_keep_nan(v, fVec(0.f));
    return r * r;
  }
};

// threshold(x, t, 0): x <= t gives 0, otherwise (including NaN) x.
struct FatRelu {
  static REFERENCE_CPU_INLINE fVec apply(const fVec& v, const fVec& threshold) {
    return fVec::blendv(v, fVec(0.f), v <= threshold);
  }
};

// The loops below take two chunks (four fp32 vectors) per step: the activations are long
// dependency chains (~60 cycles), and four independent ones per step keep both FMA pipes busy
// where two left them waiting on latency (llvm-mca, znver3: 33 -> ~24 cycles per 16 bf16 gelu_new
// elements). While a row is computed the next row's lines are prefetched, one per 64 bytes.

// One row of a gated activation: o = act(first) * second (kActOnSecond: first * act(second));
// `stream`: non-temporal stores (see store_out).
template <typename T, typename Act, bool kActOnSecond>
inline void gated_row(const T* __restrict first, const T* __restrict second, T* __restrict o, int64_t d,
                      const fVec& p, bool stream, const T* next_first, const T* next_second, const T* next_o) {
  // always inlined: GCC otherwise keeps the erf form's lambda out of line (a call per vector, the four chains
  // serialised through memory; 16-bit gelu_and_mul ran at half the tanh form's speed)
  auto apply = [&](fVec& a, const fVec& b) REFERENCE_CPU_INLINE_LAMBDA {
    a = kActOnSecond ? a * Act::apply(b, p) : Act::apply(a, p) * b;
  };
  int64_t j = 0;
  for (; j + 2 * kChunk <= d; j += 2 * kChunk) {
    if (next_first != nullptr) {
      prefetch_bytes(next_first + j, 2 * kChunk * sizeof(T));
      prefetch_bytes(next_second + j, 2 * kChunk * sizeof(T));
      if (!stream) prefetch_bytes<true>(next_o + j, 2 * kChunk * sizeof(T));
    }
    fVec a0, a1, a2, a3, b0, b1, b2, b3;
    Io<T>::load(first + j, a0, a1);
    Io<T>::load(first + j + kChunk, a2, a3);
    Io<T>::load(second + j, b0, b1);
    Io<T>::load(second + j + kChunk, b2, b3);
    apply(a0, b0);
    apply(a1, b1);
    apply(a2, b2);
    apply(a3, b3);
    store_out(o + j, kChunk, stream, a0, a1);
    store_out(o + j + kChunk, kChunk, stream, a2, a3);
  }
  for (; j < d; j += kChunk) {
    const int64_t len = std::min<int64_t>(kChunk, d - j);
    fVec a0, a1, b0, b1;
    load_n(first + j, len, a0, a1);
    load_n(second + j, len, b0, b1);
    apply(a0, b0);
    apply(a1, b1);
    store_n(o + j, len, a0, a1);
  }
}

template <typename T, typename Act, bool kActOnSecond>
void gated_rows(const T* x, RowIndex x_rows, T* out, int64_t rows, int64_t d, float param) {
  const fVec p(param);
  const bool stream_all = stream_output<T>(rows * d * static_cast<int64_t>(sizeof(T)));
  at::parallel_for(0, rows, row_grain(3 * d), [=](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + x_rows(r);
      const T* next = r + 1 < end ? x + x_rows(r + 1) : nullptr;
      T* o = out + r * d;
      gated_row<T, Act, kActOnSecond>(xr, xr + d, o, d, p, stream_all && aligned64(o), next, next + d, o + d);
    }
    stream_fence();
  });
}

// One row of an element-wise activation; `stream`: non-temporal stores (see store_out).
template <typename T, typename Act>
inline void unary_row(const T* __restrict x, T* __restrict o, int64_t n, bool stream, const T* next_x,
                      const T* next_o) {
  const fVec unused(0.f);
  int64_t j = 0;
  for (; j + 2 * kChunk <= n; j += 2 * kChunk) {
    if (next_x != nullptr) {
      prefetch_bytes(next_x + j, 2 * kChunk * sizeof(T));
      if (!stream) prefetch_bytes<true>(next_o + j, 2 * kChunk * sizeof(T));
    }
    fVec a0, a1, a2, a3;
    Io<T>::load(x + j, a0, a1);
    Io<T>::load(x + j + kChunk, a2, a3);
    store_out(o + j, kChunk, stream, Act::apply(a0, unused), Act::apply(a1, unused));
    store_out(o + j + kChunk, kChunk, stream, Act::apply(a2, unused), Act::apply(a3, unused));
  }
  for (; j < n; j += kChunk) {
    const int64_t len = std::min<int64_t>(kChunk, n - j);
    fVec a, b;
    load_n(x + j, len, a, b);
    store_out(o + j, len, stream, Act::apply(a, unused), Act::apply(b, unused));
  }
}

template <typename T, typename Act>
void unary_rows(const T* x, RowIndex x_rows, T* out, int64_t rows, int64_t hidden) {
  const bool stream_all = stream_output<T>(rows * hidden * static_cast<int64_t>(sizeof(T)));
  at::parallel_for(0, rows, row_grain(2 * hidden), [=](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* o = out + r * hidden;
      const T* next = r + 1 < end ? x + x_rows(r + 1) : nullptr;
      unary_row<T, Act>(x + x_rows(r), o, hidden, stream_all && aligned64(o), next, o + hidden);
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
      return gated_rows<T, Silu<T>, false>(x, x_rows, out, rows, d, param);
    case Gated::kMulAndSilu:
      return gated_rows<T, Silu<T>, true>(x, x_rows, out, rows, d, param);
    case Gated::kGeluAndMul:
      return gated_rows<T, GeluErf<std::is_same_v<T, float>>, false>(x, x_rows, out, rows, d, param);
    case Gated::kGeluTanhAndMul:
      return gated_rows<T, GeluTanh<T, std::is_same_v<T, float>>, false>(x, x_rows, out, rows, d, param);
    case Gated::kFatreluAndMul:
      return gated_rows<T, FatRelu, false>(x, x_rows, out, rows, d, param);
  }
}

template <typename T>
void swigluoai_and_mul(const T* x, RowIndex x_rows, T* out, int64_t rows, int64_t d, float alpha,
                       float limit) {
  const fVec neg_alpha2(-alpha * kLog2e), vlim(limit), vneg_lim(-limit);
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
        fVec g0 = x0, u0 = x1, g1 = x2, u1 = x3;  // even/odd lanes: gates and ups already
        if constexpr (!kEvenOddLanes<T>) {
          std::tie(g0, u0) = at::vec::deinterleave2(x0, x1);
          std::tie(g1, u1) = at::vec::deinterleave2(x2, x3);
        }
        g0 = min_keep_nan(g0, vlim);
        g1 = min_keep_nan(g1, vlim);
        u0 = clamp_keep_nan(u0, vneg_lim, vlim);
        u1 = clamp_keep_nan(u1, vneg_lim, vlim);
        fVec o0 = (u0 + one()) * x_sigmoid<T>(g0, neg_alpha2);
        fVec o1 = (u1 + one()) * x_sigmoid<T>(g1, neg_alpha2);
        to_lanes<T>(o0, o1);  // outputs j.. in order
        store_n(o + j, len, o0, o1);
      }
    }
  });
}

template <typename T>
void unary_activation(Unary kind, const T* x, RowIndex x_rows, T* out, int64_t rows, int64_t hidden) {
  switch (kind) {
    case Unary::kGeluNew:
      return unary_rows<T, GeluTanh<T>>(x, x_rows, out, rows, hidden);
    case Unary::kGeluFast:
      return unary_rows<T, GeluFast<T>>(x, x_rows, out, rows, hidden);
    case Unary::kQuickGelu:
      return unary_rows<T, QuickGelu<T>>(x, x_rows, out, rows, hidden);
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
