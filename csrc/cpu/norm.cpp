// RMS norm kernels: rms_norm (out of place) and fused_add_rms_norm (in place on x and residual).
//
// Semantics follow reference_impl/ir/ops/layernorm.py: statistics in fp32 over the first n_var
// features, and for the fused form s = x + residual formed in fp32 (the normalization uses fp32 s,
// not its rounded copy). Native casts the normalized value to the input dtype before the weight
// multiply; this kernel multiplies in fp32 and rounds once, at the store: closer to float64, and
// without that 16-bit round trip 10-15% faster in fp16 and bf16 on AVX2.
// One row per step of at::parallel_for; a row is read twice (the second read hits cache).
// Loops take two chunks (64 bytes of a 16-bit row) a step: fewer loop instructions, more
// independent work in flight. In-place fp32 rows go through 256-bit loops on AVX-512 builds
// (vec_common.h, REFERENCE_CPU_IN_PLACE_F32X8).
#include <vector>

#include "vec_common.h"

namespace reference_cpu {
namespace {

inline float inv_rms(float sum_sq, int64_t n_var, float eps) {
  const float variance = sum_sq / static_cast<float>(n_var);
  return 1.0f / std::sqrt(variance + eps);
}

// o = v * inv * w for one chunk in fp32 (kWeight false: v * inv), rounded by the store. `w` is the
// weight already widened to fp32 (and zero-padded to whole chunks), shared by every row.
template <bool kWeight>
inline void scale_chunk(fVec& a, fVec& b, const fVec& inv, const float* w) {
  a = a * inv;
  b = b * inv;
  if constexpr (kWeight) {
    a = a * fVec::loadu(w);
    b = b * fVec::loadu(w + kF);
  }
}

// The weight widened to fp32 once per task, padded with zeros to a whole number of chunks.
template <typename T>
std::vector<float> widen_weight(const T* w, int64_t hidden) {
  std::vector<float> wf((hidden + kChunk - 1) / kChunk * kChunk, 0.f);
  if (w != nullptr) {
    for (int64_t j = 0; j < hidden; j += kChunk) {
      fVec a, b;
      load_n(w + j, std::min<int64_t>(kChunk, hidden - j), a, b);
      a.store(wf.data() + j);
      b.store(wf.data() + j + kF);
    }
  }
  return wf;
}

// Sum of squares of the first n elements of a row: two chunks a step into four accumulators (an
// FMA's latency is four cycles; one or two chains left the loads waiting on it).
template <typename T>
inline float sum_squares(const T* __restrict x, int64_t n) {
  fVec acc0(0.f), acc1(0.f), acc2(0.f), acc3(0.f);
  int64_t j = 0;
  for (; j + 2 * kChunk <= n; j += 2 * kChunk) {
    fVec a, b, c, d;
    Io<T>::load(x + j, a, b);
    Io<T>::load(x + j + kChunk, c, d);
    acc0 = at::vec::fmadd(a, a, acc0);
    acc1 = at::vec::fmadd(b, b, acc1);
    acc2 = at::vec::fmadd(c, c, acc2);
    acc3 = at::vec::fmadd(d, d, acc3);
  }
  for (; j < n; j += kChunk) {
    fVec a, b;
    load_n(x + j, std::min<int64_t>(kChunk, n - j), a, b);
    acc0 = at::vec::fmadd(a, a, acc0);
    acc1 = at::vec::fmadd(b, b, acc1);
  }
  return reduce_add((acc0 + acc1) + (acc2 + acc3));
}

// The first pass of fused_add_rms_norm over elements [j0, j1) of a row: s = x + r in fp32 and (kAccumulate) the
// sum of s^2 added to `acc`. An fp32 row keeps s in r (its cast is exact) for the second pass to read; a 16-bit
// row writes nothing here (add_normalize_row forms s again).
template <typename T, bool kAccumulate>
inline void add_span(const T* __restrict x, T* __restrict r, int64_t j0, int64_t j1, fVec* acc) {
  int64_t j = j0;
#if defined(REFERENCE_CPU_IN_PLACE_F32X8)
  if constexpr (std::is_same_v<T, float>) {  // 32 elements a step, 256 bits at a time; the rest below
    __m256 q0 = _mm256_setzero_ps(), q1 = q0, q2 = q0, q3 = q0;
    for (; j + 32 <= j1; j += 32) {
      const __m256 a = _mm256_add_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(r + j));
      const __m256 b = _mm256_add_ps(_mm256_loadu_ps(x + j + 8), _mm256_loadu_ps(r + j + 8));
      const __m256 c = _mm256_add_ps(_mm256_loadu_ps(x + j + 16), _mm256_loadu_ps(r + j + 16));
      const __m256 d = _mm256_add_ps(_mm256_loadu_ps(x + j + 24), _mm256_loadu_ps(r + j + 24));
      _mm256_storeu_ps(r + j, a);
      _mm256_storeu_ps(r + j + 8, b);
      _mm256_storeu_ps(r + j + 16, c);
      _mm256_storeu_ps(r + j + 24, d);
      if constexpr (kAccumulate) {
        q0 = _mm256_fmadd_ps(a, a, q0);
        q1 = _mm256_fmadd_ps(b, b, q1);
        q2 = _mm256_fmadd_ps(c, c, q2);
        q3 = _mm256_fmadd_ps(d, d, q3);
      }
    }
    if constexpr (kAccumulate) {  // into the low half of acc[0] (zero_extend: the upper half adds zeros)
      const __m256 q = _mm256_add_ps(_mm256_add_ps(q0, q1), _mm256_add_ps(q2, q3));
      acc[0] = acc[0] + fVec(_mm512_zextps256_ps512(q));
    }
  }
#endif
  for (; j + 2 * kChunk <= j1; j += 2 * kChunk) {
    fVec a, b, c, d, ra, rb, rc, rd;
    Io<T>::load(x + j, a, b);
    Io<T>::load(x + j + kChunk, c, d);
    Io<T>::load(r + j, ra, rb);
    Io<T>::load(r + j + kChunk, rc, rd);
    a = a + ra;
    b = b + rb;
    c = c + rc;
    d = d + rd;
    if constexpr (std::is_same_v<T, float>) {
      Io<T>::store(r + j, a, b);
      Io<T>::store(r + j + kChunk, c, d);
    }
    if constexpr (kAccumulate) {
      acc[0] = at::vec::fmadd(a, a, acc[0]);
      acc[1] = at::vec::fmadd(b, b, acc[1]);
      acc[2] = at::vec::fmadd(c, c, acc[2]);
      acc[3] = at::vec::fmadd(d, d, acc[3]);
    }
  }
  for (; j < j1; j += kChunk) {
    const int64_t len = std::min<int64_t>(kChunk, j1 - j);
    fVec a, b, ra, rb;
    load_n(x + j, len, a, b);
    load_n(r + j, len, ra, rb);
    a = a + ra;
    b = b + rb;
    if constexpr (std::is_same_v<T, float>) store_n(r + j, len, a, b);
    if constexpr (kAccumulate) {
      acc[0] = at::vec::fmadd(a, a, acc[0]);
      acc[1] = at::vec::fmadd(b, b, acc[1]);
    }
  }
}

// One output row: o = cast(v * inv * w) from the row `v` of T. `next_in` / `next_o` (or null): lines of the next
// row to prefetch, one 64-byte line of each a step (rms_norm_rows says where); `stream`: non-temporal stores
// (store_out), and the output's lines are not prefetched. kInPlace: fused_add_rms_norm's fp32 row (v the sums s
// in the residual row, o the row x rewritten in place), through 256-bit loops in AVX-512 builds.
template <typename T, bool kWeight, bool kInPlace = false>
inline void normalize_row(const T* __restrict v, const float* __restrict w, T* __restrict o, int64_t hidden,
                          const fVec& inv, const T* next_in, const T* next_o, bool stream = false) {
  static_assert(!kInPlace || std::is_same_v<T, float>);
  int64_t j = 0;
#if defined(REFERENCE_CPU_IN_PLACE_F32X8)
  if constexpr (kInPlace) {
    const __m256 iv = _mm512_castps512_ps256(inv);
    for (; j + 32 <= hidden; j += 32) {
#pragma GCC unroll 4
      for (int64_t q = 0; q < 32; q += 8) {
        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(v + j + q), iv);
        if constexpr (kWeight) a = _mm256_mul_ps(a, _mm256_loadu_ps(w + j + q));
        _mm256_storeu_ps(o + j + q, a);
      }
    }
  }
#endif
  for (; j + 2 * kChunk <= hidden; j += 2 * kChunk) {
    if (next_in != nullptr) {
      prefetch_bytes(next_in + j, 2 * kChunk * sizeof(T));
      if (!stream) prefetch_bytes<true>(next_o + j, 2 * kChunk * sizeof(T));
    }
    fVec a, b, c, d;
    Io<T>::load(v + j, a, b);
    Io<T>::load(v + j + kChunk, c, d);
    scale_chunk<kWeight>(a, b, inv, w + j);
    scale_chunk<kWeight>(c, d, inv, w + j + kChunk);
    store_out(o + j, kChunk, stream, a, b);
    store_out(o + j + kChunk, kChunk, stream, c, d);
  }
  for (; j < hidden; j += kChunk) {
    const int64_t len = std::min<int64_t>(kChunk, hidden - j);
    fVec a, b;
    load_n(v + j, len, a, b);
    scale_chunk<kWeight>(a, b, inv, w + j);
    store_out(o + j, len, stream, a, b);
  }
}

