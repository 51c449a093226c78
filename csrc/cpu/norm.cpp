// RMS norm kernels: rms_norm (out of place) and fused_add_rms_norm (in place on x and residual).
//
// Semantics follow reference_impl/ir/ops/layernorm.py: statistics in fp32 over the first n_var
// features, the normalized value cast to the input dtype BEFORE the weight multiply, and for the
// fused form s = x + residual formed in fp32 (the normalization uses fp32 s, not its rounded copy).
// One row per step of at::parallel_for; a row is read twice (the second read hits cache).
#include <vector>

#include "vec_common.h"

namespace reference_cpu {
namespace {

// Sum of squares of the first n elements of a row.
template <typename T>
inline float sum_squares(const T* x, int64_t n) {
  fVec acc0(0.f), acc1(0.f);
  int64_t j = 0;
  for (; j + kChunk <= n; j += kChunk) {
    fVec a, b;
    Io<T>::load(x + j, a, b);
    acc0 = at::vec::fmadd(a, a, acc0);
    acc1 = at::vec::fmadd(b, b, acc1);
  }
  if (j < n) {
    fVec a, b;
    load_tail(x + j, n - j, a, b);
    acc0 = at::vec::fmadd(a, a, acc0);
    acc1 = at::vec::fmadd(b, b, acc1);
  }
  return reduce_add(acc0 + acc1);
}

// Sum of squares of (x + r) over the first n elements.
template <typename T>
inline float sum_squares_added(const T* x, const T* r, int64_t n) {
  fVec acc0(0.f), acc1(0.f);
  for (int64_t j = 0; j < n; j += kChunk) {
    const int64_t len = std::min<int64_t>(kChunk, n - j);
    fVec a, b, ra, rb;
    load_n(x + j, len, a, b);
    load_n(r + j, len, ra, rb);
    a = a + ra;
    b = b + rb;
    acc0 = at::vec::fmadd(a, a, acc0);
    acc1 = at::vec::fmadd(b, b, acc1);
  }
  return reduce_add(acc0 + acc1);
}

inline float inv_rms(float sum_sq, int64_t n_var, float eps) {
  const float variance = sum_sq / static_cast<float>(n_var);
  return 1.0f / std::sqrt(variance + eps);
}

// o = cast(cast(v * inv) * w) for one chunk (kWeight false: cast(v * inv)). `w` is the weight
// already widened to fp32 (and zero-padded to whole chunks), shared by every row.
template <typename T, bool kWeight>
inline void scale_chunk(fVec& a, fVec& b, const fVec& inv, const float* w) {
  a = a * inv;
  b = b * inv;
  if constexpr (kWeight) {
    Io<T>::round(a, b);
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

// One row of rms_norm, full chunks first, then the tail. Pointers arrive by value (and restrict),
// so vector stores cannot make the compiler reload them. While a row is written, the next row's
// input (`next_x`) and output (`next_o`) lines are prefetched chunk by chunk, so the next row's
// statistics pass finds them in cache instead of waiting on memory.
template <typename T, bool kWeight>
inline void normalize_row(const T* __restrict x, const float* __restrict w, T* __restrict o,
                          int64_t hidden, const fVec& inv, const T* next_x, const T* next_o) {
  int64_t j = 0;
  for (; j + kChunk <= hidden; j += kChunk) {
    if (next_x != nullptr) {
      prefetch_bytes(next_x + j, kChunk * sizeof(T));
      prefetch_bytes<true>(next_o + j, kChunk * sizeof(T));
    }
    fVec a, b;
    Io<T>::load(x + j, a, b);
    scale_chunk<T, kWeight>(a, b, inv, w + j);
    Io<T>::store(o + j, a, b);
  }
  if (j < hidden) {
    fVec a, b;
    load_tail(x + j, hidden - j, a, b);
    scale_chunk<T, kWeight>(a, b, inv, w + j);
    store_tail(o + j, hidden - j, a, b);
  }
}

// One row of fused_add_rms_norm, in place: r = cast(x + r); x = normalized. Prefetches the next
// row's x and residual lines (null: last row of the task).
template <typename T, bool kWeight>
inline void add_normalize_row(T* __restrict x, T* __restrict r, const float* __restrict w,
                              int64_t hidden, const fVec& inv, const T* next_x, const T* next_r) {
  for (int64_t j = 0; j < hidden; j += kChunk) {
    const int64_t len = std::min<int64_t>(kChunk, hidden - j);
    if (next_x != nullptr) {
      prefetch_bytes<true>(next_x + j, kChunk * sizeof(T));
      prefetch_bytes<true>(next_r + j, kChunk * sizeof(T));
    }
    fVec a, b, ra, rb;
    load_n(x + j, len, a, b);
    load_n(r + j, len, ra, rb);
    a = a + ra;
    b = b + rb;
    store_n(r + j, len, a, b);
    scale_chunk<T, kWeight>(a, b, inv, w + j);
    store_n(x + j, len, a, b);
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
      normalize_row<T, kWeight>(xr, w.data(), out + r * hidden, hidden, inv,
                                more ? x + x_rows(r + 1) : nullptr, out + (r + 1) * hidden);
    }
  });
}

template <typename T, bool kWeight>
void fused_add_rms_norm_rows(T* x, RowIndex x_rows, T* residual, RowIndex res_rows, const T* weight,
                             int64_t rows, int64_t hidden, int64_t n_var, float eps) {
  at::parallel_for(0, rows, row_grain(hidden), [=](int64_t begin, int64_t end) {
    const std::vector<float> w = widen_weight(kWeight ? weight : nullptr, hidden);
    for (int64_t r = begin; r < end; ++r) {
      T* xr = x + x_rows(r);
      T* rr = residual + res_rows(r);
      const bool more = r + 1 < end;
      const fVec inv(inv_rms(sum_squares_added(xr, rr, n_var), n_var, eps));
      add_normalize_row<T, kWeight>(xr, rr, w.data(), hidden, inv, more ? x + x_rows(r + 1) : nullptr,
                                    more ? residual + res_rows(r + 1) : nullptr);
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
