// Paged attention on the CPU: the KV-cache writer and the forward (prefill, chunked prefill and
// decode in one kernel), GQA with any head ratio, sliding window, soft cap, ALiBi, sinks, fp32 /
// fp16 / bf16 activations and an fp8 (e4m3fn / e5m2) cache with k/v scales.
//
// The forward parallelises over (request, kv head, chunk of query rows), longest tasks first from a
// shared counter. A task loads its rows' queries (times the scale) for every query head of its kv head
// (the GQA group) into fp32 lanes and walks the key blocks the chunk needs once, keeping an online
// softmax (running max, sum and fp32 accumulator) per lane; the output is rounded once. Per block:
// scores for every lane (prefill: over the block's keys transposed to [D, keys], in groups of four
// lanes; decode: dot products per key), then the softmax update, then the values in groups of four
// lanes. 16-bit keys and values are widened in registers (the prefill's transposition widens the keys
// once); fp8 blocks are decoded to fp32 first. Head sizes 64, 80, 96, 128 and 256 get unrolled loops;
// any other size runs the same code with runtime trip counts and partial-vector tails.
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <array>
#include <atomic>
#include <vector>

#include "attention.h"
#include "vec_common.h"

namespace reference_cpu {
namespace {

constexpr float kE4m3Max = 448.0f;
constexpr float kE5m2Max = 57344.0f;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ----- fp8 codes ---------------------------------------------------------------------------------
// Saturating round-to-nearest-even encoders (c10's conversions round to nearest even; the clamp
// makes them saturate instead of overflowing to NaN / inf). NaN stays NaN.
inline uint8_t encode_e4m3(float v) {
  const float c = std::isnan(v) ? v : std::min(std::max(v, -kE4m3Max), kE4m3Max);
  return c10::Float8_e4m3fn(c).x;
}

inline uint8_t encode_e5m2(float v) {
  const float c = std::isnan(v) ? v : std::min(std::max(v, -kE5m2Max), kE5m2Max);
  return c10::Float8_e5m2(c).x;
}

// Decoding tables: code -> fp32 value.
struct Fp8Tables {
  std::array<float, 256> e4m3;
  std::array<float, 256> e5m2;
  Fp8Tables() {
    for (int c = 0; c < 256; ++c) {
      e4m3[c] = static_cast<float>(c10::Float8_e4m3fn(static_cast<uint8_t>(c), c10::Float8_e4m3fn::from_bits()));
      e5m2[c] = static_cast<float>(c10::Float8_e5m2(static_cast<uint8_t>(c), c10::Float8_e5m2::from_bits()));
    }
  }
};

const Fp8Tables& fp8_tables() {
  static const Fp8Tables tables;
  return tables;
}

// ----- rows to and from fp32 ------------------------------------------------------------------------
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

inline void fp8_row_to_float(const uint8_t* src, float* dst, int64_t n, const float* table, float scale) {
#if defined(CPU_CAPABILITY_AVX512)
  int64_t i = 0;
  const __m512 s = _mm512_set1_ps(scale);
  for (; i + kF <= n; i += kF) {
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_i32gather_ps(idx, table, 4), s));
  }
  for (; i < n; ++i) dst[i] = table[src[i]] * scale;
#elif defined(CPU_CAPABILITY_AVX2)
  int64_t i = 0;
  const __m256 s = _mm256_set1_ps(scale);
  for (; i + kF <= n; i += kF) {
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_i32gather_ps(table, idx, 4), s));
  }
  for (; i < n; ++i) dst[i] = table[src[i]] * scale;
#else
  for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]] * scale;
#endif
}

// ----- vector pieces over the head dim ------------------------------------------------------------
inline float hsum(const fVec& v) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_reduce_add_ps(v);
#elif defined(CPU_CAPABILITY_AVX2)
  const __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
#else
  return reduce_add(v);
#endif
}

// Head dim as a compile-time constant (kD > 0) or a runtime value (kD == 0).
template <int kD>
struct HeadDim {
  int64_t d;
  REFERENCE_CPU_INLINE int64_t size() const { return kD > 0 ? kD : d; }
  REFERENCE_CPU_INLINE int64_t full() const { return size() / kF * kF; }
  REFERENCE_CPU_INLINE int64_t tail() const { return size() - full(); }
};

// n (<= kChunk) elements of C (float or a 16-bit type) at p as two fp32 vectors in order, zero past n.
template <typename C>
REFERENCE_CPU_INLINE void load_f32x2(const C* p, int64_t n, fVec& a, fVec& b) {
  if constexpr (std::is_same_v<C, float>) {
    if (n == kChunk) {
      a = fVec::loadu(p);
      b = fVec::loadu(p + kF);
    } else {
      a = fVec::loadu(p, std::min<int64_t>(n, kF));
      b = n > kF ? fVec::loadu(p + kF, n - kF) : fVec(0.f);
    }
  } else {
    using CVec = at::vec::Vectorized<C>;
    std::tie(a, b) = at::vec::convert_to_float<C>(n == kChunk ? CVec::loadu(p) : CVec::loadu(p, n));
  }
}

