// Paged attention on the CPU: the KV-cache writer and the forward (prefill, chunked prefill and
// decode in one kernel), GQA with any head ratio, sliding window, soft cap, ALiBi, sinks, fp32 /
// fp16 / bf16 activations and an fp8 (e4m3fn / e5m2) cache with k/v scales.
//
// The forward parallelises over (request, kv head, chunk of query rows), longest tasks first from a
// shared counter. A task loads its rows' queries (times the scale) for every query head of its kv head
// (the GQA group) into fp32 lanes and walks the key blocks the chunk needs once, keeping an online
// softmax (running max, sum and fp32 accumulator) per lane; the output is rounded once. The cache keeps
// each (block, kv head) as the block's keys transposed, [D, N], then its values as rows, [N, D] (the
// writer packs them so; attention.h). Per block: scores for every lane in groups of four lanes, each a
// broadcast query element times vectors of keys (no reductions), then the softmax update, then the values
// in groups of four lanes. A decode reads the block in place, 16-bit keys and values widened in registers;
// a task of eight lanes or more (a prefill) first copies the block, widened, into L1-sized tiles (blocks of
// 64 tokens or fewer gathered, 128 keys per softmax update); fp8 blocks are decoded to fp32 first. bf16 on a
// CPU with AMX-BF16 takes AMX tiles instead (the bf16 path below), from the cache in place where it keeps the
// tiles' pairs layout (attention.h), else from packed copies (prefills). Head
// sizes 64, 80, 96, 128 and 256 get unrolled loops; any other size runs the same code with runtime trip
// counts and partial-vector tails.
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <vector>

#if defined(__linux__)
#include <unistd.h>  // sysconf: the L1 data cache's size
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__) && defined(__x86_64__) && defined(__linux__) && \
    defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#include <sys/syscall.h>
#include <unistd.h>
#define REFERENCE_CPU_ATTENTION_AMX 1
#endif

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

// n (<= kF) elements of C at p as one fp32 vector, zero past n (a whole vector widened in registers).
template <typename C>
REFERENCE_CPU_INLINE fVec load_f32x1(const C* p, int64_t n) {
  if constexpr (std::is_same_v<C, float>) {
    return n == kF ? fVec::loadu(p) : fVec::loadu(p, n);
  } else {
#if defined(CPU_CAPABILITY_AVX512)
    if (n == kF) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      if constexpr (std::is_same_v<C, c10::BFloat16>) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      } else {
        return _mm512_cvtph_ps(h);
      }
    }
#elif defined(CPU_CAPABILITY_AVX2)
    if (n == kF) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      if constexpr (std::is_same_v<C, c10::BFloat16>) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      } else {
        return _mm256_cvtph_ps(h);
      }
    }
#endif
    fVec a, b;
    load_f32x2(p, n, a, b);
    return a;
  }
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

// Query lanes (rows x heads of a GQA group) are computed in groups of kLanes, with the group's queries
// and probabilities interleaved (x[j * kLanes + l]), so every key or value vector loaded feeds one FMA per
// lane and one pointer serves the whole group. The task walks a block in tiles (keys for the scores,
// head-dim slices for the values) small enough to stay in L1 while all its groups pass over them: one
// lane at a time re-read the whole block (64 KB at D = 128, N = 128) from L2 per lane.
constexpr int64_t kLanes = 4;

// Vectors per lane in the register tiles below: kLanes x kTileVecs accumulators (16 of AVX-512's 32
// registers; 8 of AVX2's 16).
#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t kTileVecs = 4;
#else
constexpr int64_t kTileVecs = 2;
#endif
constexpr int64_t kTile = kTileVecs * kF;

// n (<= kTile) elements of a block row into a tile row, widened to fp32: a whole tile row through vector
// registers (as a 256-byte memcpy it compiled to `rep movsq`, whose start-up was a fifth of a prefill's
// block packing).
template <typename C>
REFERENCE_CPU_INLINE void tile_row_to_float(const C* src, float* dst, int64_t n) {
  if (n != kTile) return row_to_float(src, dst, n);
#pragma GCC unroll 4
  for (int64_t v = 0; v < kTileVecs; v += 2) {
    fVec a, b;
    load_f32x2(src + v * kF, kChunk, a, b);
    a.store(dst + v * kF);
    b.store(dst + (v + 1) * kF);
  }
}

// The queries of one lane group, scaled and interleaved: qg[d * kLanes + l] = scale * rows[l][d] for d < D, and zero
// for a lane whose row is null (past the task's lanes). The same products as widening a row and scaling it; whole
// vectors go through registers (a 4 x kF transpose), where element by element the stores waited on each row's
// loads: 4-5% of an fp32 512-on-1024 prefill (Zen 5 EPYC, one thread).
static_assert(kLanes == 4, "interleave_queries transposes four rows");
template <typename C>
REFERENCE_CPU_INLINE void interleave_queries(const C* const* rows, int64_t D, float scale, float* __restrict qg) {
  int64_t d = 0;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  const fVec sv(scale);
  for (; d + kF <= D; d += kF) {
    fVec x[kLanes];
    for (int64_t l = 0; l < kLanes; ++l) x[l] = rows[l] ? load_f32x1(rows[l] + d, kF) * sv : fVec(0.f);
    // per 128-bit lane i: u_e = (x0, x1, x2, x3) of element 4i + e
#if defined(CPU_CAPABILITY_AVX512)
    const __m512 t0 = _mm512_unpacklo_ps(x[0], x[1]), t1 = _mm512_unpackhi_ps(x[0], x[1]);
    const __m512 t2 = _mm512_unpacklo_ps(x[2], x[3]), t3 = _mm512_unpackhi_ps(x[2], x[3]);
    const __m512 u0 = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2)));
    const __m512 u1 = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2)));
    const __m512 u2 = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)));
    const __m512 u3 = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)));
    // output vector i: the u_e's 128-bit lane i, e = 0..3
    const __m512 v0 = _mm512_shuffle_f32x4(u0, u1, 0x44), v1 = _mm512_shuffle_f32x4(u2, u3, 0x44);
    const __m512 v2 = _mm512_shuffle_f32x4(u0, u1, 0xEE), v3 = _mm512_shuffle_f32x4(u2, u3, 0xEE);
    float* o = qg + d * kLanes;
    _mm512_storeu_ps(o, _mm512_shuffle_f32x4(v0, v1, 0x88));
    _mm512_storeu_ps(o + kF, _mm512_shuffle_f32x4(v0, v1, 0xDD));
    _mm512_storeu_ps(o + 2 * kF, _mm512_shuffle_f32x4(v2, v3, 0x88));
    _mm512_storeu_ps(o + 3 * kF, _mm512_shuffle_f32x4(v2, v3, 0xDD));
#else
    const __m256 t0 = _mm256_unpacklo_ps(x[0], x[1]), t1 = _mm256_unpackhi_ps(x[0], x[1]);
    const __m256 t2 = _mm256_unpacklo_ps(x[2], x[3]), t3 = _mm256_unpackhi_ps(x[2], x[3]);
    const __m256 u0 = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t0), _mm256_castps_pd(t2)));
    const __m256 u1 = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t0), _mm256_castps_pd(t2)));
    const __m256 u2 = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t1), _mm256_castps_pd(t3)));
    const __m256 u3 = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t1), _mm256_castps_pd(t3)));
    float* o = qg + d * kLanes;
    _mm256_storeu_ps(o, _mm256_permute2f128_ps(u0, u1, 0x20));
    _mm256_storeu_ps(o + kF, _mm256_permute2f128_ps(u2, u3, 0x20));
    _mm256_storeu_ps(o + 2 * kF, _mm256_permute2f128_ps(u0, u1, 0x31));
    _mm256_storeu_ps(o + 3 * kF, _mm256_permute2f128_ps(u2, u3, 0x31));
#endif
  }
#endif
  for (; d < D; ++d) {
    for (int64_t l = 0; l < kLanes; ++l) qg[d * kLanes + l] = rows[l] ? static_cast<float>(rows[l][d]) * scale : 0.f;
  }
}

// Bytes a decode reads next, prefetched into L2 by the score loop, one or two lines an iteration (iteration
// i: from p + i * step). A decode reads a block in place in column strips (a tile of keys, then of head dims,
// across all its rows); AMD Zen 3's prefetchers do not follow that, and a one-thread fp32 decode read its
// cache at 5 GB/s where a plain sum reads 12-22 GB/s. Only the score loop prefetches: in the value loop the
// same two prefetches made GCC 12 keep the 16-bit kernels' accumulators on the stack (AVX2 and AVX-512).
alignas(64) inline const char kNoPrefetchLine[64] = {};

// Whether a decode prefetches what it reads next (Prefetch): yes but on Intel CPUs. AMD Zen 3's prefetchers do not
// follow a decode's column strips (above); Intel's do, and there the extra requests cost: on a 2-core Xeon VM with
// AMX, one thread, fp32 decode at batch 1 ran at 0.90 to 0.94 of vLLM's speed with them, 1.00 to 1.03 without
// (batch 8: 0.94 -> 1.03). REFERENCE_CPU_PREFETCH=1 or 0 forces it either way (A/B measurements). Read once.
inline bool software_prefetch() {
  static const bool on = [] {
    const char* forced = std::getenv("REFERENCE_CPU_PREFETCH");
    if (forced != nullptr && forced[0] != '\0') return forced[0] != '0';
#if defined(__x86_64__) && defined(__GNUC__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return true;
    return !(b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu);  // "Genu" "ineI" "ntel"
#else
    return true;
#endif
  }();
  return on;
}

struct Prefetch {
  const char* p = kNoPrefetchLine;
  int64_t step = 0;  // bytes per iteration: the region's size over the iterations (0: nothing to prefetch)
  int64_t half = 0;  // step / 2: a second line an iteration where step is over 64 bytes

