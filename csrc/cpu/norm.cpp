// RMS norm kernels: rms_norm (out of place) and fused_add_rms_norm (in place on x and residual).
//
// Semantics follow reference_impl/ir/ops/layernorm.py: statistics in fp32 over the first n_var
// features, and for the fused form s = x + residual formed in fp32 (the normalization uses fp32 s,
// not its rounded copy). Native casts the normalized value to the input dtype before the weight
// multiply; this kernel multiplies in fp32 and rounds once, at the store: closer to float64, and
// without that 16-bit round trip 10-15% faster in fp16 and bf16 on AVX2.
// One row per step of at::parallel_for; a row is read twice (the second read hits cache).
// Loops take two chunks (64 bytes of a 16-bit row) a step: fewer loop and prefetch instructions,
// more independent work in flight.
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

// The first pass of fused_add_rms_norm over elements [j0, j1) of a row: s = x + r in fp32,
// r = cast(s), s kept in fp32 at `s_out` (the residual row itself for fp32, whose cast is exact),
// and (kAccumulate) the sum of s^2 added to `acc`. `next_x` / `next_r` (or null): the same span of
// the next row, prefetched one 64-byte line a step.
template <typename T, bool kAccumulate>
inline void add_span(const T* __restrict x, T* __restrict r, float* __restrict s_out, int64_t j0, int64_t j1,
                     fVec* acc, const T* next_x, const T* next_r) {
  int64_t j = j0;
  for (; j + 2 * kChunk <= j1; j += 2 * kChunk) {
    if (next_x != nullptr) {
      prefetch_bytes<true>(next_x + j, 2 * kChunk * sizeof(T));
      prefetch_bytes<true>(next_r + j, 2 * kChunk * sizeof(T));
    }
    fVec a, b, c, d, ra, rb, rc, rd;
    Io<T>::load(x + j, a, b);
    Io<T>::load(x + j + kChunk, c, d);
    Io<T>::load(r + j, ra, rb);
    Io<T>::load(r + j + kChunk, rc, rd);
    a = a + ra;
    b = b + rb;
    c = c + rc;
    d = d + rd;
    Io<T>::store(r + j, a, b);
    Io<T>::store(r + j + kChunk, c, d);
    if constexpr (!std::is_same_v<T, float>) {
      a.store(s_out + j);
      b.store(s_out + j + kF);
      c.store(s_out + j + kChunk);
      d.store(s_out + j + kChunk + kF);
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
    store_n(r + j, len, a, b);
    if constexpr (!std::is_same_v<T, float>) {  // whole chunks: the scratch row is padded
      a.store(s_out + j);
      b.store(s_out + j + kF);
    }
    if constexpr (kAccumulate) {
      acc[0] = at::vec::fmadd(a, a, acc[0]);
      acc[1] = at::vec::fmadd(b, b, acc[1]);
    }
  }
}

// One output row: o = cast(v * inv * w) from the fp32 values v (kFromFloat: an fp32 row
// `vf`) or from the row `v` of T. `next_in` / `next_o` (or null): lines of the next row to
// prefetch, one 64-byte line of each a step.
template <typename T, bool kWeight, bool kFromFloat, typename In>
inline void normalize_row(const In* __restrict v, const float* __restrict w, T* __restrict o, int64_t hidden,
                          const fVec& inv, const T* next_in, const T* next_o) {
  static_assert(std::is_same_v<In, std::conditional_t<kFromFloat, float, T>>);
  auto load = [&](int64_t j, fVec& a, fVec& b) {
    if constexpr (kFromFloat) {
      a = fVec::loadu(v + j);
      b = fVec::loadu(v + j + kF);
    } else {
      Io<T>::load(v + j, a, b);
    }
  };
  int64_t j = 0;
  for (; j + 2 * kChunk <= hidden; j += 2 * kChunk) {
    if (next_in != nullptr) {
      prefetch_bytes(next_in + j, 2 * kChunk * sizeof(T));
      prefetch_bytes<true>(next_o + j, 2 * kChunk * sizeof(T));
    }
    fVec a, b, c, d;
    load(j, a, b);
    load(j + kChunk, c, d);
    scale_chunk<kWeight>(a, b, inv, w + j);
    scale_chunk<kWeight>(c, d, inv, w + j + kChunk);
    Io<T>::store(o + j, a, b);
    Io<T>::store(o + j + kChunk, c, d);
  }
  for (; j < hidden; j += kChunk) {
    const int64_t len = std::min<int64_t>(kChunk, hidden - j);
    fVec a, b;
    if constexpr (kFromFloat) {
      load(j, a, b);  // the scratch row is padded to whole chunks
    } else {
      load_n(v + j, len, a, b);
    }
    scale_chunk<kWeight>(a, b, inv, w + j);
    store_n(o + j, len, a, b);
  }
}

template <typename T, bool kWeight>
void rms_norm_rows(const T* x, RowIndex x_rows, const T* weight, T* out, int64_t rows, int64_t hidden,
                   int64_t n_var, float eps) {
  at::parallel_for(0, rows, row_grain(hidden), [=](int64_t begin, int64_t end) {
    const std::vector<float> w = widen_weight(kWeight ? weight : nullptr, hidden);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + x_rows(r);
      const bool more = r + 1 < end;
      const fVec inv(inv_rms(sum_squares(xr, n_var), n_var, eps));
      normalize_row<T, kWeight, false>(xr, w.data(), out + r * hidden, hidden, inv,
                                       more ? x + x_rows(r + 1) : nullptr, out + (r + 1) * hidden);
    }
  });
}

