// Activation CUDA kernels: gated (act(gate) * up, interleaved swigluoai) and the GELU family.
// Element-wise over rows (rows_grid: a power-of-two team of lanes per row, several short rows per
// block, column blocks for long rows), 16-byte units with a scalar fallback for tails and
// unaligned rows; fp32 math, one rounding to the output dtype; NaN propagates as in torch
// (threshold keeps NaN, clamp and relu propagate it).
#include "common.cuh"

namespace reference_cuda {
namespace {

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

struct Silu {
  __device__ __forceinline__ float operator()(float v, float) const { return v / (1.0f + expf(-v)); }
};
struct GeluErf {
  __device__ __forceinline__ float operator()(float v, float) const {
    return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  }
};
struct GeluTanh {  // gelu(approximate="tanh") and gelu_new
  __device__ __forceinline__ float operator()(float v, float) const {
    return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
  }
};
struct GeluFast {
  __device__ __forceinline__ float operator()(float v, float) const {
    return 0.5f * v * (1.0f + tanhf(v * 0.7978845608f * (1.0f + 0.044715f * v * v)));
  }
};
struct QuickGelu {
  __device__ __forceinline__ float operator()(float v, float) const { return v * sigmoid(1.702f * v); }
};
struct Relu2 {
  __device__ __forceinline__ float operator()(float v, float) const {
    const float r = isnan(v) ? v : fmaxf(v, 0.f);
    return r * r;
  }
};
struct FatRelu {  // threshold(x, t, 0)
  __device__ __forceinline__ float operator()(float v, float t) const { return v <= t ? 0.f : v; }
};

// act(first) * second (kActOnSecond: first * act(second)) over the d features of each half.
template <typename T, typename Act, bool kActOnSecond>
__global__ void gated_kernel(const T* __restrict__ x, RowIndex x_rows, T* __restrict__ out, int64_t rows,
                             int64_t d, float param, int lanes) {
  constexpr int V = kVec<T>;
  const int64_t row = grid_row(lanes);
  if (row >= rows) return;
  const T* first = x + x_rows(row);
  const T* second = first + d;
  T* o = out + row * d;
  const bool vec = aligned16(first) && aligned16(second) && aligned16(o);
  const Act act;
  for (int64_t u = grid_first_unit(lanes); u * V < d; u += static_cast<int64_t>(gridDim.y) * lanes) {
    float a[V], b[V];
    load_unit(first, u * V, d, vec, a);
    load_unit(second, u * V, d, vec, b);
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = kActOnSecond ? a[k] * act(b[k], param) : act(a[k], param) * b[k];
    store_unit(o, u * V, d, vec, a);
  }
}

// Interleaved gate/up: output unit u reads the two input units 2u and 2u + 1.
template <typename T>
__global__ void swigluoai_kernel(const T* __restrict__ x, RowIndex x_rows, T* __restrict__ out, int64_t rows,
                                 int64_t d, float alpha, float limit, int lanes) {
  constexpr int V = kVec<T>;
  const int64_t row = grid_row(lanes);
  if (row >= rows) return;
  const T* xr = x + x_rows(row);
  T* o = out + row * d;
  const bool vec = aligned16(xr) && aligned16(o);
  for (int64_t u = grid_first_unit(lanes); u * V < d; u += static_cast<int64_t>(gridDim.y) * lanes) {
    float lo[V], hi[V], r[V];  // inputs 2uV .. 2uV + 2V: (gate, up) pairs
    load_unit(xr, 2 * u * V, 2 * d, vec, lo);
    load_unit(xr, (2 * u + 1) * V, 2 * d, vec, hi);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float* pair = 2 * k < V ? lo + 2 * k : hi + (2 * k - V);
      float g = pair[0], up = pair[1];
      g = isnan(g) ? g : fminf(g, limit);
      up = isnan(up) ? up : fminf(fmaxf(up, -limit), limit);
      r[k] = (up + 1.0f) * (g * sigmoid(alpha * g));
    }
    store_unit(o, u * V, d, vec, r);
  }
}

template <typename T, typename Act>
__global__ void unary_kernel(const T* __restrict__ x, RowIndex x_rows, T* __restrict__ out, int64_t rows,
                             int64_t hidden, int lanes) {
  constexpr int V = kVec<T>;
  const int64_t row = grid_row(lanes);
  if (row >= rows) return;
  const T* xr = x + x_rows(row);
  T* o = out + row * hidden;
  const bool vec = aligned16(xr) && aligned16(o);
  const Act act;
  for (int64_t u = grid_first_unit(lanes); u * V < hidden; u += static_cast<int64_t>(gridDim.y) * lanes) {
    float v[V];
    load_unit(xr, u * V, hidden, vec, v);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = act(v[k], 0.f);
    store_unit(o, u * V, hidden, vec, v);
  }
}

template <typename T, typename Act, bool kActOnSecond = false>
void launch_gated(const void* x, RowIndex x_rows, void* out, int64_t rows, int64_t d, float param,
                  cudaStream_t stream) {
  const RowsGrid g = rows_grid(rows, ceil_div(d, kVec<T>));
  gated_kernel<T, Act, kActOnSecond><<<g.grid, kRowsBlockThreads, 0, stream>>>(
      static_cast<const T*>(x), x_rows, static_cast<T*>(out), rows, d, param, g.lanes);
}

template <typename T>
void launch_swigluoai(const void* x, RowIndex x_rows, void* out, int64_t rows, int64_t d, float alpha,
                      float limit, cudaStream_t stream) {
  const RowsGrid g = rows_grid(rows, ceil_div(d, kVec<T>));
  swigluoai_kernel<T><<<g.grid, kRowsBlockThreads, 0, stream>>>(
      static_cast<const T*>(x), x_rows, static_cast<T*>(out), rows, d, alpha, limit, g.lanes);
}

template <typename T, typename Act>
void launch_unary(const void* x, RowIndex x_rows, void* out, int64_t rows, int64_t hidden,
                  cudaStream_t stream) {
  const RowsGrid g = rows_grid(rows, ceil_div(hidden, kVec<T>));
  unary_kernel<T, Act><<<g.grid, kRowsBlockThreads, 0, stream>>>(
      static_cast<const T*>(x), x_rows, static_cast<T*>(out), rows, hidden, g.lanes);
}

}  // namespace

