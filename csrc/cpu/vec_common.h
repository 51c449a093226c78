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
#include <limits>
#include <type_traits>

#include "kernels.h"

// Forces inlining of the small vector helpers: with several of them per loop body GCC's
// heuristics otherwise leave some as calls, spilling every vector register around them.
#define REFERENCE_CPU_INLINE inline __attribute__((always_inline))
// The same for a lambda (written after its parameter list).
#define REFERENCE_CPU_INLINE_LAMBDA __attribute__((always_inline))

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

// Whether Io<T> holds a chunk in "even/odd" lanes instead of in order: bfloat16 on AVX2, where a
// chunk of 16 bf16 values widens to fp32 in two instructions as its even elements (the 16-bit
// words shifted up) and its odd ones (the words masked in place), and narrows back with one shift
// and one word blend. In-order widening and narrowing take 4 and 4 shuffle/shift instructions,
// and shuffles and shifts share two of Zen's four vector pipes, which bounded the 16-bit kernels.
// Element-wise kernels do not care about the order as long as every operand of a chunk is loaded
// through Io<T> (weights widened through it too); code that mixes in-order fp32 data with a
// chunk, or whose lanes must be in order (interleaved pairs, fp8 codes), uses to_lanes /
// from_lanes below.
template <typename T>
constexpr bool kEvenOddLanes = false;
#if defined(CPU_CAPABILITY_AVX2)
template <>
constexpr bool kEvenOddLanes<c10::BFloat16> = true;
#endif

// Loads/stores kChunk elements of T as two fp32 vectors (in order, a: elements 0..kF-1, except
// for kEvenOddLanes); the `n` overloads handle tails of n < kChunk elements through a
// zero-filled buffer (never reading or writing past n).
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

// Round fp32 lanes to the nearest-even bfloat16 value, staying in fp32: integer ops on the bits,
// no pack/unpack. A quiet NaN stays NaN (its top mantissa bit survives the mask); arithmetic
// never produces the signalling NaNs whose payload could round away.
inline fVec round_bf16(const fVec& v) {
  using iVec = at::vec::Vectorized<int32_t>;
  const iVec u = at::vec::cast<int32_t>(v);
  const iVec lsb = (u >> iVec(16)) & iVec(1);
  const iVec r = (u + iVec(0x7fff) + lsb) & iVec(static_cast<int32_t>(0xffff0000u));
  return at::vec::cast<float>(r);
}

#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
// CPUs with AVX512_BF16 (the build adds -mavx512bf16 where torch reports it) round two fp32
// vectors to bf16 in one instruction (round-to-nearest-even, as c10::BFloat16 does).
inline __m512i pack_bf16(const fVec& lo, const fVec& hi) {
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

template <>
inline void Io<c10::BFloat16>::store(c10::BFloat16* p, const fVec& a, const fVec& b) {
  _mm512_storeu_si512(p, pack_bf16(a, b));
}

template <>
inline void Io<c10::BFloat16>::round(fVec& a, fVec& b) {
  const __m512i packed = pack_bf16(a, b);
  a = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(packed)), 16));
  b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(packed, 1)), 16));
}
#elif defined(CPU_CAPABILITY_AVX2)
// The fp32 bits plus the round-to-nearest-even bias (0x7fff, plus 1 where the bf16 result's last
// bit is set): the high 16 bits are the rounded bf16, the low 16 bits are left over. The last bit
// is tested with a compare rather than a shift, keeping the shift/shuffle pipes free. NaN stays
// NaN: the NaNs reaching a store come from bf16 data or from invalid operations, whose low 16
// bits are zero, so the bias never carries into the exponent (nor, as at::vec's conversion does,
// are they replaced by 0xffff).
inline __m256i bf16_rounding_bits(const __m256& v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i bit = _mm256_set1_epi32(0x10000);
  const __m256i odd = _mm256_cmpeq_epi32(_mm256_and_si256(u, bit), bit);   // -1 where the last bit is set
  return _mm256_sub_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd);
}

