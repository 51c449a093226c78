// Shared helpers of the kernel translation units: fp32 vector loads/stores of float, Half and
// BFloat16 rows (with safe partial tails), rounding through the input dtype, the fp8 e4m3fn
// encoder, and the work grain for at::parallel_for.
//
// Vector width follows the build's CPU_CAPABILITY (AVX512 / AVX2 / DEFAULT), chosen at build time
// from torch's own capability detection; all arithmetic is in fp32.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels.h"

namespace reference_cpu {

using fVec = at::vec::Vectorized<float>;
constexpr int64_t kF = fVec::size();
// Elements handled per step: two fp32 vectors (one full vector of a 16-bit type).
constexpr int64_t kChunk = 2 * kF;
// Minimum elements per parallel task, so small inputs stay on one thread.
constexpr int64_t kGrainElems = 1 << 15;

inline int64_t row_grain(int64_t row_elems) {
  return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(row_elems, 1));
}

// Loads/stores kChunk elements of T as two fp32 vectors; the `n` overloads handle tails of
// n < kChunk elements through a zero-filled buffer (never reading or writing past n).
template <typename T>
struct Io {
  using TVec = at::vec::Vectorized<T>;
  static_assert(TVec::size() == kChunk, "16-bit vectors hold two fp32 vectors");

  static inline void load(const T* p, fVec& a, fVec& b) {
    std::tie(a, b) = at::vec::convert_to_float<T>(TVec::loadu(p));
  }
  static inline void store(T* p, const fVec& a, const fVec& b) {
    at::vec::convert_from_float<T>(a, b).store(p);
  }
  // Round fp32 values to T and back (the native op's intermediate cast).
  static inline void round(fVec& a, fVec& b) {
    std::tie(a, b) = at::vec::convert_to_float<T>(at::vec::convert_from_float<T>(a, b));
  }
  static inline float round(float v) { return static_cast<float>(static_cast<T>(v)); }
};

template <>
struct Io<float> {
  static inline void load(const float* p, fVec& a, fVec& b) {
    a = fVec::loadu(p);
    b = fVec::loadu(p + kF);
  }
  static inline void store(float* p, const fVec& a, const fVec& b) {
    a.store(p);
    b.store(p + kF);
  }
  static inline void round(fVec&, fVec&) {}
  static inline float round(float v) { return v; }
};

template <typename T>
inline void load_tail(const T* p, int64_t n, fVec& a, fVec& b) {
  alignas(64) T buf[kChunk];
  std::memset(buf, 0, sizeof(buf));
  std::memcpy(buf, p, n * sizeof(T));
  Io<T>::load(buf, a, b);
}

template <typename T>
inline void store_tail(T* p, int64_t n, const fVec& a, const fVec& b) {
  alignas(64) T buf[kChunk];
  Io<T>::store(buf, a, b);
  std::memcpy(p, buf, n * sizeof(T));
}

// Loads `n` (<= kChunk) elements, full vector or tail.
template <typename T>
inline void load_n(const T* p, int64_t n, fVec& a, fVec& b) {
  if (n == kChunk) {
    Io<T>::load(p, a, b);
  } else {
    load_tail(p, n, a, b);
  }
}

template <typename T>
inline void store_n(T* p, int64_t n, const fVec& a, const fVec& b) {
  if (n == kChunk) {
    Io<T>::store(p, a, b);
  } else {
    store_tail(p, n, a, b);
  }
}

inline float reduce_add(const fVec& v) {
  alignas(64) float buf[kF];
  v.store(buf);
  float s = 0.f;
  for (int64_t i = 0; i < kF; ++i) s += buf[i];
  return s;
}

// max that propagates NaN, like torch.amax.
inline float nan_max(float a, float b) { return (std::isnan(a) || a > b) ? a : b; }

inline float reduce_max(const fVec& v) {
  alignas(64) float buf[kF];
  v.store(buf);
  float m = buf[0];
  for (int64_t i = 1; i < kF; ++i) m = nan_max(m, buf[i]);
  return m;
}

// ----- fp8 e4m3fn ------------------------------------------------------------------------------
constexpr float kFp8Max = 448.0f;
constexpr float kFp8MinScale = 1.0f / (448.0f * 512.0f);

inline uint32_t f32_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u;
}

inline float bits_f32(uint32_t u) {
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

// fp32 -> e4m3fn code with round-to-nearest-even, for inputs already clamped to [-448, 448] or
// NaN (which maps to 0x7f | sign). Branch-free so loops over it vectorize. Subnormals (< 2^-6)
// are rounded by the FPU: adding 2^14 leaves the code in the low mantissa bits.
inline uint8_t fp8_e4m3fn_code(float v) {
  const uint32_t f = f32_bits(v);
  const uint32_t sign = (f >> 24) & 0x80u;
  const uint32_t a = f & 0x7fffffffu;
  const uint32_t kDenormMagic = 141u << 23;  // 2^14
  const uint32_t sub = f32_bits(bits_f32(a) + bits_f32(kDenormMagic)) - kDenormMagic;
  const uint32_t normal =
      (a + (static_cast<uint32_t>(7 - 127) << 23) + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
  uint32_t code = a < (121u << 23) ? sub : std::min<uint32_t>(normal, 0x7eu);
  code = a > 0x7f800000u ? 0x7fu : code;
  return static_cast<uint8_t>(code | sign);
}

// Encodes n clamped fp32 values (a plain loop the compiler vectorizes).
inline void encode_fp8(const float* __restrict src, uint8_t* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = fp8_e4m3fn_code(src[i]);
}

}  // namespace reference_cpu

// Explicit instantiation for the three activation dtypes.
#define REFERENCE_CPU_INSTANTIATE(MACRO) \
  MACRO(float)                           \
  MACRO(c10::Half)                       \
  MACRO(c10::BFloat16)
