// fp8 (e4m3fn) quantization kernels: static scales (per tensor / token / group), dynamic per
// tensor or per token (optional upper bound on absmax), and dynamic per group.
//
// Matches reference_impl/ir/ops/quant.py operation for operation: static and dynamic scales are
// applied as x * (1 / scale), group scales as x / scale; values are clamped to +-448 (NaN stays
// NaN) and encoded with round-to-nearest-even, in registers with our AVX512 encoder (vec_common.h), or through
// a small buffer and the portable encoder of vec_common.h elsewhere (and for row tails).
#include "vec_common.h"

namespace reference_cpu {
namespace {

// clamp to [-448, 448]; NaN passes through with its bits (and sign) intact, as torch.clamp does.
inline fVec clamp_fp8(const fVec& v) { return clamp_keep_nan(v, fVec(-kFp8Max), fVec(kFp8Max)); }

// Whether a quantized value needs the clamp to +-448 before encoding. A scale computed from the
// values' own absmax (dynamic without an upper bound, group) keeps |x / s| within a few ulp of
// 448, below 464, where the vector encoders still give 0x7e unclamped; NaN and the results of an
// inf scale encode as they would clamped. Static scales and scale_ub can leave the range.
enum class Clamp : bool { kNo = false, kYes = true };

// Encodes the first n (<= kChunk) elements of a chunk (a, b) of T's lanes as fp8 codes, clamped
// first where kClamp says so: in registers with the AVX512 / AVX2 encoders, else (and for tails)
// through a buffer and the portable encoder.
template <typename T, Clamp kClamp>
inline void store_fp8(uint8_t* out, int64_t n, fVec a, fVec b) {
#if defined(CPU_CAPABILITY_AVX512)
  if (n == kChunk) {
    if constexpr (kClamp == Clamp::kYes) {
      a = clamp_fp8(a);
      b = clamp_fp8(b);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), fp8_e4m3fn_codes(a));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + kF), fp8_e4m3fn_codes(b));
    return;
  }
#elif defined(CPU_CAPABILITY_AVX2)
  if (n == kChunk) {
    constexpr bool kClamped = kClamp == Clamp::kYes;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                     pack_fp8_chunk<kEvenOddLanes<T>>(fp8_e4m3fn_codes32<kClamped>(a, a),
                                                      fp8_e4m3fn_codes32<kClamped>(b, b)));
    return;
  }
#endif
  a = clamp_fp8(a);  // the portable encoder expects clamped input
  b = clamp_fp8(b);
  from_lanes<T>(a, b);
  alignas(64) float buf[kChunk];
  a.store(buf);
  b.store(buf + kF);
  encode_fp8(buf, out, n);
}

// out[0:n) = fp8(clamp(x[0:n) * mul)) (kDivide: x / mul, exactly rounded; through the
// reciprocal and an FMA correction where mul is finite). `next` (or null) is the same span of
// the next row, prefetched chunk by chunk so its loads overlap this span's arithmetic.
template <typename T, bool kDivide, Clamp kClamp = Clamp::kYes>
inline void quantize_into(const T* __restrict x, float mul, uint8_t* __restrict out, int64_t n, const T* next) {
  const fVec m(mul), r(1.0f / mul);
  // kExact: x / m through the reciprocal and the FMA correction (finite m), else x / m or x * m.
  auto run = [=](auto exact) {  // by value: stores through uint8_t* could alias captured references
    auto scale = [&](fVec& a) {
      if constexpr (!kDivide) {
        a = a * m;
      } else if constexpr (decltype(exact)::value) {
        a = div_exact(a, m, r);
      } else {
        a = a / m;
      }
    };
    int64_t j = 0;
    for (; j + 2 * kChunk <= n; j += 2 * kChunk) {  // two chunks a step, one prefetch per 64 bytes
      if (next != nullptr) prefetch_bytes(next + j, 2 * kChunk * sizeof(T));
      fVec a0, b0, a1, b1;
      Io<T>::load(x + j, a0, b0);
      Io<T>::load(x + j + kChunk, a1, b1);
      scale(a0);
      scale(b0);
      scale(a1);
      scale(b1);
      store_fp8<T, kClamp>(out + j, kChunk, a0, b0);
      store_fp8<T, kClamp>(out + j + kChunk, kChunk, a1, b1);
    }
    for (; j < n; j += kChunk) {
      const int64_t len = std::min<int64_t>(kChunk, n - j);
      fVec a, b;
      load_n(x + j, len, a, b);
      scale(a);
      scale(b);
      store_fp8<T, kClamp>(out + j, len, a, b);
    }
  };
  if (kDivide && std::isfinite(mul)) {
    run(std::true_type{});
  } else {
    run(std::false_type{});
  }
}