inline __m256 bf16_high_half(const __m256i& bits) {
  return _mm256_castsi256_ps(_mm256_and_si256(bits, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

// Even/odd lanes (kEvenOddLanes): a holds elements 0, 2, .., 14 and b elements 1, 3, .., 15.
template <>
inline void Io<c10::BFloat16>::load(const c10::BFloat16* p, fVec& a, fVec& b) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  a = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  b = bf16_high_half(v);
}

template <>
inline void Io<c10::BFloat16>::store(c10::BFloat16* p, const fVec& a, const fVec& b) {
  const __m256i even = _mm256_srli_epi32(bf16_rounding_bits(a), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_blend_epi16(even, bf16_rounding_bits(b), 0xAA));
}

template <>
inline void Io<c10::BFloat16>::round(fVec& a, fVec& b) {
  a = bf16_high_half(bf16_rounding_bits(a));
  b = bf16_high_half(bf16_rounding_bits(b));
}
#else
template <>
inline void Io<c10::BFloat16>::round(fVec& a, fVec& b) {
  a = round_bf16(a);
  b = round_bf16(b);
}
#endif

// to_lanes: 16 fp32 values in order (a: 0..kF-1, b: kF..2kF-1) into Io<T>'s lane order;
// from_lanes: back. The identity except for kEvenOddLanes.
template <typename T>
inline void to_lanes(fVec& a, fVec& b) {
#if defined(CPU_CAPABILITY_AVX2)
  if constexpr (kEvenOddLanes<T>) {
    const __m256 even = _mm256_shuffle_ps(a, b, 0x88);   // a0 a2 b0 b2 | a4 a6 b4 b6
    const __m256 odd = _mm256_shuffle_ps(a, b, 0xdd);    // a1 a3 b1 b3 | a5 a7 b5 b7
    a = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), 0xd8));
    b = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), 0xd8));
  }
#endif
  (void)a;
  (void)b;
}

template <typename T>
inline void from_lanes(fVec& a, fVec& b) {
#if defined(CPU_CAPABILITY_AVX2)
  if constexpr (kEvenOddLanes<T>) {
    const __m256 lo = _mm256_unpacklo_ps(a, b);   // e0 o0 e1 o1 | e4 o4 e5 o5
    const __m256 hi = _mm256_unpackhi_ps(a, b);   // e2 o2 e3 o3 | e6 o6 e7 o7
    a = _mm256_permute2f128_ps(lo, hi, 0x20);
    b = _mm256_permute2f128_ps(lo, hi, 0x31);
  }
#endif
  (void)a;
  (void)b;
}

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

// ----- rows to and from fp32 ------------------------------------------------------------------------
// A row of T to and from contiguous fp32, in order (not Io<T>'s lane order): the attention kernels' queries
// and outputs, the panel GEMM's inputs.
template <typename T>
inline void row_to_float(const T* src, float* dst, int64_t n) {
  int64_t i = 0;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  } else {
    using TVec = at::vec::Vectorized<T>;
    for (; i + kChunk <= n; i += kChunk) {
      auto [a, b] = at::vec::convert_to_float<T>(TVec::loadu(src + i));  // in order
      a.store(dst + i);
      b.store(dst + i + kF);
    }
    for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

template <typename T>
inline void row_from_float(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    int64_t i = 0;
    for (; i + kChunk <= n; i += kChunk) {
      at::vec::convert_from_float<T>(fVec::loadu(src + i), fVec::loadu(src + i + kF)).store(dst + i);
    }
    for (; i < n; ++i) dst[i] = static_cast<T>(src[i]);  // round to nearest even
  }
}

// ----- streaming (non-temporal) stores -------------------------------------------------------------
// fp32 outputs far larger than the caches are written with non-temporal stores (as large memcpys
// are): the lines go to memory without first being read for ownership, which otherwise adds a read
// of every output byte. On the development VM (AVX512) this moved the fp32 element-wise GELU
// kernels from ~0.8 to ~0.9-1.0 of copy; on a 2-core AVX2 EPYC, fp32 relu2 went from 0.90-0.96 to
// 1.30-1.42 of inductor and fatrelu_and_mul from 0.90-0.95 to 1.21-1.31 (two runs each). 16-bit
// outputs (twice the elements per byte, so more arithmetic per line) measured no gain and keep
// normal stores, as do small outputs (the next op finds them in cache).
constexpr int64_t kStreamMinBytes = int64_t{16} << 20;