// Whether rms_norm prefetches the next row while it writes this one: for fp32 rows, which it moved
// from 1.03 to 1.09 of vLLM's speed (one thread; 1.00 -> 1.05 on two); 16-bit rows ran 10-15%
// slower with it (0.99 -> 1.13 of vLLM's without, one thread; 0.83 -> 1.01 on two). Both on a 2-core
// AVX-512 EPYC (Zen 4), paired rounds; the AVX2 build there agreed (bf16 1.05 -> 1.08).
template <typename T>
constexpr bool kPrefetchNextRow = std::is_same_v<T, float>;

// fp32 outputs of 16 MB and more are streamed (vec_common.h, store_out), as the activations' are:
// 1.10 -> 1.75 of vLLM's speed one thread and 1.04 -> 1.50 two (AVX2 build 0.99 -> 1.50), 4096 x 4096,
// on the Zen 4 EPYC above.
template <typename T, bool kWeight>
void rms_norm_rows(const T* x, RowIndex x_rows, const T* weight, T* out, int64_t rows, int64_t hidden,
                   int64_t n_var, float eps) {
  const bool stream_all = stream_output<T>(rows * hidden * static_cast<int64_t>(sizeof(T)));
  at::parallel_for(0, rows, row_grain(hidden), [=](int64_t begin, int64_t end) {
    const std::vector<float> w = widen_weight(kWeight ? weight : nullptr, hidden);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + x_rows(r);
      const bool more = kPrefetchNextRow<T> && r + 1 < end;
      const fVec inv(inv_rms(sum_squares(xr, n_var), n_var, eps));
      T* o = out + r * hidden;
      normalize_row<T, kWeight>(xr, w.data(), o, hidden, inv, more ? x + x_rows(r + 1) : nullptr, o + hidden,
                                stream_all && aligned64(o));
    }
    stream_fence();
  });
}