  // Two prefetches, both inside the region (i * step + half < iters * step <= bytes), no branches: with a
  // loop or a bounds check here GCC spilled the micro-kernels' accumulators to the stack.
  REFERENCE_CPU_INLINE void at(int64_t i) const {
    const char* q = p + i * step;
    __builtin_prefetch(q, 0, 2);
    __builtin_prefetch(q + half, 0, 2);
  }
  // the rest of the region, from iteration `iters` on
  Prefetch after(int64_t iters) const { return {p + iters * step, step, half}; }
};

// `bytes` bytes at `region` spread over `iters` iterations (lines past two an iteration are left to the
// hardware); nothing where software_prefetch() says no
inline Prefetch prefetch_over(const void* region, int64_t bytes, int64_t iters) {
  if (region == nullptr || bytes <= 0 || iters <= 0 || !software_prefetch()) return {};
  const int64_t step = bytes / iters;
  return {static_cast<const char*>(region), step, step / 2};
}

// s[l * s_ld + v * kF + i] = q_l . (key i of vector v) for the kLanes lanes of a group (qi[d * kLanes + l])
// and kNV vectors of kF keys, element d of vector v's keys at vec[v] + d * ld (C = float or the model's 16-bit
// type, widened in registers); kMasked: the last vector holds `last` keys (loaded and stored masked). Per
// head-dim element one broadcast query value times vectors of keys, no reductions; every score sums over d in
// the same order whatever kNV is. The vectors may come from different blocks (a decode over small blocks).
template <int kNV, bool kMasked, int kD, typename C>
REFERENCE_CPU_INLINE void dot_vectors(const float* __restrict qi, const C* const* vec, int64_t last, int64_t ld,
                                      HeadDim<kD> hd, float* __restrict s, int64_t s_ld, Prefetch pf) {
  const int64_t D = hd.size();
  const auto width = [last](int64_t v) { return kMasked && v + 1 == kNV ? last : kF; };
  fVec a[kLanes][kNV];
#pragma GCC unroll 16
  for (int64_t l = 0; l < kLanes; ++l) {
#pragma GCC unroll 4
    for (int64_t v = 0; v < kNV; ++v) a[l][v] = fVec(0.f);
  }
  for (int64_t d = 0; d < D; ++d) {
    pf.at(d);
    fVec k[kNV];
#pragma GCC unroll 4
    for (int64_t v = 0; v < kNV; ++v) {
      k[v] = load_f32x1(vec[v] + d * ld, width(v));
      in_register(k[v]);
    }
#pragma GCC unroll 4
    for (int64_t l = 0; l < kLanes; ++l) {
      const fVec qd(qi[d * kLanes + l]);
#pragma GCC unroll 4
      for (int64_t v = 0; v < kNV; ++v) a[l][v] = at::vec::fmadd(qd, k[v], a[l][v]);
    }
  }
#pragma GCC unroll 4
  for (int64_t l = 0; l < kLanes; ++l) {
#pragma GCC unroll 4
    for (int64_t v = 0; v < kNV; ++v) a[l][v].store(s + l * s_ld + v * kF, width(v));
  }
}

// dot_vectors over nvec (<= kTileVecs) vectors, the last of `last` keys: a whole tile, or a part of one (a causal
// prefill's lane group on its diagonal, a decode's last keys) with all its vectors' accumulators side by side
// (vector by vector, four accumulators waited on the FMA latency: the diagonal tiles ran at half the rate).
// Not inlined: a call does 4 x 64 x D FMAs, and on its own the register allocator keeps its pointers in
// registers (inlined into the block loop it shuttled them through vector registers and the stack).
template <int kD, typename C>
__attribute__((noinline)) void group_dot_vectors(const float* __restrict qi, const C* const* vec, int64_t nvec,
                                            int64_t last, int64_t ld, HeadDim<kD> hd, float* __restrict s,
                                            int64_t s_ld, Prefetch pf = {}) {
  if (nvec == kTileVecs && last == kF) return dot_vectors<kTileVecs, false>(qi, vec, last, ld, hd, s, s_ld, pf);
  switch (nvec) {
    case 1: return dot_vectors<1, true>(qi, vec, last, ld, hd, s, s_ld, pf);
    case 2: return dot_vectors<2, true>(qi, vec, last, ld, hd, s, s_ld, pf);
#if defined(CPU_CAPABILITY_AVX512)
    case 3: return dot_vectors<3, true>(qi, vec, last, ld, hd, s, s_ld, pf);
    case 4: return dot_vectors<4, true>(qi, vec, last, ld, hd, s, s_ld, pf);
#endif
    default: TORCH_CHECK(false, "group_dot_vectors: ", nvec, " vectors of keys, more than a tile's ", kTileVecs);
  }
}

// acc_l[d0, d0 + dims) += sum_j p[l * p_ld + j] * v_j[0, dims) for the kLanes lanes of a group (acc_l =
// acc + l * acc_ld), dims <= kTile: one tile of the head dim; v is float or the model's 16-bit type.
template <typename C>
REFERENCE_CPU_INLINE void accumulate_tile(float* __restrict acc, int64_t acc_ld, int64_t d0, const float* __restrict p,
                                          int64_t p_ld, const C* __restrict v, int64_t v_stride, int64_t n,
                                          int64_t dims) {
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

// accumulate_tile for one lane group, not inlined (a decode's few groups: see group_dot_vectors).
template <typename C>
__attribute__((noinline)) void group_accumulate_tile(float* __restrict acc, int64_t acc_ld, int64_t d0,
                                                const float* __restrict p, int64_t p_ld, const C* __restrict v,
                                                int64_t v_stride, int64_t n, int64_t dims) {
  accumulate_tile(acc, acc_ld, d0, p, p_ld, v, v_stride, n, dims);
}

// The lane groups of a task (a prefill's many), as a block's scores and values pass over them: group k's queries
// at qi + k * kLanes * D (interleaved), its scores or probabilities at s + k * kLanes * s_ld (a row a lane), its
// accumulators at acc + k * kLanes * D (a row a lane), and [glo[k], ghi[k]] the block's keys some lane of it sees
// (relative to the block's first key; none where glo > ghi).
struct LaneGroups {
  const float* qi;
  float* s;
  float* acc;
  int64_t s_ld, D, count;
  const int64_t* glo;
  const int64_t* ghi;
};

// The scores of every group over the keys [jt, jt + nt) of a key tile (nt <= kTile; key jt + i at tile[i], element d
// ld apart): each group up to its last key. One call a tile, the group loop inside: a call a group cost the prefill
// its calls' set-up, a few percent of it (fp32 512-on-1024, Zen 5). `pf` is the first group's prefetch.
template <int kD, typename C>
__attribute__((noinline)) void score_groups(const LaneGroups& g, const C* tile, int64_t ld, int64_t jt, int64_t nt,
                                       HeadDim<kD> hd, Prefetch pf) {
  const int64_t D = hd.size();
  std::array<const C*, kTileVecs> vec;  // the tile's vectors of keys, the same for every group
  for (int64_t v = 0; v < kTileVecs; ++v) vec[v] = tile + v * kF;
  for (int64_t k = 0; k < g.count; ++k, pf = Prefetch{}) {
    if (g.glo[k] >= jt + nt || g.ghi[k] < jt) continue;  // scores no lane of the group reads
    // up to the group's last key: a causal prefill's group stops inside the tile it is on the diagonal of
    // (the keys past it, up to 63 of a 64-key tile, were scored and never read: +0.5-0.9%, fp32 prefill)
    const int64_t keys = std::min(nt, g.ghi[k] - jt + 1), nvec = (keys + kF - 1) / kF;
    const float* q = g.qi + k * kLanes * D;
    float* sk = g.s + k * kLanes * g.s_ld + jt;
    if (keys == kTile) {
      dot_vectors<kTileVecs, false>(q, vec.data(), kF, ld, hd, sk, g.s_ld, pf);
    } else {
      group_dot_vectors<kD>(q, vec.data(), nvec, keys - (nvec - 1) * kF, ld, hd, sk, g.s_ld, pf);
    }
  }
}

// acc += P V over head dims [d0, d0 + dims) (dims <= kTile) for every group, each over the keys its lanes see: key
// j's values (the tile's dims) at values + j * v_stride. One call a tile, as score_groups.
template <typename C>
__attribute__((noinline)) void accumulate_groups(const LaneGroups& g, int64_t d0, int64_t dims, const C* values,
                                            int64_t v_stride) {
  for (int64_t k = 0; k < g.count; ++k) {
    const int64_t lo = g.glo[k], n = g.ghi[k] - g.glo[k] + 1;
    if (n <= 0) continue;
    accumulate_tile(g.acc + k * kLanes * g.D, g.D, d0, g.s + k * kLanes * g.s_ld + lo, g.s_ld, values + lo * v_stride,
                    v_stride, n, dims);
  }
}

// ----- the bf16 path: AMX tiles (AVX512_BF16 builds on CPUs with AMX-BF16) ------------------------
// bf16 activations over a bf16 cache ("auto"), head size a multiple of 32: the keys and values in pairs
// ("VNNI"), the layout AMX's TDPBF16PS takes for its second operand (keys [D/2][keys][2]: elements 2i and 2i + 1
// of a key side by side; values [keys/2][D][2]: two keys' elements d side by side), read in place from a cache
// kept in pairs (paired_layout, attention.h) or else copied once per task into packed buffers; 16 query lanes at
// a time: scores = Q K (16 lanes x 32 keys a call, over D),
// then, after the online-softmax update, acc += P V (16 lanes x 32 head dims a call, over the keys). Products
// of bf16 are exact and summed in fp32; the query is not scaled (the scale multiplies the scores) and the
// probabilities are rounded to bf16 (their sum is of the unrounded values, exp_bf16_step says why). vdpbf16ps
// (AVX512_BF16 without AMX) was tried in place of the widening FMAs and was slower on the
// development VM (csrc/README.md).
#if defined(REFERENCE_CPU_ATTENTION_AMX)

// Whether AMX-BF16 is there and Linux lets this process use the tile registers (arch_prctl); read once.
// REFERENCE_CPU_NO_AMX=1 turns the path off (A/B measurements; the bf16 rows then widen to fp32 as AVX2 does).
inline bool amx_usable() {
  static const bool ok = [] {
    const char* off = std::getenv("REFERENCE_CPU_NO_AMX");
    if (off != nullptr && off[0] != '\0' && off[0] != '0') return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 22)) || !(d & (1u << 24))) return false;  // AMX-BF16, AMX-TILE
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// Tiles 0 and 1: fp32 results (m x 16); 2: the first operand (m rows of 32 bf16); 3 and 4: the second (16 rows
// of 32 bf16). m: the lanes a call computes, 16 (a prefill) or fewer (a decode's GQA group: a tile instruction
// costs in proportion to its rows).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile"))) inline void amx_begin(int64_t m) {
  TileConfig cfg;
  for (int t = 0; t < 5; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = t < 3 ? static_cast<uint8_t>(m) : 16;
  }
  asm volatile("" ::: "memory");
  _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile"))) inline void amx_end() { _tile_release(); }