// ----- in-place fp32 rows: 256-bit loops -----------------------------------------------------------
// The loops that read and rewrite the same fp32 rows from memory (fused_add_rms_norm's two passes,
// rotary's neox rotation) use 256-bit vectors in the AVX-512 build too. On a 2-core AVX-512 EPYC
// (Zen 4), paired rounds against vLLM's kernels, fused_add_rms_norm fp32 went from 0.86-0.92 to
// 0.95-0.99 of vLLM's speed (1 and 2 threads) and rotary fp32 from 0.88-0.95 to 0.97-0.99, while a
// 512-bit loop with the 256-bit one's unroll stayed at 0.91-0.95: the width, not the unroll. Our
// AVX2 build's 256-bit code already ran at 0.98-1.05 there. Out-of-place rows (rms_norm, the
// activations) keep 512 bits, which were faster. The AVX2 build's fVec is 256 bits anyway.
#if defined(CPU_CAPABILITY_AVX512)
#define REFERENCE_CPU_IN_PLACE_F32X8 1
#endif

// The per-ISA pieces: one fp32 vector stored non-temporally (p aligned to the vector), and the
// fence that orders a task's streamed stores before its end.
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
constexpr bool kCanStream = true;
inline void stream_fence() { _mm_sfence(); }
#if defined(CPU_CAPABILITY_AVX512)
inline void stream_vec(float* p, const fVec& v) { _mm512_stream_ps(p, v); }
#else
inline void stream_vec(float* p, const fVec& v) { _mm256_stream_ps(p, v); }
#endif
#else
constexpr bool kCanStream = false;
inline void stream_fence() {}
inline void stream_vec(float* p, const fVec& v) { v.store(p); }
#endif

template <typename T>
inline bool stream_output(int64_t out_bytes) {
  return kCanStream && std::is_same_v<T, float> && out_bytes >= kStreamMinBytes;
}

inline bool aligned64(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 63) == 0; }

// One output chunk of len elements at p: non-temporal when `stream` (p 64-byte aligned), the
// chunk is full and T is float (AVX512 and AVX2 builds), else a normal store. Tasks that stream end
// with stream_fence().
template <typename T>
inline void store_out(T* p, int64_t len, bool stream, const fVec& a, const fVec& b) {
  if constexpr (kCanStream && std::is_same_v<T, float>) {
    if (stream && len == kChunk) {
      stream_vec(p, a);
      stream_vec(p + kF, b);
      return;
    }
  }
  store_n(p, len, a, b);
}

// Prefetches the cache lines of `bytes` bytes at p (kWrite: with intent to write). Used to fetch
// the next row while the current one is computed, so memory and arithmetic overlap; prefetching
// past the end of an allocation is harmless.
template <bool kWrite = false>
inline void prefetch_bytes(const void* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) {
    __builtin_prefetch(static_cast<const char*>(p) + b, kWrite ? 1 : 0, 3);
  }
}

inline float reduce_add(const fVec& v) {
  alignas(64) float buf[kF];
  v.store(buf);
  float s = 0.f;
  for (int64_t i = 0; i < kF; ++i) s += buf[i];
  return s;
}

// clamp(v, lo, hi) and min(v, hi) that keep a NaN v (bits included), like torch.clamp. On x86
// the min/max instructions return their second operand when either is NaN, which at::vec's
// clamp relies on; the portable fallback compares explicitly.
inline fVec clamp_keep_nan(const fVec& v, const fVec& lo, const fVec& hi) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  return at::vec::clamp(v, lo, hi);
#else
  return fVec::blendv(fVec::blendv(v, hi, v > hi), lo, v < lo);
#endif
}

inline fVec min_keep_nan(const fVec& v, const fVec& hi) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  return at::vec::clamp_max(v, hi);
#else
  return fVec::blendv(v, hi, v > hi);