// s[j] = q . k_j for n keys `k_stride` elements apart (C: float, or the model's 16-bit type widened in
// registers, so a decode reads a 16-bit cache once without a widened copy).
template <int kD, typename C>
REFERENCE_CPU_INLINE void dot_keys(const float* __restrict q, const C* __restrict k, int64_t k_stride, int64_t n,
                                   HeadDim<kD> hd, float* __restrict s) {
  const int64_t D = hd.size();
  int64_t j = 0;
  for (; j + 2 <= n; j += 2) {  // two keys per step: independent FMA chains
    const C* k0 = k + j * k_stride;
    const C* k1 = k0 + k_stride;
    fVec a0(0.f), a1(0.f), b0(0.f), b1(0.f);
    for (int64_t d = 0; d < D; d += kChunk) {
      const int64_t m = std::min<int64_t>(kChunk, D - d);
      fVec qa, qb, x, y;
      load_f32x2(q + d, m, qa, qb);
      load_f32x2(k0 + d, m, x, y);
      a0 = at::vec::fmadd(qa, x, a0);
      b0 = at::vec::fmadd(qb, y, b0);
      load_f32x2(k1 + d, m, x, y);
      a1 = at::vec::fmadd(qa, x, a1);
      b1 = at::vec::fmadd(qb, y, b1);
    }
    s[j] = hsum(a0 + b0);
    s[j + 1] = hsum(a1 + b1);
  }
  for (; j < n; ++j) {
    const C* k0 = k + j * k_stride;
    fVec a0(0.f), b0(0.f);
    for (int64_t d = 0; d < D; d += kChunk) {
      const int64_t m = std::min<int64_t>(kChunk, D - d);
      fVec qa, qb, x, y;
      load_f32x2(q + d, m, qa, qb);
      load_f32x2(k0 + d, m, x, y);
      a0 = at::vec::fmadd(qa, x, a0);
      b0 = at::vec::fmadd(qb, y, b0);
    }
    s[j] = hsum(a0 + b0);
  }
}

// dst[d * ld_dst + j] = src[j * ld_src + d] for `keys` rows of `dims` floats (a key block to [D, keys]).
inline void transpose_keys(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t keys, int64_t dims) {
#if defined(CPU_CAPABILITY_AVX512)
  at::vec::transpose_mxn<float>(src, ld_src, dst, ld_dst, static_cast<int>(keys), static_cast<int>(dims));
#else
  int64_t j = 0;
#if defined(CPU_CAPABILITY_AVX2)
  for (; j + 8 <= keys; j += 8) {
    int64_t d = 0;
    for (; d + 8 <= dims; d += 8) {
      at::vec::transpose_mxn<float, 8, 8>(src + j * ld_src + d, ld_src, dst + d * ld_dst + j, ld_dst);
    }
    for (; d < dims; ++d) {
      for (int64_t jj = j; jj < j + 8; ++jj) dst[d * ld_dst + jj] = src[jj * ld_src + d];
    }
  }
#endif
  for (; j < keys; ++j) {
    for (int64_t d = 0; d < dims; ++d) dst[d * ld_dst + j] = src[j * ld_src + d];
  }
#endif
}

// Keeps a vector in a register. GCC folds a load that feeds several FMAs into each of them (one memory
// operand per FMA): a key tile row feeding four lanes was then loaded four times, and the scores of a
// prefill were bound by loads (20 per 16 FMAs), not by the FMAs.
REFERENCE_CPU_INLINE void in_register(fVec& v) {
#if defined(CPU_CAPABILITY_AVX512)
  __m512 r = v;
  asm("" : "+v"(r));
  v = r;
#elif defined(CPU_CAPABILITY_AVX2)
  __m256 r = v;
  asm("" : "+x"(r));
  v = r;
#else
  (void)v;
#endif
}

// Software prefetch of `rows` rows of `row_bytes` bytes, `stride` bytes apart, one hint per cache line. A decode
// reads its block's tokens 2 D elements apart: a 4 KB page holds a few of them, too few accesses for the
// hardware prefetchers to pick up the stream, so every key row was a miss to L3 or DRAM.
// kLocality: __builtin_prefetch's, 3 into L1, 2 into L2.
template <int kLocality>
inline void prefetch_rows(const void* p, int64_t stride, int64_t rows, int64_t row_bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(c + r * stride + b, 0, kLocality);
  }
}

// Keys of a decode's score pass per prefetch step, and how far ahead (in keys) the key rows are fetched (into
// L1). Measured on the AVX-512 VM, one thread: 32 keys ahead was slower than 16; prefetching the value rows as
// well (into L1 or L2, during the scores) cost more in prefetch instructions than it saved.
constexpr int64_t kPrefetchStep = 8;
constexpr int64_t kPrefetchAhead = 16;

// Query lanes (rows x heads of a GQA group) are computed in groups of kLanes, with the group's queries
// and probabilities interleaved (x[j * kLanes + l]), so every key or value vector loaded feeds one FMA per
// lane and one pointer serves the whole group. The task walks a block in tiles (keys for the scores,
// head-dim slices for the values) small enough to stay in L1 while all its groups pass over them: one
// lane at a time re-read the whole block (64 KB at D = 128, N = 128) from L2 per lane.
constexpr int64_t kLanes = 4;