// The second pass of a 16-bit row: s = x + r formed again (the same fp32 sums as the first pass; the row is still
// in cache), r = cast(s) and x = cast(s * inv * w).
template <typename T, bool kWeight>
inline void add_normalize_row(T* __restrict x, T* __restrict r, const float* __restrict w, int64_t hidden,
                              const fVec& inv) {
  int64_t j = 0;
  for (; j + kChunk <= hidden; j += kChunk) {
    fVec a, b, ra, rb;
    Io<T>::load(x + j, a, b);
    Io<T>::load(r + j, ra, rb);
    a = a + ra;
    b = b + rb;
    Io<T>::store(r + j, a, b);
    scale_chunk<kWeight>(a, b, inv, w + j);
    Io<T>::store(x + j, a, b);
  }
  if (j < hidden) {
    const int64_t len = hidden - j;
    fVec a, b, ra, rb;
    load_n(x + j, len, a, b);
    load_n(r + j, len, ra, rb);
    a = a + ra;
    b = b + rb;
    store_n(r + j, len, a, b);
    scale_chunk<kWeight>(a, b, inv, w + j);
    store_n(x + j, len, a, b);
  }
}

// fused_add_rms_norm, per row: a first pass forms s = x + r in fp32 and its sum of squares over the first n_var
// elements; a second pass writes x = normalized s. An fp32 row keeps s in r during the first pass (its cast is
// exact) and the second reads it back; a 16-bit row writes nothing in the first pass and the second forms s again
// from x and r, writing r = cast(s) and x. Until 2026-12-07 the 16-bit first pass also wrote r, and an fp32 copy
// of s into a scratch row that the second pass read (16 KB written and read again for a 4096-wide row, which with
// x and r filled a 32 KB L1): bf16 was 2-30% slower so (1 and 2 threads; AVX-512 and AVX2 builds on a Zen 4 EPYC,
// alternating processes; csrc/README.md), fp16 about even.
// Nothing is prefetched: for fp32 the hardware prefetchers keep up and the extra instructions cost 3-4% (AVX2
// EPYC, 3 interleaved runs); for 16-bit rows prefetching the next row's x and r cost 3% on an AVX-512 EPYC (Zen 4;
// 1 and 2 threads, paired rounds).
template <typename T, bool kWeight>
void fused_add_rms_norm_rows(T* x, RowIndex x_rows, T* residual, RowIndex res_rows, const T* weight,
                             int64_t rows, int64_t hidden, int64_t n_var, float eps) {
  constexpr bool kFloat = std::is_same_v<T, float>;
  at::parallel_for(0, rows, row_grain(hidden), [=](int64_t begin, int64_t end) {
    const std::vector<float> w = widen_weight(kWeight ? weight : nullptr, hidden);
    for (int64_t r = begin; r < end; ++r) {
      T* xr = x + x_rows(r);
      T* rr = residual + res_rows(r);
      // The vector pass sums whole chunks, those before n_var's own chunk; that chunk's few elements before
      // n_var are summed here, from the inputs, before an fp32 pass overwrites r.
      const int64_t n0 = n_var / kChunk * kChunk;
      float partial = 0.f;
      for (int64_t i = n0; i < n_var; ++i) {
        const float v = static_cast<float>(xr[i]) + static_cast<float>(rr[i]);
        partial += v * v;
      }
      fVec acc[4] = {fVec(0.f), fVec(0.f), fVec(0.f), fVec(0.f)};
      add_span<T, true>(xr, rr, 0, n0, acc);
      if constexpr (kFloat) add_span<T, false>(xr, rr, n0, hidden, acc);   // s for the rest of the row
      const float sum_sq = reduce_add((acc[0] + acc[1]) + (acc[2] + acc[3])) + partial;
      const fVec inv(inv_rms(sum_sq, n_var, eps));
      if constexpr (kFloat) {
        normalize_row<T, kWeight, true>(rr, w.data(), xr, hidden, inv, nullptr, nullptr);
      } else {
        add_normalize_row<T, kWeight>(xr, rr, w.data(), hidden, inv);
      }
    }
  });
}

}  // namespace