#if defined(CPU_CAPABILITY_AVX512)
// max |x| of n 16-bit floats (fp16 or bf16), on their bit patterns: with the sign cleared, larger
// magnitudes have larger patterns (NaN above inf), so an unsigned 16-bit max over 32 lanes per
// instruction gives the absmax, NaN included, without widening to fp32 first.
template <typename T>
inline float absmax_16bit(const T* x, int64_t n) {
  const __m512i magnitude = _mm512_set1_epi16(0x7fff);
  __m512i m = _mm512_setzero_si512();
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) m = _mm512_max_epu16(m, _mm512_and_si512(_mm512_loadu_si512(x + j), magnitude));
  if (j < n) {  // zero-filled tail: zero never raises an absmax
    const __mmask32 tail = static_cast<__mmask32>((uint64_t{1} << (n - j)) - 1);
    m = _mm512_max_epu16(m, _mm512_and_si512(_mm512_maskz_loadu_epi16(tail, x + j), magnitude));
  }
  alignas(64) uint16_t lanes[32];
  _mm512_store_si512(lanes, m);
  const uint16_t bits = *std::max_element(lanes, lanes + 32);
  return static_cast<float>(T(bits, T::from_bits()));
}
#elif defined(CPU_CAPABILITY_AVX2)
// max |x| over the bit patterns with the sign cleared, as absmax_16bit above: an unsigned max
// of 16 lanes (16-bit types) or 8 lanes (fp32) per instruction, NaN included; the tail through a
// zero-filled buffer.
template <typename T>
inline float absmax_bits(const T* x, int64_t n) {
  constexpr bool k16 = sizeof(T) == 2;
  constexpr int64_t kLanes = 32 / sizeof(T);
  const __m256i magnitude = k16 ? _mm256_set1_epi16(0x7fff) : _mm256_set1_epi32(0x7fffffff);
  auto max = [&](const __m256i& m, const __m256i& v) {
    const __m256i a = _mm256_and_si256(v, magnitude);
    return k16 ? _mm256_max_epu16(m, a) : _mm256_max_epu32(m, a);
  };
  __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
  int64_t j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) {
    m0 = max(m0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j)));
    m1 = max(m1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j + kLanes)));
  }
  for (; j < n; j += kLanes) {
    alignas(32) T buf[kLanes] = {};
    std::memcpy(buf, x + j, std::min<int64_t>(kLanes, n - j) * sizeof(T));
    m0 = max(m0, _mm256_load_si256(reinterpret_cast<const __m256i*>(buf)));
  }
  m0 = k16 ? _mm256_max_epu16(m0, m1) : _mm256_max_epu32(m0, m1);
  if constexpr (k16) {
    alignas(32) uint16_t lanes[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m0);
    return static_cast<float>(T(*std::max_element(lanes, lanes + 16), T::from_bits()));
  } else {
    alignas(32) uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m0);
    return bits_f32(*std::max_element(lanes, lanes + 8));
  }
}
#endif

template <typename T>
inline float absmax(const T* x, int64_t n) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (!std::is_same_v<T, float>) return absmax_16bit(x, n);
#elif defined(CPU_CAPABILITY_AVX2)
  return absmax_bits(x, n);
#endif
  fVec m0(0.f), m1(0.f);
  for (int64_t j = 0; j < n; j += kChunk) {
    const int64_t len = std::min<int64_t>(kChunk, n - j);
    fVec a, b;
    load_n(x + j, len, a, b);  // tails are zero-filled, which never raises an absmax
    m0 = at::vec::maximum(m0, a.abs());
    m1 = at::vec::maximum(m1, b.abs());
  }
  return reduce_max(at::vec::maximum(m0, m1));
}

// min that propagates NaN, like torch.clamp(max=...).
inline float nan_min(float a, float b) { return (std::isnan(a) || a < b) ? a : b; }

inline float dynamic_scale(float amax, const float* scale_ub) {
  if (scale_ub != nullptr) amax = nan_min(amax, *scale_ub);
  return nan_max(amax / kFp8Max, kFp8MinScale);
}

// max |v| over the lanes of a[0:NC) and b[0:NC), NaN propagating. With AVX512 on the fp32 bit
// patterns with the sign cleared (an unsigned max; NaN patterns lie above inf): two instructions a
// vector, where at::vec::maximum's NaN handling takes four.
template <int NC>
inline float absmax_of(const fVec* a, const fVec* b) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  __m512i m = _mm512_setzero_si512();
  for (int i = 0; i < NC; ++i) {
    m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_castps_si512(a[i]), magnitude));
    m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_castps_si512(b[i]), magnitude));
  }
  return bits_f32(_mm512_reduce_max_epu32(m));
#else
  fVec m0(0.f), m1(0.f);
  for (int i = 0; i < NC; ++i) {
    m0 = at::vec::maximum(m0, a[i].abs());
    m1 = at::vec::maximum(m1, b[i].abs());
  }
  return reduce_max(at::vec::maximum(m0, m1));
#endif
}

