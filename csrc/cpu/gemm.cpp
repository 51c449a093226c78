// Few-row GEMM on a panel-packed weight: the products of decode steps (1 to a few dozen rows).
//
// A decode step's GEMMs read every weight once and do little arithmetic per byte, so their speed is
// the speed of that read. oneDNN's prepacked kernels read a 125M Llama's float32 weights at 10-16 GB/s
// on a 2-core AVX2 EPYC where a plain sum reads them at 20 GB/s. Here each thread streams whole column
// panels, k-major, and prefetches the line it reads a few KB ahead: one sequential stream a thread.
//
// Each panel is kChunk columns wide (two fp32 vectors; one 16-bit vector). A micro-kernel keeps
// kRows rows x kChunk columns of fp32 sums in registers and walks a 4 KB k-tile of the panel that stays in
// L1, so the row groups after the first read it from L1, not memory. 16-bit weights are widened
// in registers (their products are exact in fp32); the columns of a chunk sit in Io<T>'s lane order
// throughout (weights, bias and output all pass through Io<T>), so no shuffle is needed.
#include <vector>

#include "vec_common.h"

namespace reference_cpu {
namespace {

#if defined(CPU_CAPABILITY_AVX512)
constexpr int kRows = 8;   // 16 accumulators of 32 registers
#else
constexpr int kRows = 4;   // 8 accumulators of 16
#endif
constexpr int64_t kRowBlock = 64;          // rows whose sums one task keeps per panel
constexpr int64_t kPrefetchBytes = 4096;   // how far ahead of its read a task prefetches its panel

// K-tile: 4 KB of panel, which stays in L1 while every row group reads it, next to the rows' k-tile of x
// (fp32 at 16 rows: 4 KB more). With 16 KB tiles, panel and x filled L1 at 16 rows, and 8- and 16-row calls
// were 13-20% slower in float32 on a 2-core AVX2 EPYC (bf16 unchanged; 2 KB measured as 4 KB).
template <typename T>
constexpr int64_t k_tile() {
  return std::max<int64_t>(1, 4096 / (kChunk * static_cast<int64_t>(sizeof(T))));
}

// acc[r] (+)= x[r, 0:kt] . panel[0:kt] for R rows; acc rows are kChunk floats in Io<T>'s lane order.
template <typename T, int R>
REFERENCE_CPU_INLINE void panel_rows(const float* x, int64_t x_stride, const T* panel, int64_t kt, float* acc,
                                     bool first) {
  fVec a[R], b[R];
  for (int r = 0; r < R; ++r) {
    a[r] = first ? fVec(0.f) : fVec::loadu(acc + r * kChunk);
    b[r] = first ? fVec(0.f) : fVec::loadu(acc + r * kChunk + kF);
  }
  for (int64_t kk = 0; kk < kt; ++kk) {
    const T* w = panel + kk * kChunk;
    prefetch_bytes(reinterpret_cast<const char*>(w) + kPrefetchBytes, kChunk * sizeof(T));
    fVec w0, w1;
    Io<T>::load(w, w0, w1);
    for (int r = 0; r < R; ++r) {
      const fVec xv(x[r * x_stride + kk]);
      a[r] = at::vec::fmadd(xv, w0, a[r]);
      b[r] = at::vec::fmadd(xv, w1, b[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    a[r].store(acc + r * kChunk);
    b[r].store(acc + r * kChunk + kF);
  }
}

template <typename T, int R = kRows>
REFERENCE_CPU_INLINE void panel_rows_upto(int rows, const float* x, int64_t x_stride, const T* panel, int64_t kt,
                                          float* acc, bool first) {
  if constexpr (R > 1) {
    if (rows < R) return panel_rows_upto<T, R - 1>(rows, x, x_stride, panel, kt, acc, first);
  }
  panel_rows<T, R>(x, x_stride, panel, kt, acc, first);
}

// One panel times rows [0, m) of x (fp32), sums into out's columns [0, cols).
template <typename T>
void one_panel(const float* x, int64_t x_stride, int64_t m, int64_t k, const T* panel, const T* bias, int64_t cols,
               T* out, int64_t out_stride) {
  alignas(64) float acc[kRowBlock * kChunk];
  constexpr int64_t kt_max = k_tile<T>();
  fVec bias_a(0.f), bias_b(0.f);
  if (bias != nullptr) load_n(bias, cols, bias_a, bias_b);
  for (int64_t m0 = 0; m0 < m; m0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, m - m0);
    if (k == 0) std::fill(acc, acc + rows * kChunk, 0.f);   // an empty sum (the tile loop does not run)
    for (int64_t k0 = 0; k0 < k; k0 += kt_max) {
      const int64_t kt = std::min(kt_max, k - k0);
      for (int64_t r = 0; r < rows; r += kRows) {
        panel_rows_upto<T>(static_cast<int>(std::min<int64_t>(kRows, rows - r)), x + (m0 + r) * x_stride + k0,
                           x_stride, panel + k0 * kChunk, kt, acc + r * kChunk, k0 == 0);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      fVec a = fVec::loadu(acc + r * kChunk) + bias_a, b = fVec::loadu(acc + r * kChunk + kF) + bias_b;
      store_n(out + (m0 + r) * out_stride, cols, a, b);
    }
  }
}

}  // namespace

int64_t gemm_panel_cols() { return kChunk; }

template <typename T>
void pack_gemm_panels(const T* weight, int64_t w_stride, int64_t n, int64_t k, T* panels) {
  const int64_t count = (n + kChunk - 1) / kChunk;
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      T* dst = panels + p * k * kChunk;
      const int64_t cols = std::min(kChunk, n - p * kChunk);
      for (int64_t kk = 0; kk < k; ++kk) {
        for (int64_t c = 0; c < kChunk; ++c) {
          dst[kk * kChunk + c] = c < cols ? weight[(p * kChunk + c) * w_stride + kk] : T(0);
        }
      }
    }
  });
}

template <typename T>
void panel_gemm(const T* x, int64_t x_stride, int64_t m, int64_t k, const T* panels, int64_t n, const T* bias,
                T* out, int64_t out_stride) {
  if (m == 0 || n == 0) return;
  // x in fp32, once: the micro-kernel broadcasts one element per row and step.
  std::vector<float> x32;
  const float* xf;
  int64_t xf_stride;
  if constexpr (std::is_same_v<T, float>) {
    xf = x;
    xf_stride = x_stride;
  } else {
    x32.resize(static_cast<size_t>(m * k));
    for (int64_t r = 0; r < m; ++r) row_to_float(x + r * x_stride, x32.data() + r * k, k);
    xf = x32.data();
    xf_stride = k;
  }
  const int64_t count = (n + kChunk - 1) / kChunk;
  // A task reads at least ~64 KB of weights, so small products stay on one thread.
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, k * kChunk * int64_t(sizeof(T))));
  at::parallel_for(0, count, grain, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t cols = std::min(kChunk, n - p * kChunk);
      one_panel(xf, xf_stride, m, k, panels + p * k * kChunk, bias == nullptr ? nullptr : bias + p * kChunk, cols,
                out + p * kChunk, out_stride);
    }
  });
}

#define INSTANTIATE(T)                                                                                    \
  template void pack_gemm_panels<T>(const T*, int64_t, int64_t, int64_t, T*);                             \
  template void panel_gemm<T>(const T*, int64_t, int64_t, int64_t, const T*, int64_t, const T*, T*, int64_t);
INSTANTIATE(float)
INSTANTIATE(c10::Half)
INSTANTIATE(c10::BFloat16)
#undef INSTANTIATE

}  // namespace reference_cpu