// fused_add_rms_norm, per row: one pass forms s = x + r (r = cast(s), s kept in fp32, its sum of
// squares over the first n_var elements), a second pass writes x = normalized s from the fp32
// copy, which for 16-bit rows is a per-task scratch row (cache-resident) instead of reloading and
// re-adding x and r. The next row is prefetched for 16-bit rows only: for fp32 the hardware
// prefetchers keep up, and the extra instructions cost 3-4% (AVX2 EPYC, 3 interleaved runs).
template <typename T, bool kWeight>
void fused_add_rms_norm_rows(T* x, RowIndex x_rows, T* residual, RowIndex res_rows, const T* weight,
                             int64_t rows, int64_t hidden, int64_t n_var, float eps) {
  constexpr bool kFloat = std::is_same_v<T, float>;
  at::parallel_for(0, rows, row_grain(hidden), [=](int64_t begin, int64_t end) {
    const std::vector<float> w = widen_weight(kWeight ? weight : nullptr, hidden);
    std::vector<float> scratch(kFloat ? 0 : (hidden + kChunk - 1) / kChunk * kChunk);
    for (int64_t r = begin; r < end; ++r) {
      T* xr = x + x_rows(r);
      T* rr = residual + res_rows(r);
      const bool more = r + 1 < end;
      const T* next_x = more && !kFloat ? x + x_rows(r + 1) : nullptr;
      const T* next_r = more && !kFloat ? residual + res_rows(r + 1) : nullptr;
      // Spans start on chunk boundaries (the scratch row holds whole chunks in Io<T>'s lane
      // order): the sum over the chunks before n_var in the pass, the few elements of n_var's own
      // chunk before it here, from the inputs, before the pass overwrites r.
      const int64_t n0 = n_var / kChunk * kChunk;
      float partial = 0.f;
      for (int64_t i = n0; i < n_var; ++i) {
        const float v = static_cast<float>(xr[i]) + static_cast<float>(rr[i]);
        partial += v * v;
      }
      fVec acc[4] = {fVec(0.f), fVec(0.f), fVec(0.f), fVec(0.f)};
      add_span<T, true>(xr, rr, scratch.data(), 0, n0, acc, next_x, next_r);
      add_span<T, false>(xr, rr, scratch.data(), n0, hidden, acc, next_x, next_r);
      const float sum_sq = reduce_add((acc[0] + acc[1]) + (acc[2] + acc[3])) + partial;
      const fVec inv(inv_rms(sum_sq, n_var, eps));
      if constexpr (kFloat) {
        normalize_row<T, kWeight, true>(rr, w.data(), xr, hidden, inv, nullptr, nullptr);
      } else {
        normalize_row<T, kWeight, true>(scratch.data(), w.data(), xr, hidden, inv, nullptr, nullptr);
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