// s[l * s_ld + j] = q_l . k_j for the kLanes lanes of a group (q_l = q + l * q_ld) and n keys: each key is
// loaded (and widened) once for the four lanes (the decode path, where a block is not worth transposing).
template <int kD, typename C>
REFERENCE_CPU_INLINE void group_dot_keys(const float* __restrict q, int64_t q_ld, const C* __restrict k,
                                         int64_t k_stride, int64_t n, HeadDim<kD> hd, float* __restrict s,
                                         int64_t s_ld) {
  const int64_t D = hd.size();
  for (int64_t j = 0; j < n; ++j) {
    const C* kj = k + j * k_stride;
    fVec a[kLanes][2];
#pragma GCC unroll 4
    for (int64_t l = 0; l < kLanes; ++l) a[l][0] = a[l][1] = fVec(0.f);
    for (int64_t d = 0; d < D; d += kChunk) {
      const int64_t m = std::min<int64_t>(kChunk, D - d);
      fVec x, y;
      load_f32x2(kj + d, m, x, y);
#pragma GCC unroll 4
      for (int64_t l = 0; l < kLanes; ++l) {
        fVec qa, qb;
        load_f32x2(q + l * q_ld + d, m, qa, qb);
        a[l][0] = at::vec::fmadd(qa, x, a[l][0]);
        a[l][1] = at::vec::fmadd(qb, y, a[l][1]);
      }
    }
#pragma GCC unroll 4
    for (int64_t l = 0; l < kLanes; ++l) s[l * s_ld + j] = hsum(a[l][0] + a[l][1]);
  }
}