// c[i * c_ld + n0 + n] = sum_d a[i * a_ld + d] k_{n0 + n}[d] for 16 lanes i and 32 keys n: a the lanes' bf16 query
// rows, kp the keys packed [D/2][ks][2].
__attribute__((target("amx-tile,amx-bf16"), noinline)) void amx_scores(const uint16_t* a, int64_t a_ld,
                                                                    const uint16_t* kp, int64_t ks, int64_t D,
                                                                    int64_t n0, float* c, int64_t c_ld) {
  asm volatile("" ::: "memory");
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t d = 0; d < D; d += 32) {
    const uint16_t* b = kp + ((d / 2) * ks + n0) * 2;
    _tile_loadd(2, a + d, a_ld * 2);
    _tile_loadd(3, b, ks * 4);
    _tile_loadd(4, b + 32, ks * 4);
    _tile_dpbf16ps(0, 2, 3);
    _tile_dpbf16ps(1, 2, 4);
  }
  _tile_stored(0, c + n0, c_ld * 4);
  _tile_stored(1, c + n0 + 16, c_ld * 4);
  asm volatile("" ::: "memory");
}

// acc[i * D + d0 + d] += sum_{j < nk} p[i * p_ld + j] v_j[d0 + d] for 16 lanes i and 32 head dims d: p the
// lanes' bf16 probabilities (nk a multiple of 32), vp the values packed [nk / 2][D][2].
__attribute__((target("amx-tile,amx-bf16"), noinline)) void amx_values(float* acc, int64_t D, int64_t d0,
                                                                    const uint16_t* p, int64_t p_ld,
                                                                    const uint16_t* vp, int64_t nk) {
  asm volatile("" ::: "memory");
  _tile_loadd(0, acc + d0, D * 4);
  _tile_loadd(1, acc + d0 + 16, D * 4);
  for (int64_t k = 0; k < nk; k += 32) {
    const uint16_t* b = vp + ((k / 2) * D + d0) * 2;
    _tile_loadd(2, p + k, p_ld * 2);
    _tile_loadd(3, b, D * 4);
    _tile_loadd(4, b + 32, D * 4);
    _tile_dpbf16ps(0, 2, 3);
    _tile_dpbf16ps(1, 2, 4);
  }
  _tile_stored(0, acc + d0, D * 4);
  _tile_stored(1, acc + d0 + 16, D * 4);
  asm volatile("" ::: "memory");
}

// out[2 i] = x[i], out[2 i + 1] = y[i] for i < n (two rows of 16-bit elements interleaved)
alignas(64) inline const uint16_t kInterleave[2][32] = {
    {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39, 8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47},
    {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
     24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63}};

inline void interleave_rows(const uint16_t* x, const uint16_t* y, uint16_t* out, int64_t n) {
  const __m512i lo = _mm512_load_si512(kInterleave[0]), hi = _mm512_load_si512(kInterleave[1]);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i a = _mm512_loadu_si512(x + i), b = _mm512_loadu_si512(y + i);
    _mm512_storeu_si512(out + 2 * i, _mm512_permutex2var_epi16(a, lo, b));
    _mm512_storeu_si512(out + 2 * i + 32, _mm512_permutex2var_epi16(a, hi, b));
  }
  if (i < n) {
    const int64_t r = n - i;
    const __mmask32 m = r >= 32 ? ~__mmask32{0} : (__mmask32{1} << r) - 1;
    const __m512i a = _mm512_maskz_loadu_epi16(m, x + i), b = _mm512_maskz_loadu_epi16(m, y + i);
    const __mmask32 m0 = 2 * r >= 32 ? ~__mmask32{0} : (__mmask32{1} << (2 * r)) - 1;
    const __mmask32 m1 = 2 * r <= 32 ? 0 : (__mmask32{1} << (2 * r - 32)) - 1;
    _mm512_mask_storeu_epi16(out + 2 * i, m0, _mm512_permutex2var_epi16(a, lo, b));
    if (m1) _mm512_mask_storeu_epi16(out + 2 * i + 32, m1, _mm512_permutex2var_epi16(a, hi, b));
  }
}

#endif

// An allocator whose vectors leave their elements uninitialised: scratch that every task writes before it reads
// it, where zeroing it on each call cost a small decode a tenth of its time.
template <typename E>
struct DefaultInit : std::allocator<E> {
  template <typename U>
  struct rebind {
    using other = DefaultInit<U>;
  };
  using std::allocator<E>::allocator;
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
};
template <typename E>
using UninitVec = std::vector<E, DefaultInit<E>>;

// A task's AMX scratch (the bf16 path): the query rows, the packed keys and values of a span (ks keys, a
// multiple of 32), the scores and the bf16 probabilities (ks apart), and per 16-lane block the keys it sees.
// qa, pa, vtail and sa are written before they are read (the padding query rows per task, every probability row
// a tile reads up to the 32-key step, the last step's values whole, the scores by the tiles), so not zeroed.
struct AmxScratch {
  UninitVec<uint16_t> qa, pa, vtail;
  std::vector<uint16_t> kp, vp;
  UninitVec<float> sa;
  std::vector<int64_t> blo, bhi;
  int64_t ks = 0;
  int64_t rows = 0;  // the rows of the tile configuration loaded (0: none)
};

// Whether a cache's blocks are kept in pairs for the AMX tiles (attention.h): bf16 "auto" caches whose head and
// block sizes are multiples of 32, on a CPU where the AMX path runs. The writer and every reader ask this.
inline bool paired_layout(const PagedCache& c, bool bf16) {
#if defined(REFERENCE_CPU_ATTENTION_AMX)
  return bf16 && c.format == KvFormat::kAuto && c.head_size % 32 == 0 && c.block_size % 32 == 0 && amx_usable();
#else
  (void)c;
  (void)bf16;
  return false;
#endif
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

#if defined(REFERENCE_CPU_ATTENTION_AMX)
// The scores s[j] (j < 16, the lanes of mask k) to bf16 probabilities dst[j] = bf16(2^(s[j] l2e - mv)), their fp32
// values added to sum (lanes past k add exp(-inf) = 0). mv is the running max (times l2e), so the exponent is at most
// a rounding above 0 and only its lower clamp is needed (it keeps a NaN: vmaxps returns its second operand). The
// polynomial is of degree 3: its relative error (7e-5) is a 27th of the bf16 rounding that follows (half an ulp,
// 2^-9). The sum is of the unrounded values, as vLLM's kernel sums them: a row's rounded weights then add up to one
// within that rounding. Degree 5, both clamps and a sum of the rounded values cost the bf16 prefill 8-10% of its time.
REFERENCE_CPU_INLINE void exp_bf16_step(const float* s, uint16_t* dst, __mmask16 k, const fVec& l2e, const fVec& mv,
                                        __m512& sum) {
  const __m512 x = _mm512_mask_loadu_ps(_mm512_set1_ps(kNegInf), k, s);
  const __m512 e = fast_exp2<3, false>(_mm512_fmsub_ps(x, l2e, mv));
  _mm256_mask_storeu_epi16(dst, k, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
  sum = _mm512_add_ps(sum, e);
}

inline __mmask16 tail_mask(int64_t left) {
  return left >= kF ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// dst[j] = bf16(exp(xs s[j] - m)) for n scores (the AMX path's probabilities); returns the sum of the rounded
// values.
inline float exp_to_bf16(const float* s, int64_t n, float m, uint16_t* dst, float xs) {
  const fVec mv(m * kLog2e), l2e(kLog2e * xs);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += kF) exp_bf16_step(s + j, dst + j, tail_mask(n - j), l2e, mv, sum);
  return _mm512_reduce_add_ps(sum);
}
#endif

// max(a, b) of the x86 instruction: b where either is NaN
inline fVec plain_max(const fVec& a, const fVec& b) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_max_ps(a, b);
#elif defined(CPU_CAPABILITY_AVX2)
  return _mm256_max_ps(a, b);
#else
  return fVec::blendv(b, a, a > b);
#endif
}

// A lane's running max after a block of n scores sc whose max is block_max (NaN where a score is, or with the NaN
// scores passed over). std::max keeps the old max over a NaN, so a lane whose scores so far are all -inf or NaN
// (a NaN query element makes every score of its row NaN) stayed at -inf, was taken for one that sees no key and
// wrote zeros. It gets NaN instead, and so does its output, as the softmax of a NaN score is; where the block has
// other scores, a NaN score's exponential is NaN (fast_exp2), which does the same.
inline float next_max(float m_old, float block_max, const float* sc, int64_t n) {
  const float m_new = std::max(m_old, block_max);
  if (m_new != kNegInf) return m_new;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isnan(sc[j])) return sc[j];
  }
  return m_new;
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

// Query lanes (rows x GQA group) of a task from which a block is copied (widened) into L1-sized tiles once
// for all of them; fewer lanes (a decode) read the block in place.
constexpr int64_t kTileLanes = 8;

// Keys a tiled task scores per softmax update: blocks smaller than half of it are gathered, several
// blocks' keys and values into the same tiles. One 16-token block at a time, every block repeated the
// softmax bookkeeping and every query broadcast of the scores for 16 keys.
constexpr int64_t kSpanKeys = 128;

