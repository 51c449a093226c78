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

// Precision of the sigmoid forms per output type: for fp32, the degree-6 exp polynomial and the
// Newton-refined reciprocal (a few fp32 ulp); for 16-bit outputs, degree 5 and the bare 14-bit
// reciprocal, whose ~6e-5 relative error is far below the output rounding (2^-11 or coarser).
// The saved instructions are a quarter of the arithmetic that bounds these kernels on 16-bit rows.
template <typename T>
constexpr bool kFullPrecision = std::is_same_v<T, float>;

// v * sigmoid(k v) = v / (1 + exp(-k v)), with nk = -k; the divide carries a NaN v through.
template <bool kFull>
inline fVec x_sigmoid(const fVec& v, const fVec& nk) {
  const fVec denominator = one() + fast_exp<kFull ? 6 : 5>(nk * v);
  return kFull ? div_by_denominator(v, denominator) : div_by_denominator_16bit(v, denominator);
}

template <typename T>
struct Silu {
  static inline fVec apply(const fVec& v, const fVec&) { return x_sigmoid<kFullPrecision<T>>(v, fVec(-1.f)); }
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

// x * sigmoid(2u) = 0.5 x (1 + tanh(u)), for u = v * (c + c k v^2): -2u is v * (-2c - 2ck v^2):
// x_sigmoid with nk = -2c - 2ck v^2.
template <bool kFull>
inline fVec x_sigmoid_2u(const fVec& v, float c, float k) {
  return x_sigmoid<kFull>(v, at::vec::fmadd(fVec(-2.f * c * k), v * v, fVec(-2.f * c)));
}

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): gelu(approximate="tanh") and gelu_new.
template <typename T, bool kTorchMath = false>
struct GeluTanh {
  static inline fVec apply(const fVec& v, const fVec&) {
    if constexpr (kTorchMath) {
      const fVec inner = fVec(0.7978845608028654f) * (v + fVec(0.044715f) * v * v * v);
      return half() * v * (one() + inner.tanh());
    }
    return x_sigmoid_2u<kFullPrecision<T>>(v, 0.7978845608028654f, 0.044715f);
  }
};

// 0.5 x (1 + tanh(x * 0.7978845608 * (1 + 0.044715 x^2))).
template <typename T>
struct GeluFast {
  static inline fVec apply(const fVec& v, const fVec&) {
    return x_sigmoid_2u<kFullPrecision<T>>(v, 0.7978845608f, 0.044715f);
  }
};

// x * sigmoid(1.702 x).
template <typename T>
struct QuickGelu {
  static inline fVec apply(const fVec& v, const fVec&) { return x_sigmoid<kFullPrecision<T>>(v, fVec(-1.702f)); }
};

// relu(x)^2; clamp_min keeps a NaN's own bits (at::vec::maximum makes it all-ones, which the
// bf16 store's rounding does not expect; see bf16_rounding_bits).
struct Relu2 {
  static inline fVec apply(const fVec& v, const fVec&) {
    const fVec r = clamp_min_keep_nan(v, fVec(0.f));
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
  const fVec neg_alpha(-alpha), vlim(limit), vneg_lim(-limit);
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
        fVec o0 = (u0 + one()) * x_sigmoid<kFullPrecision<T>>(g0, neg_alpha);
        fVec o1 = (u1 + one()) * x_sigmoid<kFullPrecision<T>>(g1, neg_alpha);
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