template <typename T>
void rms_norm(const T* x, RowIndex x_rows, const T* weight, T* out, int64_t rows, int64_t hidden,
              int64_t n_var, float eps) {
  if (weight != nullptr) {
    rms_norm_rows<T, true>(x, x_rows, weight, out, rows, hidden, n_var, eps);
  } else {
    rms_norm_rows<T, false>(x, x_rows, weight, out, rows, hidden, n_var, eps);
  }
}

template <typename T>
void fused_add_rms_norm(T* x, RowIndex x_rows, T* residual, RowIndex res_rows, const T* weight,
                        int64_t rows, int64_t hidden, int64_t n_var, float eps) {
  if (weight != nullptr) {
    fused_add_rms_norm_rows<T, true>(x, x_rows, residual, res_rows, weight, rows, hidden, n_var, eps);
  } else {
    fused_add_rms_norm_rows<T, false>(x, x_rows, residual, res_rows, weight, rows, hidden, n_var, eps);
  }
}

#define INSTANTIATE_NORM(T)                                                                      \
  template void rms_norm<T>(const T*, RowIndex, const T*, T*, int64_t, int64_t, int64_t, float); \
  template void fused_add_rms_norm<T>(T*, RowIndex, T*, RowIndex, const T*, int64_t, int64_t,     \
                                      int64_t, float);
REFERENCE_CPU_INSTANTIATE(INSTANTIATE_NORM)

}  // namespace reference_cpu