struct Task {
  int64_t seq, kv_head, row0, row1;  // rows relative to the request's first query row
};

// This CPU's L1 data cache in bytes, as the C library reads it from CPUID (0 where it does not say). Read once.
inline long l1_data_cache_bytes() {
  static const long bytes = [] {
#if defined(__linux__) && defined(_SC_LEVEL1_DCACHE_SIZE)
    return std::max<long>(0, sysconf(_SC_LEVEL1_DCACHE_SIZE));
#else
    return 0L;
#endif
  }();
  return bytes;
}

// Whether a task of many lanes (a prefill) reads an fp32 cache's blocks in place rather than copying them into
// key and value tiles: in AVX-512 builds where the decode's software prefetch is on (AMD) and the L1 data cache is
// under 48 KB, for blocks of kSpanKeys keys or more (smaller ones are gathered into tiles). Read in place, a 64-key
// tile's rows lie a block row (512 bytes at N = 128) apart and fill half of L1's sets; copied, a 32 KB tile (D =
// 128) stays in an L1 of 48 KB beside the queries and scores, not in one of 32 KB. Measured, fp32 512-on-1024
// prefill: on a Zen 4 EPYC (32 KB L1) in place ran 1.3-1.6% faster (1 and 2 threads); on a Zen 5 EPYC (48 KB) 3-6%
// slower (one thread). The AVX2 build on the Zen 4 ran 7% slower in place, and an Intel CPU (no software prefetch,
// 48 KB L1 on recent Xeons) was not measured in place: both keep the tiles. REFERENCE_CPU_PREFILL_TILES=1 or 0
// forces the tiles or (where the build and cache allow) reading in place (A/B measurements, and the tests run both
// paths on any machine): read on every call, the machine's choice once.
template <typename T>
bool reads_fp32_blocks_in_place(const PagedCache& cache) {
#if defined(CPU_CAPABILITY_AVX512)
  static const bool machine_in_place = [] {
    const long l1 = l1_data_cache_bytes();
    return software_prefetch() && (l1 == 0 || l1 < 48 * 1024);
  }();
  const char* forced = std::getenv("REFERENCE_CPU_PREFILL_TILES");
  const bool in_place = forced != nullptr && forced[0] != '\0' ? forced[0] == '0' : machine_in_place;
  return in_place && std::is_same_v<T, float> && cache.format == KvFormat::kAuto && cache.block_size >= kSpanKeys;
#else
  (void)cache;
  return false;
#endif
}

template <typename T, int kD>
struct ForwardTask {
  const HeadRows<T>& out;
  const HeadRows<const T>& query;
  const PagedCache& cache;
  const PagedBatch& batch;
  const AttentionFeatures& f;
  int64_t group;
  // scratch, reused across the tasks of one thread
  UninitVec<float>& acc;
  UninitVec<float>& kbuf;
  UninitVec<float>& vbuf;
  UninitVec<float>& kt;
  UninitVec<float>& s;
  std::vector<float>& m;
  std::vector<float>& l_sum;
  UninitVec<float>& qi;   // queries of each lane group interleaved
  UninitVec<float>& vt;   // a block's values as head-dim tiles (prefill)
  std::vector<int64_t>& ra;
  std::vector<int64_t>& re;
  std::vector<int64_t>& glo;  // per lane group: the block's keys some lane of it sees
  std::vector<int64_t>& ghi;
  AmxScratch& amx;

#if defined(REFERENCE_CPU_ATTENTION_AMX)
  static constexpr bool kAmx = std::is_same_v<T, c10::BFloat16>;
#else
  static constexpr bool kAmx = false;
#endif

  // Whether a task of `lanes` query lanes takes the bf16 path (AMX): bf16 over a bf16 ("auto") cache, a head size a
  // multiple of 32, AMX usable here, and a task of kTileLanes lanes or more (a prefill) or a cache kept in pairs (a
  // decode reads its blocks in place, and packing them for the tiles cost it more than the tiles saved). The task
  // and forward_impl, which sizes the scratch, ask this one place.
  static bool takes_amx(const PagedCache& c, int64_t lanes) {
#if defined(REFERENCE_CPU_ATTENTION_AMX)
    return kAmx && c.format == KvFormat::kAuto && c.head_size % 32 == 0 && amx_usable() &&
           (lanes >= kTileLanes || paired_layout(c, true));
#else
    (void)c;
    (void)lanes;
    return false;
#endif
  }

  // Whether a task of `lanes` query lanes copies its blocks into key and value tiles: a prefill's lanes, unless it
  // reads fp32 blocks in place (reads_fp32_blocks_in_place). The task and forward_impl, which sizes the tiles, ask
  // this one place.
  static bool takes_tiles(const PagedCache& c, int64_t lanes) {
    return lanes >= kTileLanes && !reads_fp32_blocks_in_place<T>(c);
  }

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
    bool tiled;
    bool amx;  // the bf16 path (AMX): the queries in amx.qa, not in qi
  };

  // Lane idx's online-softmax update over n scores sc of head h (the first key `dist0` positions before the
  // query): soft cap / ALiBi, the running max and sum, acc rescaled when the max moves; the scores become
  // probabilities in place. False: every logit so far is -inf, nothing to add (sc is left as it is).
  // bf16_out: the probabilities rounded to bf16 there instead (the AMX path; their sum is of the unrounded values).
  // raw_scale (the AMX path without soft cap or ALiBi, > 0): the scores are still to be multiplied by it, which the
  // max and the exponent do (a positive factor keeps the max where it is).
  bool softmax_update(int64_t idx, float* sc, int64_t n, int64_t h, int64_t dist0, uint16_t* bf16_out = nullptr,
                      float raw_scale = 1.f) {
    const float m_old = m[idx];
    const float m_new = next_max(m_old, adjust_scores(sc, n, h, dist0) * raw_scale, sc, n);
    if (m_new == kNegInf) return false;
#if defined(REFERENCE_CPU_ATTENTION_AMX)
    const float psum = bf16_out ? exp_to_bf16(sc, n, m_new, bf16_out, raw_scale) : exp_shifted(sc, n, m_new);
#else
    const float psum = exp_shifted(sc, n, m_new);
#endif
    fold_update(idx, m_old, m_new, psum);
    return true;
  }

  // Whether lanes idx .. idx + count - 1 (idx a multiple of count, all below `lanes`) see the same, non-empty key
  // range (ra / re of their rows, `group` lanes a row).
  bool same_keys(int64_t idx, int64_t count, int64_t lanes) const {
    if (idx % count != 0 || idx + count > lanes) return false;
    const int64_t r0 = idx / group;
    if (ra[r0] > re[r0]) return false;
    for (int64_t l = 1; l < count; ++l) {
      const int64_t r = (idx + l) / group;
      if (ra[r] != ra[r0] || re[r] != re[r0]) return false;
    }
    return true;
  }

  // A lane's row of len probabilities after its update: zero outside [off, off + n), its keys; all zero where the
  // update added nothing (`updated` false: every logit so far -inf, or a lane that sees none of the keys).
  template <typename P>
  static void zero_unseen(P* row, int64_t off, int64_t n, int64_t len, bool updated) {
    if (!updated) {
      std::fill(row, row + len, P{0});
      return;
    }
    std::fill(row, row + off, P{0});
    std::fill(row + off + n, row + len, P{0});
  }

  // Lane idx's running max and sum after an update whose probabilities (relative to m_new) sum to psum; its
  // accumulator rescaled where the max moved (it rarely does after the first blocks: no exp then).
  void fold_update(int64_t idx, float m_old, float m_new, float psum) {
    const int64_t D = cache.head_size;
    const float alpha = m_old == kNegInf ? 0.f : m_old == m_new ? 1.f : std::exp(m_old - m_new);
    l_sum[idx] = l_sum[idx] * alpha + psum;
    m[idx] = m_new;
    if (alpha != 1.f) {
      float* ac = acc.data() + idx * D;
      const fVec al(alpha);
      int64_t d = 0;
      for (; d + kF <= D; d += kF) (fVec::loadu(ac + d) * al).store(ac + d);
      for (; d < D; ++d) ac[d] *= alpha;
    }
  }

  // Four lanes idx0 .. idx0 + 3 through one block (the four-lane updates below): their running maxima before and
  // after it, the sums of their probabilities, and a bit per lane set where its new max is not -inf (it is updated).
  struct FourLanes {
    float m_old[4], m_new[4], total[4];
    unsigned live = 0;
  };

  // The four lanes' maxima after a block whose (scaled) maxima are block_max, their n scores rows ld apart from
  // sc0 (next_max: NaN where a lane's scores are all NaN).
  FourLanes four_lane_maxima(int64_t idx0, const float* block_max, const float* sc0, int64_t n, int64_t ld) const {
    FourLanes lanes4;
    for (int l = 0; l < 4; ++l) {
      lanes4.m_old[l] = m[idx0 + l];
      lanes4.m_new[l] = next_max(lanes4.m_old[l], block_max[l], sc0 + l * ld, n);
      if (lanes4.m_new[l] != kNegInf) lanes4.live |= 1u << l;
    }
    return lanes4;
  }

  // fold_update of the updated ones of the four lanes
  void fold_four(int64_t idx0, const FourLanes& lanes4) {
    for (int l = 0; l < 4; ++l) {
      if (lanes4.live >> l & 1u) fold_update(idx0 + l, lanes4.m_old[l], lanes4.m_new[l], lanes4.total[l]);
    }
  }

  // softmax_update of four lanes idx0 .. idx0 + 3 at once, each over the same n scores (rows ld apart from sc0;
  // no soft cap or ALiBi), which become their probabilities in place: the same arithmetic as lane by lane
  // (adjust_scores' max, exp_shifted), the lanes' dependency chains side by side. Their maxima and sums are named
  // registers, not arrays of four, which GCC kept on the stack (as in softmax_update_lanes_bf16): the fp32
  // 512-on-1024 prefill 1.5-2.5% faster (Zen 4 EPYC, AVX-512 and AVX2 builds, 1 and 2 threads, paired rounds).
  // A bit per lane: set where it was updated, clear where every logit so far is -inf (its scores left as they are).
  unsigned softmax_update_lanes(int64_t idx0, float* sc0, int64_t n, int64_t ld) {
    float* x0 = sc0;
    float* x1 = sc0 + ld;
    float* x2 = sc0 + 2 * ld;
    float* x3 = sc0 + 3 * ld;
    const int64_t nv = n / kF * kF;  // the whole vectors; the rest one by one
    // The block max leaves NaN scores out (the x86 max returns its second operand, the running max, where either
    // is NaN), as lane by lane does (std::max drops a NaN block max); a NaN score's exponential is NaN, and a lane
    // whose scores are all NaN gets a NaN max (next_max).
    fVec mx0(kNegInf), mx1(kNegInf), mx2(kNegInf), mx3(kNegInf);
    for (int64_t j = 0; j < nv; j += kF) {
      mx0 = plain_max(fVec::loadu(x0 + j), mx0);
      mx1 = plain_max(fVec::loadu(x1 + j), mx1);
      mx2 = plain_max(fVec::loadu(x2 + j), mx2);
      mx3 = plain_max(fVec::loadu(x3 + j), mx3);
    }
    float bm[4] = {reduce_max(mx0), reduce_max(mx1), reduce_max(mx2), reduce_max(mx3)};
    for (int l = 0; l < 4; ++l) {
      for (int64_t j = nv; j < n; ++j) bm[l] = std::max(bm[l], sc0[l * ld + j]);
    }
    FourLanes update = four_lane_maxima(idx0, bm, sc0, n, ld);
    const float* m_new = update.m_new;
    float* total = update.total;
    if (update.live == 0) return 0;
    if (update.live == 0xFu) {
      const fVec l2e(kLog2e);
      const fVec mv0(m_new[0] * kLog2e), mv1(m_new[1] * kLog2e), mv2(m_new[2] * kLog2e), mv3(m_new[3] * kLog2e);
      fVec s0(0.f), s1(0.f), s2(0.f), s3(0.f);
      for (int64_t j = 0; j < nv; j += kF) {
        const fVec e0 = fast_exp2<5>(at::vec::fmsub(fVec::loadu(x0 + j), l2e, mv0));
        const fVec e1 = fast_exp2<5>(at::vec::fmsub(fVec::loadu(x1 + j), l2e, mv1));
        const fVec e2 = fast_exp2<5>(at::vec::fmsub(fVec::loadu(x2 + j), l2e, mv2));
        const fVec e3 = fast_exp2<5>(at::vec::fmsub(fVec::loadu(x3 + j), l2e, mv3));
        e0.store(x0 + j);
        e1.store(x1 + j);
        e2.store(x2 + j);
        e3.store(x3 + j);
        s0 = s0 + e0;
        s1 = s1 + e1;
        s2 = s2 + e2;
        s3 = s3 + e3;
      }
      total[0] = hsum(s0);
      total[1] = hsum(s1);
      total[2] = hsum(s2);
      total[3] = hsum(s3);
      for (int l = 0; l < 4; ++l) {
        float* x = sc0 + l * ld;
        for (int64_t j = nv; j < n; ++j) {
          x[j] = std::exp(x[j] - m_new[l]);
          total[l] += x[j];
        }
      }
    } else {  // a lane whose logits so far are all -inf (a window, a sink): the live ones one at a time
      for (int l = 0; l < 4; ++l) {
        if (update.live >> l & 1u) total[l] = exp_shifted(sc0 + l * ld, n, m_new[l]);
      }
    }
    fold_four(idx0, update);
    return update.live;
  }