#endif
}

inline fVec clamp_min_keep_nan(const fVec& v, const fVec& lo) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  return at::vec::clamp_min(v, lo);
#else
  return fVec::blendv(v, lo, v < lo);
#endif
}

// max that propagates NaN, like torch.amax.
inline float nan_max(float a, float b) { return (std::isnan(a) || a > b) ? a : b; }

inline float reduce_max(const fVec& v) {
#if defined(CPU_CAPABILITY_AVX512)
  if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0) return std::numeric_limits<float>::quiet_NaN();
  return _mm512_reduce_max_ps(v);
#endif
  alignas(64) float buf[kF];
  v.store(buf);
  float m = buf[0];
  for (int64_t i = 1; i < kF; ++i) m = nan_max(m, buf[i]);
  return m;
}

// ----- fast fp32 transcendentals ------------------------------------------------------------------
// A rational minimax erf (the coefficient set Eigen publishes for float) evaluated with FMAs and
// one division, and a polynomial exp2: a few ulp of error (checked in tests against
// float64), 2-5x faster than the Sleef calls at::vec's erf/tanh use, which made the GELU kernels
// compute-bound. NaN propagates.

#if defined(CPU_CAPABILITY_AVX2)
// 1 / b within ~2 ulp for finite b (normal 1 / b): the 12-bit vrcpps refined by one Newton step.
// Zen's vdivps issues once per ~3.5 cycles, which alone bounds a 16-bit kernel dividing once per
// element above its copy speed; these are three instructions on the FMA pipes. For |b| >= 2^126
// (a reciprocal below the normal range) the estimate is 0 and so is the result.
REFERENCE_CPU_INLINE __m256 refined_reciprocal(const __m256& b) {
  const __m256 r0 = _mm256_rcp_ps(b);
  return _mm256_fmadd_ps(_mm256_fnmadd_ps(b, r0, _mm256_set1_ps(1.0f)), r0, r0);
}

// a / b as a r0 (2 - b r0), r0 the 12-bit estimate: one Newton step with a's multiply taken out
// of the chain (three instructions, one fewer dependent step than a * refined_reciprocal(b)).
REFERENCE_CPU_INLINE __m256 divide_refined(const __m256& a, const __m256& b) {
  const __m256 r0 = _mm256_rcp_ps(b);
  return _mm256_mul_ps(_mm256_mul_ps(a, r0), _mm256_fnmadd_ps(b, r0, _mm256_set1_ps(2.0f)));
}
#endif

// erf(x); inputs are clamped to [-4, 4], where erf is +-1 in float.
REFERENCE_CPU_INLINE fVec fast_erf(const fVec& x0) {
  const fVec x = at::vec::clamp(x0, fVec(-4.f), fVec(4.f));
  const fVec x2 = x * x;
  fVec p = at::vec::fmadd(x2, fVec(-2.72614225801306e-10f), fVec(2.77068142495902e-08f));
  p = at::vec::fmadd(x2, p, fVec(-2.10102402082508e-06f));
  p = at::vec::fmadd(x2, p, fVec(-5.69250639462346e-05f));
  p = at::vec::fmadd(x2, p, fVec(-7.34990630326855e-04f));
  p = at::vec::fmadd(x2, p, fVec(-2.95459980854025e-03f));
  p = at::vec::fmadd(x2, p, fVec(-1.60960333262415e-02f));
  p = x * p;
  fVec q = at::vec::fmadd(x2, fVec(-1.45660718464996e-05f), fVec(-2.13374055278905e-04f));
  q = at::vec::fmadd(x2, q, fVec(-1.68282697438203e-03f));
  q = at::vec::fmadd(x2, q, fVec(-7.37332916720468e-03f));
  q = at::vec::fmadd(x2, q, fVec(-1.42647390514189e-02f));
#if defined(CPU_CAPABILITY_AVX2)
  return divide_refined(p, q);  // q <= -0.0142: no zero, no overflow
#else
  return p / q;
#endif
}