int gated_activation(DType dtype, Gated kind, const void* x, RowIndex x_rows, void* out, int64_t rows,
                     int64_t d, float param, void* stream) {
  if (rows == 0 || d == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  REFERENCE_CUDA_DISPATCH(dtype, {
    switch (kind) {
      case Gated::kSiluAndMul: launch_gated<scalar_t, Silu>(x, x_rows, out, rows, d, param, s); break;
      case Gated::kMulAndSilu: launch_gated<scalar_t, Silu, true>(x, x_rows, out, rows, d, param, s); break;
      case Gated::kGeluAndMul: launch_gated<scalar_t, GeluErf>(x, x_rows, out, rows, d, param, s); break;
      case Gated::kGeluTanhAndMul: launch_gated<scalar_t, GeluTanh>(x, x_rows, out, rows, d, param, s); break;
      case Gated::kFatreluAndMul: launch_gated<scalar_t, FatRelu>(x, x_rows, out, rows, d, param, s); break;
    }
  });
  return launch_status();
}

int swigluoai_and_mul(DType dtype, const void* x, RowIndex x_rows, void* out, int64_t rows, int64_t d,
                      float alpha, float limit, void* stream) {
  if (rows == 0 || d == 0) return 0;
  REFERENCE_CUDA_DISPATCH(dtype, launch_swigluoai<scalar_t>(x, x_rows, out, rows, d, alpha, limit,
                                                            static_cast<cudaStream_t>(stream)));
  return launch_status();
}

int unary_activation(DType dtype, Unary kind, const void* x, RowIndex x_rows, void* out, int64_t rows,
                     int64_t hidden, void* stream) {
  if (rows == 0 || hidden == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  REFERENCE_CUDA_DISPATCH(dtype, {
    switch (kind) {
      case Unary::kGeluNew: launch_unary<scalar_t, GeluTanh>(x, x_rows, out, rows, hidden, s); break;
      case Unary::kGeluFast: launch_unary<scalar_t, GeluFast>(x, x_rows, out, rows, hidden, s); break;
      case Unary::kQuickGelu: launch_unary<scalar_t, QuickGelu>(x, x_rows, out, rows, hidden, s); break;
      case Unary::kRelu2: launch_unary<scalar_t, Relu2>(x, x_rows, out, rows, hidden, s); break;
    }
  });
  return launch_status();
}

}  // namespace reference_cuda