#if defined(REFERENCE_CPU_ATTENTION_AMX)
  // softmax_update of four lanes idx0 .. idx0 + 3 at once, each over n unscaled scores (rows ld apart from sc0;
  // no soft cap or ALiBi, scale > 0), their bf16 probabilities into pr0 (rows ld apart): the same arithmetic, with
  // the four lanes' dependency chains (the max, the exponentials' sum, their reductions) side by side. Lane by
  // lane, a bf16 prefill's softmax waited on them: 20 of the 34 ms of the 512-on-1024 prefill, one thread. A bit
  // per lane: set where it was updated, clear where every logit so far is -inf (its probabilities not written).
  unsigned softmax_update_lanes_bf16(int64_t idx0, const float* sc0, int64_t n, int64_t ld, uint16_t* pr0, float scale) {
    // Four named rows and accumulators, not arrays of four: GCC kept the arrays on the stack (every max and add a
    // store and a reload) even with the lane loops unrolled.
    const float* x0 = sc0;
    const float* x1 = sc0 + ld;
    const float* x2 = sc0 + 2 * ld;
    const float* x3 = sc0 + 3 * ld;
    uint16_t* p0 = pr0;
    uint16_t* p1 = pr0 + ld;
    uint16_t* p2 = pr0 + 2 * ld;
    uint16_t* p3 = pr0 + 3 * ld;
    // The block max leaves NaN scores out (vmaxps keeps its second operand, the running max, where either is NaN),
    // as lane by lane does (std::max drops a NaN block max); a NaN score's exponential is NaN (exp_bf16_step's clamp
    // keeps it), and a lane whose scores are all NaN gets a NaN max (next_max): its output is NaN either way.
    const __m512 ninf = _mm512_set1_ps(kNegInf);
    __m512 mx0 = ninf, mx1 = ninf, mx2 = ninf, mx3 = ninf;
    for (int64_t j = 0; j < n; j += kF) {
      const __mmask16 k = tail_mask(n - j);
      mx0 = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, k, x0 + j), mx0);
      mx1 = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, k, x1 + j), mx1);
      mx2 = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, k, x2 + j), mx2);
      mx3 = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, k, x3 + j), mx3);
    }
    const float block_max[4] = {_mm512_reduce_max_ps(mx0) * scale, _mm512_reduce_max_ps(mx1) * scale,
                                _mm512_reduce_max_ps(mx2) * scale, _mm512_reduce_max_ps(mx3) * scale};
    FourLanes update = four_lane_maxima(idx0, block_max, sc0, n, ld);
    const float* m_new = update.m_new;
    float* total = update.total;
    if (update.live == 0) return 0;
    if (update.live == 0xFu) {  // the usual case: the four lanes' exponentials interleaved
      const fVec l2e(kLog2e * scale);
      const fVec mv0(m_new[0] * kLog2e), mv1(m_new[1] * kLog2e), mv2(m_new[2] * kLog2e), mv3(m_new[3] * kLog2e);
      __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      const auto four = [&](int64_t j, __mmask16 k) {
        exp_bf16_step(x0 + j, p0 + j, k, l2e, mv0, s0);
        exp_bf16_step(x1 + j, p1 + j, k, l2e, mv1, s1);
        exp_bf16_step(x2 + j, p2 + j, k, l2e, mv2, s2);
        exp_bf16_step(x3 + j, p3 + j, k, l2e, mv3, s3);
      };
      int64_t j = 0;
      for (; j + kF <= n; j += kF) four(j, 0xFFFF);   // whole vectors: plain loads (a constant mask)
      if (j < n) four(j, tail_mask(n - j));
      total[0] = _mm512_reduce_add_ps(s0);
      total[1] = _mm512_reduce_add_ps(s1);
      total[2] = _mm512_reduce_add_ps(s2);
      total[3] = _mm512_reduce_add_ps(s3);
    } else {  // a lane whose logits so far are all -inf (a window, a sink): the live ones one at a time
      for (int l = 0; l < 4; ++l) {
        if (update.live >> l & 1u) total[l] = exp_to_bf16(sc0 + l * ld, n, m_new[l], pr0 + l * ld, scale);
      }
    }
    fold_four(idx0, update);
    return update.live;
  }