#if defined(CPU_CAPABILITY_AVX512)
// {sum a, sum b, sum c, sum d}: the halves added, then three horizontal adds, one quarter the shuffles of four
// separate reductions.
REFERENCE_CPU_INLINE __m128 hsum4(const fVec& a, const fVec& b, const fVec& c, const fVec& d) {
  const auto half = [](const fVec& v) REFERENCE_CPU_INLINE_LAMBDA {
    const __m512 x = v;
    return _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
  };
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(half(a), half(b)), _mm256_hadd_ps(half(c), half(d)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
#endif

// group_dot_keys for a decode: with AVX-512, four keys at a time, each key chunk loaded (and widened) once
// for the four lanes and the 16 sums reduced four at a time (one reduction per lane and key was most of a
// decode's time); the remaining keys (and other ISAs) key by key.
template <int kD, typename C>
__attribute__((noinline)) void group_dot_keys_decode(const float* __restrict q, int64_t q_ld, const C* __restrict k,
                                                     int64_t k_stride, int64_t n, HeadDim<kD> hd, float* __restrict s,
                                                     int64_t s_ld) {
  int64_t j = 0;
#if defined(CPU_CAPABILITY_AVX512)
  static_assert(kLanes == 4, "one reduction of four sums per lane");
  const int64_t D = hd.size();
  for (; j + 4 <= n; j += 4) {
    fVec a[4][kLanes];
#pragma GCC unroll 4
    for (int64_t kk = 0; kk < 4; ++kk) {
#pragma GCC unroll 4
      for (int64_t l = 0; l < kLanes; ++l) a[kk][l] = fVec(0.f);
    }
    for (int64_t d = 0; d < D; d += kChunk) {
      const int64_t m = std::min<int64_t>(kChunk, D - d);
      fVec x[4][2];
#pragma GCC unroll 4
      for (int64_t kk = 0; kk < 4; ++kk) {
        load_f32x2(k + (j + kk) * k_stride + d, m, x[kk][0], x[kk][1]);
        in_register(x[kk][0]);
        in_register(x[kk][1]);
      }
#pragma GCC unroll 4
      for (int64_t l = 0; l < kLanes; ++l) {
        fVec qa, qb;
        load_f32x2(q + l * q_ld + d, m, qa, qb);
#pragma GCC unroll 4
        for (int64_t kk = 0; kk < 4; ++kk) {
          a[kk][l] = at::vec::fmadd(qa, x[kk][0], a[kk][l]);
          a[kk][l] = at::vec::fmadd(qb, x[kk][1], a[kk][l]);
        }
      }
    }
#pragma GCC unroll 4
    for (int64_t l = 0; l < kLanes; ++l) _mm_storeu_ps(s + l * s_ld + j, hsum4(a[0][l], a[1][l], a[2][l], a[3][l]));
  }
#endif
  if (j < n) group_dot_keys<kD>(q, q_ld, k + j * k_stride, k_stride, n - j, hd, s + j, s_ld);
}

// Vectors per lane in the register tiles below: kLanes x kTileVecs accumulators (16 of AVX-512's 32
// registers; 8 of AVX2's 16).
#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t kTileVecs = 4;
#else
constexpr int64_t kTileVecs = 2;
#endif
constexpr int64_t kTile = kTileVecs * kF;

// s[l * s_ld + j] = q_l . k_j for the kLanes lanes of a group (qi[d * kLanes + l]) and n <= kTile keys of
// a transposed block kt ([D, ld], key j in column j).
// Not inlined: a call does 4 x kTile x D FMAs, and on its own the register allocator keeps its pointers in
// registers (inlined into the block loop it shuttled them through vector registers and the stack).
template <int kD>
__attribute__((noinline)) void group_dot_transposed(const float* __restrict qi, const float* __restrict kt, int64_t ld,
                                               int64_t n, HeadDim<kD> hd, float* __restrict s, int64_t s_ld) {
  const int64_t D = hd.size();
  if (n == kTile) {
    fVec a[kLanes][kTileVecs];
#pragma GCC unroll 16
    for (int64_t l = 0; l < kLanes; ++l) {
#pragma GCC unroll 4
      for (int64_t v = 0; v < kTileVecs; ++v) a[l][v] = fVec(0.f);
    }
    for (int64_t d = 0; d < D; ++d) {
      const float* row = kt + d * ld;
      fVec k[kTileVecs];
#pragma GCC unroll 4
      for (int64_t v = 0; v < kTileVecs; ++v) {
        k[v] = fVec::loadu(row + v * kF);
        in_register(k[v]);
      }
#pragma GCC unroll 4
      for (int64_t l = 0; l < kLanes; ++l) {
        const fVec qd(qi[d * kLanes + l]);
#pragma GCC unroll 4
        for (int64_t v = 0; v < kTileVecs; ++v) a[l][v] = at::vec::fmadd(qd, k[v], a[l][v]);
      }
    }
#pragma GCC unroll 4
    for (int64_t l = 0; l < kLanes; ++l) {
#pragma GCC unroll 4
      for (int64_t v = 0; v < kTileVecs; ++v) a[l][v].store(s + l * s_ld + v * kF);
    }
    return;
  }
  for (int64_t j = 0; j < n; j += kF) {
    const int64_t m = std::min<int64_t>(kF, n - j);
    fVec a[kLanes];
#pragma GCC unroll 4
    for (int64_t l = 0; l < kLanes; ++l) a[l] = fVec(0.f);
    for (int64_t d = 0; d < D; ++d) {
      const fVec k0 = fVec::loadu(kt + d * ld + j, m);
#pragma GCC unroll 4
      for (int64_t l = 0; l < kLanes; ++l) a[l] = at::vec::fmadd(fVec(qi[d * kLanes + l]), k0, a[l]);
    }
#pragma GCC unroll 4
    for (int64_t l = 0; l < kLanes; ++l) a[l].store(s + l * s_ld + j, m);
  }
}

// acc_l[d0, d0 + dims) += sum_j p[l * p_ld + j] * v_j[0, dims) for the kLanes lanes of a group (acc_l =
// acc + l * acc_ld), dims <= kTile: one tile of the head dim; v is float or the model's 16-bit type.
template <typename C>
__attribute__((noinline)) void group_accumulate_tile(float* __restrict acc, int64_t acc_ld, int64_t d0,
                                                const float* __restrict p, int64_t p_ld, const C* __restrict v,
                                                int64_t v_stride, int64_t n, int64_t dims) {
  if (dims == kTile) {
    fVec a[kLanes][kTileVecs];
#pragma GCC unroll 4
    for (int64_t l = 0; l < kLanes; ++l) {
#pragma GCC unroll 4
      for (int64_t t = 0; t < kTileVecs; ++t) a[l][t] = fVec::loadu(acc + l * acc_ld + d0 + t * kF);
    }
    for (int64_t j = 0; j < n; ++j) {
      fVec vv[kTileVecs];
#pragma GCC unroll 4
      for (int64_t t = 0; t < kTileVecs; t += 2) load_f32x2(v + j * v_stride + t * kF, kChunk, vv[t], vv[t + 1]);
#pragma GCC unroll 4
      for (int64_t t = 0; t < kTileVecs; ++t) in_register(vv[t]);
#pragma GCC unroll 4
      for (int64_t l = 0; l < kLanes; ++l) {
        const fVec pj(p[l * p_ld + j]);
#pragma GCC unroll 4
        for (int64_t t = 0; t < kTileVecs; ++t) a[l][t] = at::vec::fmadd(pj, vv[t], a[l][t]);
      }
    }
#pragma GCC unroll 4
    for (int64_t l = 0; l < kLanes; ++l) {
#pragma GCC unroll 4
      for (int64_t t = 0; t < kTileVecs; ++t) a[l][t].store(acc + l * acc_ld + d0 + t * kF);
    }
    return;
  }
  for (int64_t t = 0; t < dims; t += kF) {
    const int64_t m = std::min<int64_t>(kF, dims - t);
    fVec a[kLanes];
#pragma GCC unroll 4
    for (int64_t l = 0; l < kLanes; ++l) a[l] = fVec::loadu(acc + l * acc_ld + d0 + t, m);
    for (int64_t j = 0; j < n; ++j) {
      fVec v0, unused;
      load_f32x2(v + j * v_stride + t, m, v0, unused);
#pragma GCC unroll 4
      for (int64_t l = 0; l < kLanes; ++l) a[l] = at::vec::fmadd(fVec(p[l * p_ld + j]), v0, a[l]);
    }
#pragma GCC unroll 4
    for (int64_t l = 0; l < kLanes; ++l) a[l].store(acc + l * acc_ld + d0 + t, m);
  }
}

// p[j] = exp(s[j] - m) for n scores; returns their sum.
inline float exp_shifted(float* s, int64_t n, float m) {
  const fVec mv(m * kLog2e), l2e(kLog2e);
  fVec sum(0.f);
  int64_t j = 0;
  for (; j + kF <= n; j += kF) {
    const fVec e = fast_exp2<5>(at::vec::fmsub(fVec::loadu(s + j), l2e, mv));
    e.store(s + j);
    sum = sum + e;
  }
  float total = hsum(sum);
  for (; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    total += s[j];
  }
  return total;
}

// ----- the forward -------------------------------------------------------------------------------
// One request's key range for the query at position p: [lo, hi] (inclusive).
struct KeyRange {
  int64_t lo, hi;
};

inline KeyRange key_range(int64_t p, int64_t seq_len, const AttentionFeatures& f) {
  int64_t lo = 0, hi = f.causal ? p : seq_len - 1;
  if (f.sliding_window > 0) {
    lo = std::max<int64_t>(0, p - f.sliding_window + 1);
    if (!f.causal) hi = std::min<int64_t>(hi, p + f.sliding_window - 1);
  }
  return {lo, hi};
}

// Query rows per task: enough (with the GQA group) to amortise a block's conversion.
inline int64_t rows_per_task(int64_t group) { return std::max<int64_t>(1, 512 / group); }

// Query lanes (rows x GQA group) of a task from which a block is transposed once for all of them.
constexpr int64_t kTransposeLanes = 8;

struct Task {
  int64_t seq, kv_head, row0, row1;  // rows relative to the request's first query row
};


template <typename T, int kD>
struct ForwardTask {
  const HeadRows<T>& out;
  const HeadRows<const T>& query;
  const PagedCache& cache;
  const PagedBatch& batch;
  const AttentionFeatures& f;
  int64_t group;
  // scratch, reused across the tasks of one thread
  std::vector<float>& q;
  std::vector<float>& acc;
  std::vector<float>& kbuf;
  std::vector<float>& vbuf;
  std::vector<float>& kt;
  std::vector<float>& s;
  std::vector<float>& m;
  std::vector<float>& l_sum;
  std::vector<float>& qi;   // queries of each lane group interleaved
  std::vector<float>& vt;   // a block's values as head-dim tiles (prefill)
  std::vector<int64_t>& ra;
  std::vector<int64_t>& re;
  std::vector<int64_t>& glo;  // per lane group: the block's keys some lane of it sees
  std::vector<int64_t>& ghi;

  // Soft cap and ALiBi on n scores of head h whose first key is `dist0` positions before the query;
  // returns their max.
  float adjust_scores(float* sc, int64_t n, int64_t h, int64_t dist0) const {
    const float cap = f.logits_soft_cap;
    float block_max = kNegInf;
    if (cap > 0.f || f.alibi_slopes) {
      const float slope = f.alibi_slopes ? f.alibi_slopes[h] : 0.f;
      for (int64_t j = 0; j < n; ++j) {
        float x = sc[j];
        if (cap > 0.f) x = cap * std::tanh(x / cap);
        if (f.alibi_slopes) x += -slope * static_cast<float>(dist0 - j);
        sc[j] = x;
        block_max = nan_max(block_max, x);
      }
      return block_max;
    }
    int64_t j = 0;
    if (n >= kF) {
      fVec mv = fVec::loadu(sc);
      for (j = kF; j + kF <= n; j += kF) mv = at::vec::maximum(mv, fVec::loadu(sc + j));
      block_max = reduce_max(mv);
    }
    for (; j < n; ++j) block_max = nan_max(block_max, sc[j]);
    return block_max;
  }

  // What a task's blocks share: its rows, lanes and positions.
  struct TaskState {
    Task t;
    int64_t rows, lanes, padded_lanes, context, seq_len;
    bool transposed;
  };

  // One key block [ja, jb] (keys j at kb + (j - j0) * ks, values at vb + (j - j0) * ks; C = float or the
  // model's 16-bit type): scores, the online-softmax update and the values, for every lane of the task.
  // next_k: the next block's first key row (prefetched during this block's values; null: none).
  template <typename C>
  void attend_block(const TaskState& st, const C* kb, const C* vb, int64_t ks, int64_t j0, int64_t ja, int64_t jb,
                    const C* next_k) {
    const HeadDim<kD> hd{cache.head_size};
    const int64_t D = hd.size(), N = cache.block_size, G = group;
    const Task& t = st.t;
    const int64_t rows = st.rows, lanes = st.lanes, padded_lanes = st.padded_lanes, context = st.context;
    const int64_t seq_len = st.seq_len;
    const bool transposed = st.transposed;
    const int64_t nb = jb - ja + 1, s_ld = N + kF;
    if (transposed) {
      // The block's keys, widened, as key tiles [D, kTile] one after another (kt), and its values, widened,
      // as head-dim tiles [nb, kTile] (vt): each tile contiguous, so it stays in L1 while every lane group
      // passes over it. Read in place, rows kTile * 4 bytes long and (2 D) elements apart map onto few L1
      // sets, and a 32 KB tile was re-read from L2 by every group.
      const float* kf = reinterpret_cast<const float*>(kb + (ja - j0) * ks);
      int64_t kf_ld = ks;
      if constexpr (!std::is_same_v<C, float>) {
        for (int64_t j = 0; j < nb; ++j) row_to_float(kb + (ja - j0 + j) * ks, kbuf.data() + j * D, D);
        kf = kbuf.data();
        kf_ld = D;
      }
      for (int64_t jt = 0; jt < nb; jt += kTile) {
        transpose_keys(kf + jt * kf_ld, kf_ld, kt.data() + jt * D, kTile, std::min<int64_t>(kTile, nb - jt), D);
      }
      for (int64_t j = 0; j < nb; ++j) {
        const C* vrow = vb + (ja - j0 + j) * ks;
        for (int64_t d0 = 0; d0 < D; d0 += kTile) {
          row_to_float(vrow + d0, vt.data() + d0 * N + j * kTile, std::min<int64_t>(kTile, D - d0));
        }
      }
    }
    // each row's keys [ra, re] in this block (ra > re: none)
    for (int64_t r = 0; r < rows; ++r) {
      const KeyRange range = key_range(context + t.row0 + r, seq_len, f);
      ra[r] = std::max(ja, range.lo);
      re[r] = std::min(jb, range.hi);
    }
    // the keys [glo, ghi] (relative to ja) that some lane of group k sees: a causal prefill's groups skip
    // the key tiles past their rows (and a window's those before them)
    for (int64_t k = 0; k < padded_lanes / kLanes; ++k) {
      int64_t lo = nb, hi = -1;
      for (int64_t idx = k * kLanes; idx < std::min(lanes, (k + 1) * kLanes); ++idx) {
        const int64_t r = idx / G;
        if (ra[r] > re[r]) continue;
        lo = std::min(lo, ra[r] - ja);
        hi = std::max(hi, re[r] - ja);
      }
      glo[k] = lo;
      ghi[k] = hi;
    }
    // 1. scores of every lane over the block's keys [ja, jb]: key tiles outer, so a tile stays in L1 while
    //    every lane group passes over it
    if (transposed) {
      for (int64_t jt = 0; jt < nb; jt += kTile) {
        const int64_t nt = std::min<int64_t>(kTile, nb - jt);
        for (int64_t k = 0; k < padded_lanes / kLanes; ++k) {
          if (glo[k] >= jt + nt || ghi[k] < jt) continue;  // scores no lane of the group reads
          group_dot_transposed<kD>(qi.data() + k * kLanes * D, kt.data() + jt * D, kTile, nt, hd,
                                   s.data() + k * kLanes * s_ld + jt, s_ld);
        }
      }
    } else {
      // keys in steps, each prefetching the key rows kPrefetchAhead keys on
      const int64_t row_bytes = D * static_cast<int64_t>(sizeof(C)), stride = ks * static_cast<int64_t>(sizeof(C));
      const C* k0 = kb + (ja - j0) * ks;
      prefetch_rows<3>(k0, stride, std::min(kPrefetchAhead, nb), row_bytes);
      for (int64_t j = 0; j < nb; j += kPrefetchStep) {
        const int64_t n = std::min(kPrefetchStep, nb - j), ahead = j + kPrefetchAhead;
        if (ahead < nb) prefetch_rows<3>(k0 + ahead * ks, stride, std::min(kPrefetchStep, nb - ahead), row_bytes);
        for (int64_t k = 0; k < padded_lanes / kLanes; ++k) {
          group_dot_keys_decode<kD>(q.data() + k * kLanes * D, D, k0 + j * ks, ks, n, hd,
                                    s.data() + k * kLanes * s_ld + j, s_ld);
        }
      }
      if (next_k) prefetch_rows<2>(next_k, stride, std::min(kPrefetchAhead, N), row_bytes);  // for the next block
    }
    // 2. per lane: soft cap / ALiBi, the online-softmax update (acc rescaled); its scores become its
    //    probabilities in place (zero for the block's keys the lane does not see)
    for (int64_t idx = 0; idx < padded_lanes; ++idx) {
      const int64_t r = idx / G;
      float* sc = s.data() + idx * s_ld;
      if (idx >= lanes || ra[r] > re[r]) {
        std::fill(sc, sc + nb, 0.f);
        continue;
      }
      const int64_t off = ra[r] - ja, n = re[r] - ra[r] + 1, pos = context + t.row0 + r;
      const float block_max = adjust_scores(sc + off, n, t.kv_head * G + idx % G, pos - ra[r]);
      const float m_old = m[idx];
      const float m_new = std::max(m_old, block_max);
      if (m_new == kNegInf) {  // every logit so far is -inf: nothing to add
        std::fill(sc, sc + nb, 0.f);
        continue;
      }
      // (the max rarely moves after the first blocks: no exp then)
      const float alpha = m_old == kNegInf ? 0.f : m_old == m_new ? 1.f : std::exp(m_old - m_new);
      const float psum = exp_shifted(sc + off, n, m_new);
      l_sum[idx] = l_sum[idx] * alpha + psum;
      m[idx] = m_new;
      std::fill(sc, sc + off, 0.f);
      std::fill(sc + off + n, sc + nb, 0.f);
      if (alpha != 1.f) {
        float* ac = acc.data() + idx * D;
        const fVec al(alpha);
        int64_t d = 0;
        for (; d + kF <= D; d += kF) (fVec::loadu(ac + d) * al).store(ac + d);
        for (; d < D; ++d) ac[d] *= alpha;
      }
    }
    // 3. acc += P V: head-dim tiles outer, so a tile of the block's values stays in L1 across groups
    for (int64_t d0 = 0; d0 < D; d0 += kTile) {
      const int64_t dims = std::min<int64_t>(kTile, D - d0);
      for (int64_t k = 0; k < padded_lanes / kLanes; ++k) {
        const int64_t lo = glo[k], n = ghi[k] - glo[k] + 1;
        if (n <= 0) continue;
        float* a = acc.data() + k * kLanes * D;
        const float* p = s.data() + k * kLanes * s_ld + lo;
        if (transposed) {
          group_accumulate_tile(a, D, d0, p, s_ld, vt.data() + d0 * N + lo * kTile, kTile, n, dims);
        } else {
          group_accumulate_tile(a, D, d0, p, s_ld, vb + (ja - j0 + lo) * ks + d0, ks, n, dims);
        }
      }
    }
  }

  void run(const Task& t) {
    const HeadDim<kD> hd{cache.head_size};
    const int64_t D = hd.size(), N = cache.block_size, G = group;
    const int64_t q_begin = batch.query_start_loc[t.seq];
    const int64_t q_len = batch.query_start_loc[t.seq + 1] - q_begin;
    const int64_t seq_len = batch.seq_lens[t.seq];
    const int64_t context = seq_len - q_len;
    const int64_t rows = t.row1 - t.row0;
    const int32_t* table = batch.block_table + t.seq * batch.block_table_stride;

    const int64_t lanes = rows * G, padded_lanes = (lanes + kLanes - 1) / kLanes * kLanes;
    std::fill(acc.begin(), acc.begin() + padded_lanes * D, 0.f);
    std::fill(qi.begin(), qi.begin() + padded_lanes * D, 0.f);
    std::fill(q.begin() + lanes * D, q.begin() + padded_lanes * D, 0.f);
    for (int64_t r = 0; r < rows; ++r) {
      const T* qrow = query.data + (q_begin + t.row0 + r) * query.stride_token;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = t.kv_head * G + g, idx = r * G + g;
        float* qf = q.data() + idx * D;
        row_to_float(qrow + h * query.stride_head, qf, D);
        float* qg = qi.data() + (idx / kLanes) * kLanes * D + idx % kLanes;
        for (int64_t d = 0; d < D; ++d) {
          qf[d] *= f.scale;  // s = (scale q) . k
          qg[d * kLanes] = qf[d];
        }
        m[idx] = f.sinks ? f.sinks[h] : kNegInf;  // a sink is a key with logit sinks[h] and value 0
        l_sum[idx] = m[idx] == kNegInf ? 0.f : 1.f;  // e^(sink - m) with m = sink
      }
    }
    const KeyRange first = key_range(context + t.row0, seq_len, f);
    const KeyRange last = key_range(context + t.row1 - 1, seq_len, f);
    const int64_t lo = first.lo, hi = last.hi;
    const bool transposed = lanes >= kTransposeLanes;
    const TaskState st{t, rows, lanes, padded_lanes, context, seq_len, transposed};
    const auto& tables = fp8_tables();
    const float* fp8_table = cache.format == KvFormat::kFp8E5m2 ? tables.e5m2.data() : tables.e4m3.data();

    for (int64_t lb = lo / N; lb <= hi / N && hi >= lo; ++lb) {
      const int64_t j0 = lb * N;
      const int64_t ja = std::max(j0, lo), jb = std::min(j0 + N - 1, hi);
      const int64_t block = table[lb];
      const int64_t head_off = block * cache.stride_block + t.kv_head * cache.stride_head;
      if (cache.format == KvFormat::kAuto) {  // keys and values read in place (16-bit: widened in registers)
        const T* base = static_cast<const T*>(cache.data) + head_off;
        const T* next = nullptr;
        if (lb + 1 <= hi / N) {
          next = static_cast<const T*>(cache.data) + table[lb + 1] * cache.stride_block +
                 t.kv_head * cache.stride_head;
        }
        attend_block<T>(st, base, base + D, cache.stride_token, j0, ja, jb, next);
      } else {  // fp8: decoded (times the scale) into fp32 rows first
        for (int64_t j = ja; j <= jb; ++j) {
          const uint8_t* src = static_cast<const uint8_t*>(cache.data) + head_off + (j - j0) * cache.stride_token;
          fp8_row_to_float(src, kbuf.data() + (j - j0) * D, D, fp8_table, cache.k_scale);
          fp8_row_to_float(src + D, vbuf.data() + (j - j0) * D, D, fp8_table, cache.v_scale);
        }
        attend_block<float>(st, kbuf.data(), vbuf.data(), D, j0, ja, jb, nullptr);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      T* orow = out.data + (q_begin + t.row0 + r) * out.stride_token;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = t.kv_head * G + g, idx = r * G + g;
        float* a = acc.data() + idx * D;
        const float inv = l_sum[idx] > 0.f ? 1.f / l_sum[idx] : 0.f;
        const fVec iv(inv);
        int64_t d = 0;
        for (; d + kF <= D; d += kF) (fVec::loadu(a + d) * iv).store(a + d);
        for (; d < D; ++d) a[d] *= inv;
        row_from_float(a, orow + h * out.stride_head, D);
      }
    }
  }
};

template <typename T, int kD>
void forward_impl(HeadRows<T> out, HeadRows<const T> query, const PagedCache& cache, const PagedBatch& batch,
                  const AttentionFeatures& f) {
  const int64_t G = f.num_heads / cache.kv_heads;
  const int64_t chunk = rows_per_task(G);
  std::vector<Task> tasks;
  std::vector<int64_t> cost;
  for (int64_t i = 0; i < batch.num_seqs; ++i) {
    const int64_t q_len = batch.query_start_loc[i + 1] - batch.query_start_loc[i];
    const int64_t context = batch.seq_lens[i] - q_len;
    for (int64_t r0 = 0; r0 < q_len; r0 += chunk) {
      const int64_t r1 = std::min(q_len, r0 + chunk);
      const KeyRange first = key_range(context + r0, batch.seq_lens[i], f);
      const KeyRange last = key_range(context + r1 - 1, batch.seq_lens[i], f);
      for (int64_t kvh = 0; kvh < cache.kv_heads; ++kvh) {
        tasks.push_back({i, kvh, r0, r1});
        cost.push_back((r1 - r0) * (last.hi - first.lo + 1));
      }
    }
  }
  // Longest first, handed out one at a time: causal prefill chunks differ in cost, a static split of
  // the task range would leave a thread idle.
  std::vector<int64_t> order(tasks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cost[a] > cost[b]; });
  const int64_t D = cache.head_size, N = cache.block_size;
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), n_tasks);
  std::atomic<int64_t> next{0};
  // Scratch sized to the largest task (a decode batch needs a few KB, not the prefill's ~1 MB: glibc maps
  // allocations above 128 KB afresh, and faulting their pages in cost a small decode more than its math).
  int64_t max_rows = 1;
  for (const Task& t : tasks) max_rows = std::max(max_rows, t.row1 - t.row0);
  const int64_t lanes = max_rows * G, padded = (lanes + kLanes - 1) / kLanes * kLanes;
  const bool fp8 = cache.format != KvFormat::kAuto;
  const bool may_transpose = lanes >= kTransposeLanes;
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(padded * D), acc(padded * D), m(padded), l(padded), s_all(padded * (N + kF)),
        qi(padded * D);
    std::vector<float> kbuf(fp8 || (may_transpose && !std::is_same_v<T, float>) ? N * D : 0);
    std::vector<float> vbuf(fp8 ? N * D : 0);
    const int64_t tiled_keys = (N + kTile - 1) / kTile * kTile, tiled_dims = (D + kTile - 1) / kTile * kTile;
    std::vector<float> kt(may_transpose ? tiled_keys * D : 0), vt(may_transpose ? tiled_dims * N : 0);
    std::vector<int64_t> ra(max_rows), re(max_rows), glo(padded / kLanes), ghi(padded / kLanes);
    ForwardTask<T, kD> runner{out, query, cache, batch, f, G, q, acc, kbuf, vbuf, kt, s_all, m, l, qi, vt, ra, re, glo, ghi};
    for (int64_t w = begin; w < end; ++w) {
      for (int64_t i = next.fetch_add(1); i < n_tasks; i = next.fetch_add(1)) runner.run(tasks[order[i]]);
    }
  });
}