// 2^w for the sigmoid forms' denominators 1 + 2^w (callers fold log2(e) into w's constants,
// which saves the multiply and the two-step ln 2 reduction an exp needs): n = round(w),
// f = w - n (exact, |f| <= 1/2), 2^f by a polynomial of degree kDegree (coefficients fitted for
// minimax relative error on [-1/2, 1/2]: degree 5: 2.4e-7, about 2 fp32 ulp; 4: 2.7e-6, for fp16
// outputs, whose rounding step is 2^-11; 3: 7.5e-5, for bf16 outputs, whose rounding step is
// 2^-8: 1/50 of it), scaled by 2^n. A NaN w gives NaN (the attention's softmax needs it: a NaN score's
// exponential was 2^129 = inf on AVX512 and a finite 2^127 on AVX2, where the activations multiply it into
// their NaN input anyway): the clamps keep a NaN (min/max return their second operand where one is NaN).
// AVX512: w clamped to [-150, 129], scaled with vscalefps (saturating to 0 and inf); kClampAbove = false
// leaves out the upper clamp, for callers whose w is at most a rounding above 0 (a softmax's exponent).
// AVX2: n is rounded by adding 1.5 * 2^23 (its low bits then hold n, so shifting them into the
// exponent field gives 2^n with no conversion), and w is clamped to [-125, 127] so that 2^n p
// stays a normal float: beyond, the result is 2^-125 or 2^127 instead of 0 or inf (callers add 1
// and divide, which gives results within 2^-125 of theirs). 9-11 instructions, under half of
// at::vec's exp_u20.
template <int kDegree>
struct Exp2Poly;
template <>
struct Exp2Poly<3> {
  static constexpr float c[] = {0.9999280571937561f, 0.6932609677314758f, 0.2426111251115799f,
                                0.0551716685295105f};
};
template <>
struct Exp2Poly<4> {
  static constexpr float c[] = {0.9999992847442627f, 0.6931217908859253f, 0.240247443318367f,
                                0.05591785907745361f, 0.009570101276040077f};
};
template <>
struct Exp2Poly<5> {
  static constexpr float c[] = {1.0000001192092896f, 0.6931469440460205f, 0.24022120237350464f,
                                0.05550713092088699f, 0.009675540961325169f, 0.001327647129073739f};
};

// Horner's scheme over Exp2Poly<kDegree>::c.
template <int kDegree>
REFERENCE_CPU_INLINE fVec exp2_poly(const fVec& f) {
  fVec p(Exp2Poly<kDegree>::c[kDegree]);
  for (int k = kDegree - 1; k >= 0; --k) p = at::vec::fmadd(p, f, fVec(Exp2Poly<kDegree>::c[k]));
  return p;
}

template <int kDegree, bool kClampAbove = true>
REFERENCE_CPU_INLINE fVec fast_exp2(const fVec& w) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m512 below = kClampAbove ? _mm512_min_ps(_mm512_set1_ps(129.0f), w) : __m512(w);
  const __m512 wc = _mm512_max_ps(_mm512_set1_ps(-150.0f), below);
  const __m512 n = _mm512_roundscale_ps(wc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_scalef_ps(exp2_poly<kDegree>(_mm512_sub_ps(wc, n)), n);   // NaN stays NaN throughout
#elif defined(CPU_CAPABILITY_AVX2)
  const __m256 wc = _mm256_max_ps(_mm256_set1_ps(-125.0f), _mm256_min_ps(_mm256_set1_ps(127.0f), w));
  const __m256 magic = _mm256_set1_ps(12582912.0f);  // 1.5 * 2^23
  const __m256 t = _mm256_add_ps(wc, magic);
  const __m256 p = exp2_poly<kDegree>(_mm256_sub_ps(wc, _mm256_sub_ps(t, magic)));
  const __m256i scale = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
  // a NaN's payload bits, shifted into the exponent, could make a number of it: the default quiet NaN there
  // instead (whose low 16 bits are zero, as the bf16 store below expects of a NaN)
  const __m256 is_nan = _mm256_cmp_ps(w, w, _CMP_UNORD_Q);
  return _mm256_blendv_ps(_mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), scale)),
                          _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()), is_nan);