// One group of NC whole chunks held in registers between its absmax and its codes (one load and
// widening of the group instead of two); returns the group's scale. `next` (or null) is the same
// group of the next row, prefetched.
template <typename T, int NC>
inline float quantize_group_in_registers(const T* xg, uint8_t* out, const T* next) {
  fVec a[NC], b[NC];
  for (int i = 0; i < NC; ++i) {
    if (next != nullptr) prefetch_bytes(next + i * kChunk, kChunk * sizeof(T));
    Io<T>::load(xg + i * kChunk, a[i], b[i]);
  }
  const float s = dynamic_scale(absmax_of<NC>(a, b), nullptr);
  const fVec vs(s), r(1.0f / s);
  const bool via_reciprocal = std::isfinite(s);
  for (int i = 0; i < NC; ++i) {
    const fVec qa = via_reciprocal ? div_exact(a[i], vs, r) : a[i] / vs;
    const fVec qb = via_reciprocal ? div_exact(b[i], vs, r) : b[i] / vs;
    store_fp8<T, Clamp::kNo>(out + i * kChunk, kChunk, qa, qb);
  }
  return s;
}

// One group of any size: absmax pass, then quantize_into; returns the scale.
template <typename T>
inline float quantize_group(const T* xg, uint8_t* out, int64_t group_size, const T* next) {
  switch (group_size % kChunk == 0 ? group_size / kChunk : 0) {
    case 1: return quantize_group_in_registers<T, 1>(xg, out, next);
    case 2: return quantize_group_in_registers<T, 2>(xg, out, next);
#if !defined(CPU_CAPABILITY_AVX2)  // AVX2 has 16 vector registers: larger groups take two passes
    case 4: return quantize_group_in_registers<T, 4>(xg, out, next);
    case 8: return quantize_group_in_registers<T, 8>(xg, out, next);
#endif
    default: break;
  }
  const float s = dynamic_scale(absmax(xg, group_size), nullptr);
  quantize_into<T, true, Clamp::kNo>(xg, s, out, group_size, next);
  return s;
}

}  // namespace

template <typename T>
void static_quant_fp8(const T* x, RowIndex x_rows, const float* scale, RowIndex scale_rows,
                      int64_t scale_group_stride, int64_t groups, uint8_t* out, int64_t rows,
                      int64_t hidden) {
  const int64_t group = hidden / groups;
  at::parallel_for(0, rows, row_grain(hidden), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + x_rows(r);
      const T* next = r + 1 < end ? x + x_rows(r + 1) : nullptr;
      const float* sr = scale + scale_rows(r);
      for (int64_t g = 0; g < groups; ++g) {
        const float inv = 1.0f / sr[g * scale_group_stride];
        quantize_into<T, false>(xr + g * group, inv, out + r * hidden + g * group, group,
                                next == nullptr ? nullptr : next + g * group);
      }
    }
  });
}

template <typename T>
void dynamic_quant_fp8(const T* x, RowIndex x_rows, uint8_t* out, float* scale_out, int64_t rows,
                       int64_t hidden, bool per_token, const float* scale_ub) {
  float tensor_scale = 0.f;
  if (!per_token) {
    const float amax = at::parallel_reduce(
        0, rows, row_grain(hidden), 0.f,
        [&](int64_t begin, int64_t end, float acc) {
          for (int64_t r = begin; r < end; ++r) acc = nan_max(acc, absmax(x + x_rows(r), hidden));
          return acc;
        },
        [](float a, float b) { return nan_max(a, b); });
    tensor_scale = dynamic_scale(amax, scale_ub);
    scale_out[0] = tensor_scale;
  }
  at::parallel_for(0, rows, row_grain(hidden), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + x_rows(r);
      float s = tensor_scale;
      if (per_token) {
        s = dynamic_scale(absmax(xr, hidden), scale_ub);
        scale_out[r] = s;
      }
      const T* next = r + 1 < end ? x + x_rows(r + 1) : nullptr;
      if (scale_ub != nullptr) {
        quantize_into<T, false, Clamp::kYes>(xr, 1.0f / s, out + r * hidden, hidden, next);
      } else {
        quantize_into<T, false, Clamp::kNo>(xr, 1.0f / s, out + r * hidden, hidden, next);
      }
    }
  });
}

template <typename T>
void dynamic_group_quant_fp8(const T* x, RowIndex x_rows, uint8_t* out, float* scale_out,
                             int64_t rows, int64_t hidden, int64_t group_size) {
  const int64_t groups = hidden / group_size;
  at::parallel_for(0, rows, row_grain(hidden), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + x_rows(r);
      const T* next = r + 1 < end ? x + x_rows(r + 1) : nullptr;
      for (int64_t g = 0; g < groups; ++g) {
        scale_out[r * groups + g] = quantize_group(xr + g * group_size, out + r * hidden + g * group_size,
                                                   group_size, next == nullptr ? nullptr : next + g * group_size);
      }
    }
  });
}

#define INSTANTIATE_QUANT(T)                                                                      \
  template void static_quant_fp8<T>(const T*, RowIndex, const float*, RowIndex, int64_t, int64_t, \
                                    uint8_t*, int64_t, int64_t);                                  \
  template void dynamic_quant_fp8<T>(const T*, RowIndex, uint8_t*, float*, int64_t, int64_t, bool, \
                                     const float*);                                               \
  template void dynamic_group_quant_fp8<T>(const T*, RowIndex, uint8_t*, float*, int64_t, int64_t, \
                                           int64_t);
REFERENCE_CPU_INSTANTIATE(INSTANTIATE_QUANT)

}  // namespace reference_cpu