template <typename T>
void write_rows(const T* src, const PagedCache& cache, int64_t off, float scale) {
  const int64_t D = cache.head_size;
  if (cache.format == KvFormat::kAuto) {
    std::memcpy(static_cast<T*>(cache.data) + off, src, D * sizeof(T));
    return;
  }
  uint8_t* dst = static_cast<uint8_t*>(cache.data) + off;
  const bool e4m3 = cache.format == KvFormat::kFp8E4m3;
  for (int64_t d = 0; d < D; ++d) {
    const float x = static_cast<float>(src[d]) / scale;
    dst[d] = e4m3 ? encode_e4m3(x) : encode_e5m2(x);
  }
}

}  // namespace

template <typename T>
void reshape_and_cache(HeadRows<const T> key, HeadRows<const T> value, const int64_t* slots, int64_t tokens,
                       const PagedCache& cache) {
  const int64_t KVH = cache.kv_heads, N = cache.block_size, D = cache.head_size;
  at::parallel_for(0, tokens * KVH, std::max<int64_t>(1, 4096 / std::max<int64_t>(D, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t i = begin; i < end; ++i) {
                       const int64_t t = i / KVH, h = i % KVH;
                       const int64_t slot = slots[t];
                       if (slot < 0) continue;  // padding
                       const int64_t off = (slot / N) * cache.stride_block + h * cache.stride_head +
                                           (slot % N) * cache.stride_token;
                       write_rows(key.data + t * key.stride_token + h * key.stride_head, cache, off, cache.k_scale);
                       write_rows(value.data + t * value.stride_token + h * value.stride_head, cache, off + D,
                                  cache.v_scale);
                     }
                   });
}