#else
  return w.exp2();
#endif
}


// a / b for the denominators b >= 1 (or inf, or NaN) of the sigmoid forms, within ~1 ulp of the
// division. With AVX512 it is the 14-bit reciprocal refined by one Newton step and a multiply:
// division's throughput (one 16-lane vdivps per ~10 cycles) otherwise bounds the SiLU/GELU
// kernels on 16-bit rows. b = inf gives a * 0, as a / inf does (the Newton step would give NaN).
// With AVX2 it is the division: divide_refined's two roundings put x * sigmoid(x) one ulp below x
// where the sigmoid is 1 (the vrcpps estimate of 1 is 1 - 2^-12), 10x native's error against float64
// at |x| ~ 100 (the harness's quality grade flagged quick_gelu's `large` case), and an fp32 row
// (8 bytes an element) leaves vdivps's ~2 elements a cycle well above the copy speed.
REFERENCE_CPU_INLINE fVec div_by_denominator(const fVec& a, const fVec& b) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m512 r0 = _mm512_rcp14_ps(b);
  const __m512 e = _mm512_fnmadd_ps(b, r0, _mm512_set1_ps(1.0f));
  const __m512 r = _mm512_mask_mov_ps(_mm512_fmadd_ps(e, r0, r0),
                                      _mm512_cmp_ps_mask(r0, _mm512_setzero_ps(), _CMP_EQ_OQ), r0);
  return _mm512_mul_ps(a, r);
#elif defined(CPU_CAPABILITY_AVX2)
  return _mm256_div_ps(a, b);
#else
  return a / b;
#endif
}

// a / b within 2^-14 relative (the 14-bit reciprocal, no Newton step), for results rounded to a
// 16-bit type, whose rounding step (2^-11 or coarser) it moves by at most 1/8: two instructions
// instead of six. b = inf gives a * 0, as a / inf does. With AVX2 it is refined_reciprocal, elsewhere
// the division.
REFERENCE_CPU_INLINE fVec div_by_denominator_16bit(const fVec& a, const fVec& b) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_mul_ps(a, _mm512_rcp14_ps(b));
#elif defined(CPU_CAPABILITY_AVX2)
  return divide_refined(a, b);  // vrcpps alone (12 bits) would misround too often
#else
  return a / b;
#endif
}

// x / s rounded exactly as the division, for finite s > 0 and finite or NaN x, from the rounded
// reciprocal r = 1 / s: q0 = x * r, then one FMA correction with the exact remainder x - q0 * s
// (Markstein's theorem: correctly rounded when r is and q0 is within an ulp, which holds for
// quotients in the normal range; smaller ones become fp8 zero either way). Callers use the plain
// division for non-finite s (where the remainder would be inf * 0).
// The correction loses the sign of a zero quotient (-0 + 0 = +0), so the sign is x's, as it is
// for x / s with s > 0 (NaN included). Without hardware FMA (the DEFAULT build) it is the division.
inline fVec div_exact(const fVec& x, const fVec& s, const fVec& r) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  const fVec q0 = x * r;
  const fVec q = at::vec::fmadd(at::vec::fnmadd(q0, s, x), r, q0);
  return q.abs() | (x & fVec(-0.0f));
#else
  (void)r;
  return x / s;
#endif
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

