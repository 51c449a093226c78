// Activation CUDA kernels: gated (act(gate) * up, interleaved swigluoai) and the GELU family.
// Grid: (rows, column blocks); fp32 math, one rounding to the output dtype; NaN propagates as in
// torch (threshold keeps NaN, clamp and relu propagate it).
#include "common.cuh"

namespace reference_cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxColumnBlocks = 64;

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

template <typename T, typename Act, bool kActOnSecond>
__global__ void gated_kernel(const T* __restrict__ x, RowIndex x_rows, T* __restrict__ out, int64_t d,
                             float param) {
  const int64_t row = blockIdx.x;
  const T* first = x + x_rows(row);
  const T* second = first + d;
  T* o = out + row * d;
  const Act act;
  for (int64_t j = blockIdx.y * blockDim.x + threadIdx.x; j < d; j += gridDim.y * blockDim.x) {
    const float a = to_float(first[j]), b = to_float(second[j]);
    o[j] = from_float<T>(kActOnSecond ? a * act(b, param) : act(a, param) * b);
  }
}

template <typename T>
__global__ void swigluoai_kernel(const T* __restrict__ x, RowIndex x_rows, T* __restrict__ out,
                                 int64_t d, float alpha, float limit) {
  const int64_t row = blockIdx.x;
  const T* xr = x + x_rows(row);
  T* o = out + row * d;
  for (int64_t j = blockIdx.y * blockDim.x + threadIdx.x; j < d; j += gridDim.y * blockDim.x) {
    float g = to_float(xr[2 * j]), u = to_float(xr[2 * j + 1]);
    g = isnan(g) ? g : fminf(g, limit);
    u = isnan(u) ? u : fminf(fmaxf(u, -limit), limit);
    o[j] = from_float<T>((u + 1.0f) * (g * sigmoid(alpha * g)));
  }
}

template <typename T, typename Act>
__global__ void unary_kernel(const T* __restrict__ x, RowIndex x_rows, T* __restrict__ out,
                             int64_t hidden) {
  const int64_t row = blockIdx.x;
  const T* xr = x + x_rows(row);
  T* o = out + row * hidden;
  const Act act;
  for (int64_t j = blockIdx.y * blockDim.x + threadIdx.x; j < hidden; j += gridDim.y * blockDim.x) {
    o[j] = from_float<T>(act(to_float(xr[j]), 0.f));
  }
}

dim3 grid_for(int64_t rows, int64_t cols) {
  const int64_t blocks = (cols + kThreads - 1) / kThreads;
  return dim3(static_cast<unsigned>(rows),
              static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxColumnBlocks ? kMaxColumnBlocks : blocks)));
}

template <typename T, typename Act, bool kActOnSecond = false>
void launch_gated(const void* x, RowIndex x_rows, void* out, int64_t rows, int64_t d, float param,
                  cudaStream_t stream) {
  gated_kernel<T, Act, kActOnSecond><<<grid_for(rows, d), kThreads, 0, stream>>>(
      static_cast<const T*>(x), x_rows, static_cast<T*>(out), d, param);
}

template <typename T, typename Act>
void launch_unary(const void* x, RowIndex x_rows, void* out, int64_t rows, int64_t hidden,
                  cudaStream_t stream) {
  unary_kernel<T, Act><<<grid_for(rows, hidden), kThreads, 0, stream>>>(
      static_cast<const T*>(x), x_rows, static_cast<T*>(out), hidden);
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
  REFERENCE_CUDA_DISPATCH(dtype, swigluoai_kernel<scalar_t><<<grid_for(rows, d), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const scalar_t*>(x), x_rows, static_cast<scalar_t*>(out), d, alpha, limit));
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