#endif

  // One query row (a decode) over the blocks [lb0, lb1] of a cache whose blocks are smaller than a key tile
  // (kTile / N blocks): their keys are scored together, a vector of keys from each block, so one broadcast of
  // a query element serves a whole tile. Block by block, a 16-token block is one vector of keys and repeated
  // every broadcast for it: 1.6x slower than the key-row layout at fp32 b=8.
  void attend_blocks_one_row(const TaskState& st, const int32_t* table, int64_t lb0, int64_t lb1, int64_t lo,
                             int64_t hi) {
    const HeadDim<kD> hd{cache.head_size};
    const int64_t D = hd.size(), N = cache.block_size, G = group, s_ld = kTile + kF;
    const int64_t padded_lanes = st.padded_lanes, groups = padded_lanes / kLanes;
    const int64_t j0 = lb0 * N, jend = std::min(hi, (lb1 + 1) * N - 1), ja = std::max(j0, lo);
    const int64_t pos = st.context + st.t.row0;
    const T* data = static_cast<const T*>(cache.data);
    const auto base = [&](int64_t lb) {
      return data + table[lb] * cache.stride_block + st.t.kv_head * cache.stride_head;
    };
    // 1. scores of keys [j0, jend] (keys before ja, out of a window, are scored and left out)
    const int64_t keys = jend - j0 + 1, nvec = (keys + kF - 1) / kF;
    std::array<const T*, kTileVecs> vec;
    for (int64_t v = 0; v < nvec; ++v) vec[v] = base(lb0 + v * kF / N) + (v * kF) % N;
    for (int64_t k = 0; k < groups; ++k) {
      group_dot_vectors<kD>(qi.data() + k * kLanes * D, vec.data(), nvec, keys - (nvec - 1) * kF, N, hd,
                            s.data() + k * kLanes * s_ld, s_ld);
    }
    // 2. the online-softmax update over [ja, jend]
    const int64_t off = ja - j0, n = jend - ja + 1;
    for (int64_t idx = 0; idx < padded_lanes; ++idx) {
      float* sc = s.data() + idx * s_ld;
      if (idx >= st.lanes || !softmax_update(idx, sc + off, n, st.t.kv_head * G + idx % G, pos - ja)) {
        std::fill(sc + off, sc + off + n, 0.f);
      }
    }
    // 3. acc += P V, block by block
    for (int64_t lb = lb0; lb <= lb1; ++lb) {
      const int64_t ka = std::max(ja, lb * N), kb = std::min(jend, lb * N + N - 1);
      if (ka > kb) continue;
      const T* vb = base(lb) + N * D + (ka - lb * N) * D;
      for (int64_t d0 = 0; d0 < D; d0 += kTile) {
        const int64_t dims = std::min<int64_t>(kTile, D - d0);
        for (int64_t k = 0; k < groups; ++k) {
          group_accumulate_tile(acc.data() + k * kLanes * D, D, d0, s.data() + k * kLanes * s_ld + (ka - j0), s_ld,
                                vb + d0, D, kb - ka + 1, dims);
        }
      }
    }
  }

  // Keys [ka, kb] of one block whose first key is j0 (keys transposed at kt_block: key j's element d at
  // kt_block[d * N + (j - j0)]; values as rows at vb + (j - j0) * D; C = float or the model's 16-bit type),
  // widened into the tiles at key position p0 of a span of `span_keys` keys: the keys as key tiles [D, kTile]
  // one after another (kt), the values as head-dim tiles [span_keys, kTile] (vt). Each tile is contiguous, so
  // it stays in L1 while every lane group passes over it. Read in place, rows kTile * 4 bytes long and N
  // (keys) or D (values) elements apart map onto few L1 sets, and a 32 KB tile was re-read from L2 by every
  // group.
  template <typename C>
  void tile_keys(const C* kt_block, const C* vb, int64_t j0, int64_t ka, int64_t kb, int64_t p0,
                 int64_t span_keys) {
    const int64_t D = cache.head_size, N = cache.block_size, nk = kb - ka + 1;
    const C* keys = kt_block + (ka - j0);
    for (int64_t j = 0; j < nk;) {  // a run of keys within one key tile
      const int64_t p = p0 + j, col = p % kTile, nt = std::min(kTile - col, nk - j);
      float* tile = kt.data() + (p - col) * D + col;
      for (int64_t d = 0; d < D; ++d) tile_row_to_float(keys + d * N + j, tile + d * kTile, nt);
      j += nt;
    }
    for (int64_t j = 0; j < nk; ++j) {
      const C* vrow = vb + (ka - j0 + j) * D;
      for (int64_t d0 = 0; d0 < D; d0 += kTile) {
        tile_row_to_float(vrow + d0, vt.data() + d0 * span_keys + (p0 + j) * kTile, std::min<int64_t>(kTile, D - d0));
      }
    }
  }

  // Keys [ja, jb] of a span whose first key is j0, for every lane of the task: scores, the online-softmax
  // update and the values. A tiled task reads the span from the tiles (tile_keys filled them; span_keys is
  // their capacity); an untiled one reads one block in place (span_keys = N; keys transposed at kt_block,
  // values as rows at vb, as in tile_keys).
  // `next`: the next block's keys and values (next_bytes, contiguous), prefetched when read in place.
  template <typename C>
  void attend_block(const TaskState& st, const C* kt_block, const C* vb, int64_t j0, int64_t ja, int64_t jb,
                    int64_t span_keys, const void* next = nullptr, int64_t next_bytes = 0) {
    const HeadDim<kD> hd{cache.head_size};
    const int64_t D = hd.size(), N = cache.block_size, G = group;
    const Task& t = st.t;
    const int64_t rows = st.rows, lanes = st.lanes, padded_lanes = st.padded_lanes, context = st.context;
    const int64_t seq_len = st.seq_len;
    const bool tiled = st.tiled;
    const int64_t nb = jb - ja + 1, s_ld = span_keys + kF;
    const C* kb = tiled ? nullptr : kt_block + (ja - j0);  // column 0: key ja
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
    // Read in place, what the task reads after these keys is prefetched while they are scored: this block's
    // values over the first half of the key tiles, then the next block's keys (its values come with the next
    // block's scores); with one key tile, or fp8 values decoded already, the next block whole.
    const int64_t tiles = (nb + kTile - 1) / kTile;
    const int64_t first = !tiled && cache.format == KvFormat::kAuto && tiles > 1 ? (tiles + 1) / 2 : 0;
    const Prefetch values_ahead =
        first ? prefetch_over(vb + (ja - j0) * D, nb * D * sizeof(C), first * D) : Prefetch{};
    const Prefetch next_ahead = prefetch_over(next, first ? next_bytes / 2 : next_bytes, (tiles - first) * D);
    // 1. scores of every lane over the block's keys [ja, jb]: key tiles outer, so a tile stays in L1 while
    //    every lane group passes over it
    const LaneGroups groups{qi.data(), s.data(), acc.data(), s_ld, D, padded_lanes / kLanes, glo.data(), ghi.data()};
    for (int64_t jt = 0; jt < nb; jt += kTile) {
      const int64_t nt = std::min<int64_t>(kTile, nb - jt);
      if (tiled) {
        score_groups<kD>(groups, kt.data() + jt * D, kTile, jt, nt, hd, Prefetch{});
      } else {
        score_groups<kD>(groups, kb + jt, N, jt, nt, hd,
                         jt / kTile < first ? values_ahead.after(jt / kTile * D)
                                            : next_ahead.after((jt / kTile - first) * D));
      }
    }
    // 2. per lane: soft cap / ALiBi, the online-softmax update (acc rescaled); its scores become its
    //    probabilities in place (zero for the block's keys the lane does not see). Without soft cap and ALiBi,
    //    four lanes that see the same keys (a GQA group's lanes share their row) update together.
    const bool plain = f.logits_soft_cap <= 0.f && f.alibi_slopes == nullptr;
    for (int64_t idx = 0; idx < padded_lanes; ++idx) {
      const int64_t r = idx / G;
      float* sc = s.data() + idx * s_ld;
      if (plain && same_keys(idx, 4, lanes)) {
        const int64_t off = ra[r] - ja, n = re[r] - ra[r] + 1;
        const unsigned live = softmax_update_lanes(idx, sc + off, n, s_ld);
        for (int64_t l = 0; l < 4; ++l) zero_unseen(sc + l * s_ld, off, n, nb, live >> l & 1u);
        idx += 3;
        continue;
      }
      if (idx >= lanes || ra[r] > re[r]) {
        zero_unseen(sc, 0, 0, nb, false);
        continue;
      }
      const int64_t off = ra[r] - ja, n = re[r] - ra[r] + 1, pos = context + t.row0 + r;
      zero_unseen(sc, off, n, nb, softmax_update(idx, sc + off, n, t.kv_head * G + idx % G, pos - ra[r]));
    }
    // 3. acc += P V: head-dim tiles outer, so a tile of the block's values stays in L1 across groups
    for (int64_t d0 = 0; d0 < D; d0 += kTile) {
      const int64_t dims = std::min<int64_t>(kTile, D - d0);
      if (tiled) {
        accumulate_groups(groups, d0, dims, vt.data() + d0 * span_keys, kTile);
      } else {
        accumulate_groups(groups, d0, dims, vb + (ja - j0) * D + d0, D);
      }
    }
  }