#if defined(CPU_CAPABILITY_AVX512)
// fp8_e4m3fn_code for 16 lanes at once, branch-free, for inputs clamped to [-448, 448] (or with
// |v| < 464) and NaN. One FP addition rounds |v| onto the fp8 grid, normal and subnormal alike:
// M = 2^(e + 20), e = max(exponent of |v|, -6), has an ulp equal to the fp8 spacing of |v|'s
// binade (2^(e-3); 2^-9 below 2^-6), so |v| + M is M plus |v| rounded to nearest-even, and the
// sum's mantissa bits count fp8 steps above M: the code is that count plus 8 (e + 6). A NaN sum
// gives a count above 0x7f, so an unsigned min with 0x7f makes every NaN 0x7f (finite inputs give
// at most 0x7e). 13 instructions with the sign and the packing; ATen's cvtfp32_fp8e4m3 handles
// unclamped inputs with masks and data-dependent branches in about twice that, which bounded the
// 16-bit quant kernels.
inline __m128i fp8_e4m3fn_codes(const __m512& v) {
  const __m512i f = _mm512_castps_si512(v);
  const __m512i a = _mm512_and_si512(f, _mm512_set1_epi32(0x7fffffff));
  const __m512i exponent = _mm512_max_epu32(_mm512_and_si512(a, _mm512_set1_epi32(0x7f800000)),
                                            _mm512_set1_epi32(121 << 23));             // 2^e, e >= -6
  const __m512i m = _mm512_add_epi32(exponent, _mm512_set1_epi32(20 << 23));            // M = 2^(e + 20)
  const __m512i sum = _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(m)));
  const __m512i steps = _mm512_sub_epi32(sum, m);                                       // fp8 steps above M
  const __m512i base = _mm512_srli_epi32(_mm512_sub_epi32(exponent, _mm512_set1_epi32(121 << 23)), 20);
  __m512i code = _mm512_min_epu32(_mm512_add_epi32(steps, base), _mm512_set1_epi32(0x7f));
  code = _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(f, 24), _mm512_set1_epi32(0x80), 0xF8);  // | sign
  return _mm512_cvtepi32_epi8(code);
}
#endif

#if defined(CPU_CAPABILITY_AVX2)
// fp8_e4m3fn_codes for 8 lanes with AVX2, one code in the low byte of each 32-bit lane (the
// other bytes zero): the same single-addition rounding onto the fp8 grid, on |v|. kClamp: |v| is
// first limited to 448 with vminps(448, |v|), which returns |v| when it is NaN, so NaN stays NaN
// (0x7f) and inf saturates to 0x7e as after torch's clamp; without it, |v| must be below 464.
// The sign is bit 31 of `sign_of` (v itself, or the value whose quotient v is).
template <bool kClamp>
REFERENCE_CPU_INLINE __m256i fp8_e4m3fn_codes32(const __m256& v, const __m256& sign_of) {
  __m256 a = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  if constexpr (kClamp) a = _mm256_min_ps(_mm256_set1_ps(kFp8Max), a);
  const __m256i ai = _mm256_castps_si256(a);
  const __m256i exponent = _mm256_max_epu32(_mm256_and_si256(ai, _mm256_set1_epi32(0x7f800000)),
                                            _mm256_set1_epi32(121 << 23));             // 2^e, e >= -6
  const __m256i m = _mm256_add_epi32(exponent, _mm256_set1_epi32(20 << 23));            // M = 2^(e + 20)
  const __m256i sum = _mm256_castps_si256(_mm256_add_ps(a, _mm256_castsi256_ps(m)));
  const __m256i base = _mm256_srli_epi32(_mm256_sub_epi32(exponent, _mm256_set1_epi32(121 << 23)), 20);
  const __m256i code = _mm256_min_epu32(_mm256_add_epi32(_mm256_sub_epi32(sum, m), base), _mm256_set1_epi32(0x7f));
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(sign_of), 24), _mm256_set1_epi32(0x80));
  return _mm256_or_si256(code, sign);
}

// The 16 codes of a chunk (codes32 of its two vectors, in Io<T>'s lanes) as 16 bytes in order.
template <bool kEvenOdd>
REFERENCE_CPU_INLINE __m128i pack_fp8_chunk(const __m256i& ca, const __m256i& cb) {
  if constexpr (kEvenOdd) {  // ca: elements 0, 2, ..; cb: 1, 3, ..: one 16-bit pair per lane
    const __m256i pairs = _mm256_or_si256(ca, _mm256_slli_epi32(cb, 8));
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(pairs, pairs), 0x08));
  } else {
    const __m256i words = _mm256_packus_epi32(ca, cb);         // a0-3 b0-3 | a4-7 b4-7
    const __m256i bytes = _mm256_packus_epi16(words, words);   // a0-3 b0-3 a0-3 b0-3 | a4-7 b4-7 ..
    return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5)));
  }
}
#endif

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