template <typename T>
void paged_attention(HeadRows<T> output, HeadRows<const T> query, const PagedCache& cache, const PagedBatch& batch,
                     const AttentionFeatures& features) {
  switch (cache.head_size) {
    case 64:
      return forward_impl<T, 64>(output, query, cache, batch, features);
    case 80:
      return forward_impl<T, 80>(output, query, cache, batch, features);
    case 96:
      return forward_impl<T, 96>(output, query, cache, batch, features);
    case 128:
      return forward_impl<T, 128>(output, query, cache, batch, features);
    case 256:
      return forward_impl<T, 256>(output, query, cache, batch, features);
    default:
      return forward_impl<T, 0>(output, query, cache, batch, features);
  }
}

#define REFERENCE_CPU_INSTANTIATE_ATTENTION(T)                                                          \
  template void reshape_and_cache<T>(HeadRows<const T>, HeadRows<const T>, const int64_t*, int64_t,     \
                                     const PagedCache&);                                                \
  template void paged_attention<T>(HeadRows<T>, HeadRows<const T>, const PagedCache&, const PagedBatch&, \
                                   const AttentionFeatures&);
REFERENCE_CPU_INSTANTIATE_ATTENTION(float)
REFERENCE_CPU_INSTANTIATE_ATTENTION(c10::Half)
REFERENCE_CPU_INSTANTIATE_ATTENTION(c10::BFloat16)
#undef REFERENCE_CPU_INSTANTIATE_ATTENTION

}  // namespace reference_cpu