#if defined(REFERENCE_CPU_ATTENTION_AMX)
  // Keys [ka, kb] of a block whose first key is j0 (its 16-bit keys transposed and values as rows, as in
  // tile_keys) into the packed buffers at span position p0.
  void pack_amx(const uint16_t* keys, const uint16_t* values, int64_t j0, int64_t ka, int64_t kb, int64_t p0) {
    const int64_t D = cache.head_size, N = cache.block_size, ks = amx.ks, nk = kb - ka + 1;
    uint16_t* kp = amx.kp.data();
    uint16_t* vp = amx.vp.data();
    const uint16_t* kc = keys + (ka - j0);
    for (int64_t i = 0; i < D / 2; ++i) interleave_rows(kc + 2 * i * N, kc + (2 * i + 1) * N, kp + (i * ks + p0) * 2, nk);
    const uint16_t* vr = values + (ka - j0) * D;
    const auto one = [&](int64_t j) {  // a key without its pair partner in this block
      const int64_t p = p0 + j;
      uint16_t* o = vp + (p / 2) * D * 2 + p % 2;
      for (int64_t d = 0; d < D; ++d) o[2 * d] = vr[j * D + d];
    };
    int64_t j = 0;
    if (p0 % 2) one(j++);
    for (; j + 1 < nk; j += 2) interleave_rows(vr + j * D, vr + (j + 1) * D, vp + ((p0 + j) / 2) * D * 2, D);
    if (j < nk) one(j);
  }

  // Keys [ja, jb] for every lane of the task: scores, the online-softmax update, the values. Key j is at position
  // j - base of kp (keys [D/2][k_ld][2]) and vp (values [*][D][2], pairs of positions). `zeroed`: vp holds zeros
  // past position jb - base up to the next multiple of 32 (the packed span); else (a block read in place, whose
  // slots past the sequence may hold anything) that last 32-key step of values is copied, zeros past jb, first.
  void attend_span_amx(const TaskState& st, int64_t base, int64_t ja, int64_t jb, const uint16_t* kp, int64_t k_ld,
                       const uint16_t* vp, bool zeroed) {
    const int64_t D = cache.head_size, G = group, ks = amx.ks;
    const Task& t = st.t;
    const int64_t nb = jb - base + 1, nb32 = (nb + 31) / 32 * 32, blocks = (st.lanes + 15) / 16;
    for (int64_t r = 0; r < st.rows; ++r) {
      const KeyRange range = key_range(st.context + t.row0 + r, st.seq_len, f);
      ra[r] = std::max(ja, range.lo);
      re[r] = std::min(jb, range.hi);
    }
    // 1. scores, 16 lanes x 32 keys at a time, over the keys some lane of the 16 sees
    for (int64_t b = 0; b < blocks; ++b) {
      int64_t lo = nb, hi = -1;
      for (int64_t idx = 16 * b; idx < std::min(st.lanes, 16 * b + 16); ++idx) {
        const int64_t r = idx / G;
        if (ra[r] > re[r]) continue;
        lo = std::min(lo, ra[r] - base);
        hi = std::max(hi, re[r] - base);
      }
      amx.blo[b] = lo;
      amx.bhi[b] = hi;
      for (int64_t n0 = lo / 32 * 32; n0 <= hi; n0 += 32) {
        amx_scores(amx.qa.data() + 16 * b * D, D, kp, k_ld, D, n0, amx.sa.data() + 16 * b * ks, ks);
      }
    }
    // 2. per lane: the scale, soft cap / ALiBi, the online-softmax update; its probabilities (rounded to bf16)
    //    into pa, zero for the keys it does not see. Without soft cap and ALiBi the scale goes into the update's
    //    max and exponent, and four lanes that see the same keys (a GQA group's lanes share their row) update
    //    together (softmax_update_lanes_bf16).
    const fVec scale(f.scale);
    const bool plain = f.logits_soft_cap <= 0.f && f.alibi_slopes == nullptr && f.scale > 0.f;
    // the padding lanes of the last 16 need zeros only where the tiles read them (16 rows configured)
    const int64_t tile_lanes = st.lanes < 16 ? st.lanes : blocks * 16;
    for (int64_t idx = 0; idx < tile_lanes; ++idx) {
      const int64_t b = idx / 16, r = idx / G;
      if (amx.bhi[b] < amx.blo[b]) continue;
      if (plain && same_keys(idx, 4, st.lanes)) {
        const int64_t off = ra[r] - base, n = re[r] - ra[r] + 1;
        const unsigned live = softmax_update_lanes_bf16(idx, amx.sa.data() + idx * ks + off, n, ks,
                                                        amx.pa.data() + idx * ks + off, f.scale);
        for (int64_t l = 0; l < 4; ++l) zero_unseen(amx.pa.data() + (idx + l) * ks, off, n, nb32, live >> l & 1u);
        idx += 3;
        continue;
      }
      float* sc = amx.sa.data() + idx * ks;
      uint16_t* pr = amx.pa.data() + idx * ks;
      if (idx >= st.lanes || ra[r] > re[r]) {
        zero_unseen(pr, 0, 0, nb32, false);
        continue;
      }
      const int64_t off = ra[r] - base, n = re[r] - ra[r] + 1, pos = st.context + t.row0 + r;
      float* x = sc + off;
      if (!plain) {
        int64_t j = 0;
        for (; j + kF <= n; j += kF) (fVec::loadu(x + j) * scale).store(x + j);
        for (; j < n; ++j) x[j] *= f.scale;
      }
      zero_unseen(pr, off, n, nb32,
                  softmax_update(idx, x, n, t.kv_head * G + idx % G, pos - ra[r], pr + off, plain ? f.scale : 1.f));
    }
    // the last 32-key step's values with zeros past jb, where vp does not have them
    const int64_t k_tail = zeroed || nb % 32 == 0 ? nb32 : nb32 - 32;
    if (k_tail < nb32) {
      uint16_t* o = amx.vtail.data();
      const int64_t whole = (nb - k_tail) / 2;  // pairs with both keys at or before jb
      std::copy(vp + (k_tail / 2) * D * 2, vp + (k_tail / 2 + whole) * D * 2, o);
      std::fill(o + whole * D * 2, o + 16 * D * 2, uint16_t{0});
      if (nb % 2) {  // the last key's pair: its own element, a zero for the key after it
        const uint16_t* src = vp + (k_tail / 2 + whole) * D * 2;
        for (int64_t d = 0; d < D; ++d) o[(whole * D + d) * 2] = src[d * 2];
      }
    }
    // 3. acc += P V, 16 lanes x 32 head dims at a time, over the 32-key steps some lane of the 16 sees
    for (int64_t b = 0; b < blocks; ++b) {
      if (amx.bhi[b] < amx.blo[b]) continue;
      const int64_t k0 = amx.blo[b] / 32 * 32, k1 = (amx.bhi[b] + 32) / 32 * 32;
      float* a = acc.data() + 16 * b * D;
      const uint16_t* p = amx.pa.data() + 16 * b * ks;
      for (int64_t d0 = 0; d0 < D; d0 += 32) {
        if (std::min(k1, k_tail) > k0) amx_values(a, D, d0, p + k0, ks, vp + (k0 / 2) * D * 2, std::min(k1, k_tail) - k0);
        if (k1 > k_tail) amx_values(a, D, d0, p + k_tail, ks, amx.vtail.data(), 32);
      }
    }
  }

  // A task's keys [lo, hi] through the AMX path: spans of blocks (as a tiled task gathers them) packed, then
  // attended.
  void run_amx(const TaskState& st, const int32_t* table, int64_t lo, int64_t hi) {
    const int64_t D = cache.head_size, N = cache.block_size;
    const uint16_t* data = static_cast<const uint16_t*>(cache.data);
    if (paired_layout(cache, true)) {  // the blocks are packed for the tiles already: read in place
      for (int64_t lb = lo / N; hi >= lo && lb <= hi / N; ++lb) {
        const int64_t j0 = lb * N, ja = std::max(j0, lo), jb = std::min(j0 + N - 1, hi);
        const uint16_t* base = data + table[lb] * cache.stride_block + st.t.kv_head * cache.stride_head;
        attend_span_amx(st, j0, ja, jb, base, N, base + N * D, false);
      }
      return;
    }
    const int64_t per_span = 2 * N <= kSpanKeys ? kSpanKeys / N : 1;
    for (int64_t lb0 = lo / N; hi >= lo && lb0 <= hi / N; lb0 += per_span) {
      const int64_t lb1 = std::min(lb0 + per_span - 1, hi / N);
      const int64_t ja = std::max(lb0 * N, lo), jb = std::min((lb1 + 1) * N - 1, hi);
      for (int64_t lb = lb0; lb <= lb1; ++lb) {
        const int64_t j0 = lb * N, ka = std::max(ja, j0), kb = std::min(jb, j0 + N - 1);
        const uint16_t* base = data + table[lb] * cache.stride_block + st.t.kv_head * cache.stride_head;
        pack_amx(base, base + N * D, j0, ka, kb, ka - ja);
      }
      // zeros past the span's last key up to the next 32-key step (their probabilities are zero)
      uint16_t* vp = amx.vp.data();
      const int64_t nb = jb - ja + 1, nb32 = (nb + 31) / 32 * 32;
      if (nb % 2) {
        uint16_t* o = vp + (nb / 2) * D * 2 + 1;
        for (int64_t d = 0; d < D; ++d) o[2 * d] = 0;
      }
      std::fill(vp + ((nb + 1) / 2) * D * 2, vp + (nb32 / 2) * D * 2, uint16_t{0});
      attend_span_amx(st, ja, ja, jb, amx.kp.data(), amx.ks, vp, true);
    }
  }
#endif

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
    const bool tiled = takes_tiles(cache, lanes);
    const bool use_amx = takes_amx(cache, lanes);   // the bf16 path: 16 lanes at a time
    // the rows the tiles read: a task of fewer than 16 lanes (a decode's GQA group) configures only its lanes' rows
    const int64_t amx_lanes = lanes < 16 ? lanes : (lanes + 15) / 16 * 16;
    std::fill(acc.begin(), acc.begin() + (use_amx ? amx_lanes : padded_lanes) * D, 0.f);
    if (use_amx) {
      std::fill(amx.qa.begin() + lanes * D, amx.qa.begin() + amx_lanes * D, uint16_t{0});
    }
    // a decode over blocks smaller than a key tile: kTile / N blocks at a time
    const int64_t span = !use_amx && cache.format == KvFormat::kAuto && rows == 1 && !tiled && N < kTile &&
                                 N % kF == 0
                             ? kTile / N : 0;
    for (int64_t r = 0; r < rows; ++r) {
      const T* qrow = query.data + (q_begin + t.row0 + r) * query.stride_token;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = t.kv_head * G + g, idx = r * G + g;
        if (use_amx) {  // the lane's row as it is: the scale multiplies the scores
          std::memcpy(amx.qa.data() + idx * D, qrow + h * query.stride_head, D * sizeof(T));
        }
        m[idx] = f.sinks ? f.sinks[h] : kNegInf;  // a sink is a key with logit sinks[h] and value 0
        l_sum[idx] = m[idx] == kNegInf ? 0.f : 1.f;  // e^(sink - m) with m = sink
      }
    }
    // the fp32 path's queries, scaled (s = (scale q) . k), kLanes lanes interleaved a group; zero past the lanes
    for (int64_t k = 0; !use_amx && k < padded_lanes / kLanes; ++k) {
      const T* lane_rows[kLanes];
      for (int64_t l = 0; l < kLanes; ++l) {
        const int64_t idx = k * kLanes + l, r = idx / G, h = t.kv_head * G + idx % G;
        lane_rows[l] = idx < lanes ? query.data + (q_begin + t.row0 + r) * query.stride_token + h * query.stride_head
                                   : nullptr;
      }
      interleave_queries(lane_rows, D, f.scale, qi.data() + k * kLanes * D);
    }
    const KeyRange first = key_range(context + t.row0, seq_len, f);
    const KeyRange last = key_range(context + t.row1 - 1, seq_len, f);
    const int64_t lo = first.lo, hi = last.hi;
    const TaskState st{t, rows, lanes, padded_lanes, context, seq_len, tiled, use_amx};
    const auto& tables = fp8_tables();
    const float* fp8_table = cache.format == KvFormat::kFp8E5m2 ? tables.e5m2.data() : tables.e4m3.data();

    for (int64_t lb = lo / N; span && lb <= hi / N && hi >= lo; lb += span) {
      attend_blocks_one_row(st, table, lb, std::min(lb + span - 1, hi / N), lo, hi);
    }
    // Block lb's keys transposed and values as rows: in place, or fp8 decoded (times the scales) into kbuf
    // and vbuf (the keys [ka, kb] and their values)
    const auto with_block = [&](int64_t lb, int64_t ka, int64_t kb, auto&& use) {
      const int64_t j0 = lb * N, head_off = table[lb] * cache.stride_block + t.kv_head * cache.stride_head;
      if (cache.format == KvFormat::kAuto) {  // 16-bit keys and values are widened in registers
        const T* base = static_cast<const T*>(cache.data) + head_off;
        use(base, base + N * D);
      } else {
        const uint8_t* codes = static_cast<const uint8_t*>(cache.data) + head_off;
        for (int64_t d = 0; d < D; ++d) {
          fp8_row_to_float(codes + d * N + (ka - j0), kbuf.data() + d * N + (ka - j0), kb - ka + 1, fp8_table,
                           cache.k_scale);
        }
        fp8_row_to_float(codes + N * D + (ka - j0) * D, vbuf.data() + (ka - j0) * D, (kb - ka + 1) * D, fp8_table,
                         cache.v_scale);
        use(kbuf.data(), vbuf.data());
      }
    };
    // a tiled task over blocks of at most kSpanKeys / 2 keys: kSpanKeys / N blocks' keys into the same tiles
    const int64_t per_span = st.tiled && 2 * N <= kSpanKeys ? kSpanKeys / N : 1;
    const int64_t span_keys = per_span > 1 ? kSpanKeys : N;
#if defined(REFERENCE_CPU_ATTENTION_AMX)
    if constexpr (kAmx) {
      if (use_amx) {
        const int64_t rows_cfg = std::min<int64_t>(16, lanes);
        if (amx.rows != rows_cfg) amx_begin(rows_cfg);
        amx.rows = rows_cfg;
        run_amx(st, table, lo, hi);
      }
    }
#endif
    for (int64_t lb0 = lo / N; !span && !use_amx && lb0 <= hi / N && hi >= lo; lb0 += per_span) {
      const int64_t lb1 = std::min(lb0 + per_span - 1, hi / N);
      const int64_t j0 = lb0 * N, ja = std::max(j0, lo), jb = std::min((lb1 + 1) * N - 1, hi);
      if (!st.tiled) {
        // the next block's keys and values (this head's, contiguous: 16-bit or fp32 elements, or fp8 codes)
        const int64_t elem = cache.format == KvFormat::kAuto ? sizeof(T) : 1;
        const void* next =
            lb0 + 1 > hi / N ? nullptr
                             : static_cast<const char*>(cache.data) +
                                   (table[lb0 + 1] * cache.stride_block + t.kv_head * cache.stride_head) * elem;
        with_block(lb0, ja, jb, [&](const auto* keys, const auto* values) {
          attend_block(st, keys, values, j0, ja, jb, N, next, 2 * N * D * elem);
        });
        continue;
      }
      for (int64_t lb = lb0; lb <= lb1; ++lb) {
        const int64_t ka = std::max(ja, lb * N), kb = std::min(jb, lb * N + N - 1);
        with_block(lb, ka, kb, [&](const auto* keys, const auto* values) {
          tile_keys(keys, values, lb * N, ka, kb, ka - ja, span_keys);
        });
      }
      attend_block<float>(st, nullptr, nullptr, j0, ja, jb, span_keys);
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
  const bool fp8 = cache.format != KvFormat::kAuto;
  const int64_t lanes = max_rows * G;
  const bool amx = ForwardTask<T, kD>::takes_amx(cache, lanes);   // the bf16 path: lanes in blocks of 16
  const int64_t lane_block = amx ? 16 : kLanes, padded = (lanes + lane_block - 1) / lane_block * lane_block;
  const bool may_tile = ForwardTask<T, kD>::takes_tiles(cache, lanes);   // the largest task: any task may tile
  // every task takes the AMX path where the cache is kept in pairs: no fp32 query lanes or scores, no packed spans
  const bool all_amx = amx && paired_layout(cache, true);
  // The scratch every task writes before it reads is not zeroed (on a small decode zeroing it per call cost a
  // tenth of the call); REFERENCE_CPU_POISON_SCRATCH=1 fills it with NaN instead (float NaN, bf16 NaN bits), so
  // that a read before a write shows in the output (tests/kernels/test_attention_cpu.py runs cases so).
  const char* poison_env = std::getenv("REFERENCE_CPU_POISON_SCRATCH");
  const bool poison = poison_env != nullptr && poison_env[0] == '1';
  const auto take = [poison](auto& v, int64_t n) {
    using E = typename std::decay_t<decltype(v)>::value_type;
    v.resize(n);
    if (!poison) return;
    if constexpr (std::is_same_v<E, float>) {
      std::fill(v.begin(), v.end(), std::numeric_limits<float>::quiet_NaN());
    } else {
      std::fill(v.begin(), v.end(), E{0x7FC1});   // a bf16 NaN
    }
  };
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> m(padded), l(padded);
    UninitVec<float> acc, qi, s_all, kbuf, vbuf, kt, vt;
    take(acc, padded * D);
    take(qi, all_amx ? 0 : padded * D);
    take(s_all, all_amx ? 0 : padded * (std::max({N, kTile, may_tile ? kSpanKeys : 0}) + kF));
    take(kbuf, fp8 ? N * D : 0);
    take(vbuf, fp8 ? N * D : 0);
    const int64_t span_keys = std::max(N, kSpanKeys);   // a tiled task's keys per span (ForwardTask::run)
    const int64_t tiled_keys = (span_keys + kTile - 1) / kTile * kTile, tiled_dims = (D + kTile - 1) / kTile * kTile;
    take(kt, may_tile ? tiled_keys * D : 0);
    take(vt, may_tile ? tiled_dims * span_keys : 0);
    std::vector<int64_t> ra(max_rows), re(max_rows), glo(padded / kLanes), ghi(padded / kLanes);
    AmxScratch amx_scratch;
    if (amx) {
      const int64_t ks = (std::max(N, kSpanKeys) + 31) / 32 * 32;
      amx_scratch.ks = ks;
      if (!all_amx) {  // the packed spans (paired caches are read in place)
        amx_scratch.kp.assign(D * ks, 0);
        amx_scratch.vp.assign(ks * D, 0);
      }
      take(amx_scratch.qa, padded * D);
      take(amx_scratch.pa, padded * ks);
      take(amx_scratch.vtail, 32 * D);
      take(amx_scratch.sa, padded * ks);
      amx_scratch.blo.assign(padded / 16, 0);
      amx_scratch.bhi.assign(padded / 16, 0);
    }
    ForwardTask<T, kD> runner{out, query, cache, batch, f, G, acc, kbuf, vbuf,
                              kt, s_all, m, l, qi, vt, ra, re, glo, ghi, amx_scratch};
    for (int64_t w = begin; w < end; ++w) {
      for (int64_t i = next.fetch_add(1); i < n_tasks; i = next.fetch_add(1)) runner.run(tasks[order[i]]);
    }
#if defined(REFERENCE_CPU_ATTENTION_AMX)
    if (amx_scratch.rows > 0) amx_end();
#endif
  });
}

// One token's D elements into the cache at element `off`, `stride` elements apart (1: a value row; the block
// size: a key column), as T ("auto") or as fp8 codes of x / scale.
template <typename T>
void write_elements(const T* src, const PagedCache& cache, int64_t off, int64_t stride, float scale) {
  const int64_t D = cache.head_size;
  if (cache.format == KvFormat::kAuto) {
    T* dst = static_cast<T*>(cache.data) + off;
    if (stride == 1) {
      std::memcpy(dst, src, D * sizeof(T));
    } else {
      for (int64_t d = 0; d < D; ++d) dst[d * stride] = src[d];
    }
    return;
  }
  uint8_t* dst = static_cast<uint8_t*>(cache.data) + off;
  const bool e4m3 = cache.format == KvFormat::kFp8E4m3;
  for (int64_t d = 0; d < D; ++d) {
    const float x = static_cast<float>(src[d]) / scale;
    dst[d * stride] = e4m3 ? encode_e4m3(x) : encode_e5m2(x);
  }
}

}  // namespace

template <typename T>
void reshape_and_cache(HeadRows<const T> key, HeadRows<const T> value, const int64_t* slots, int64_t tokens,
                       const PagedCache& cache) {
  const int64_t KVH = cache.kv_heads, N = cache.block_size, D = cache.head_size;
  const bool pairs = paired_layout(cache, std::is_same_v<T, c10::BFloat16>);
  at::parallel_for(0, tokens * KVH, std::max<int64_t>(1, 4096 / std::max<int64_t>(D, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t i = begin; i < end; ++i) {
                       const int64_t t = i / KVH, h = i % KVH;
                       const int64_t slot = slots[t];
                       if (slot < 0) continue;  // padding
                       const int64_t off = (slot / N) * cache.stride_block + h * cache.stride_head;
                       if (pairs) {  // keys [D/2][N][2], values [N/2][D][2] (attention.h)
                         T* blk = static_cast<T*>(cache.data) + off;
                         const int64_t o = slot % N;
                         const T* k = key.data + t * key.stride_token + h * key.stride_head;
                         const T* v = value.data + t * value.stride_token + h * value.stride_head;
                         for (int64_t d = 0; d < D; ++d) blk[((d / 2) * N + o) * 2 + d % 2] = k[d];
                         T* vr = blk + N * D + (o / 2) * D * 2 + o % 2;
                         for (int64_t d = 0; d < D; ++d) vr[2 * d] = v[d];
                         continue;
                       }
                       // the key as column slot % N of the block's [D, N] keys, the value as row slot % N of
                       // its [N, D] values after them
                       write_elements(key.data + t * key.stride_token + h * key.stride_head, cache,
                                      off + slot % N, N, cache.k_scale);
                       write_elements(value.data + t * value.stride_token + h * value.stride_head, cache,
                                      off + N * D + (slot % N) * D, 1, cache.v_scale);
                     }
                   });
}

bool kv_cache_pairs(int64_t head_size, int64_t block_size) {
  PagedCache c;
  c.head_size = head_size;
  c.block_size = block_size;
  return paired_layout(c, true);
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
