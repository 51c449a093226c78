// RMS norm CUDA kernels: one block per row. Pass 1 reduces the fp32 sum of squares of the first
// n_var features; pass 2 writes cast(cast(x * inv_rms) * w), as reference_impl/ir/ops/layernorm.py.
// The fused form recomputes s = x + residual in pass 2 (each element is read and then written by
// the same thread, so the in-place update is safe).
#include "common.cuh"

namespace reference_cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float inv_rms(float sum_sq, int64_t n_var, float eps) {
  return rsqrtf(sum_sq / static_cast<float>(n_var) + eps);
}

template <typename T>
__device__ __forceinline__ float normalize(float v, float inv, const T* w, int64_t j) {
  v *= inv;
  if (w == nullptr) return v;
  return round_to<T>(v) * to_float(w[j]);
}

template <typename T>
__global__ void rms_norm_kernel(const T* __restrict__ x, RowIndex x_rows, const T* __restrict__ w,
                                T* __restrict__ out, int64_t hidden, int64_t n_var, float eps) {
  const int64_t row = blockIdx.x;
  const T* xr = x + x_rows(row);
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < n_var; j += blockDim.x) {
    const float v = to_float(xr[j]);
    acc += v * v;
  }
  const float inv = inv_rms(block_reduce(acc, SumOp{}, 0.f), n_var, eps);
  T* o = out + row * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    o[j] = from_float<T>(normalize(to_float(xr[j]), inv, w, j));
  }
}

template <typename T>
__global__ void fused_add_rms_norm_kernel(T* x, RowIndex x_rows, T* residual, RowIndex res_rows,
                                          const T* __restrict__ w, int64_t hidden, int64_t n_var,
                                          float eps) {
  const int64_t row = blockIdx.x;
  T* xr = x + x_rows(row);
  T* rr = residual + res_rows(row);
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < n_var; j += blockDim.x) {
    const float s = to_float(xr[j]) + to_float(rr[j]);
    acc += s * s;
  }
  const float inv = inv_rms(block_reduce(acc, SumOp{}, 0.f), n_var, eps);
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const float s = to_float(xr[j]) + to_float(rr[j]);
    rr[j] = from_float<T>(s);
    xr[j] = from_float<T>(normalize(s, inv, w, j));
  }
}

}  // namespace

int rms_norm(DType dtype, const void* x, RowIndex x_rows, const void* weight, void* out, int64_t rows,
             int64_t hidden, int64_t n_var, float eps, void* stream) {
  if (rows == 0) return 0;
  REFERENCE_CUDA_DISPATCH(dtype, rms_norm_kernel<scalar_t><<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const scalar_t*>(x), x_rows, static_cast<const scalar_t*>(weight),
      static_cast<scalar_t*>(out), hidden, n_var, eps));
  return launch_status();
}

int fused_add_rms_norm(DType dtype, void* x, RowIndex x_rows, void* residual, RowIndex res_rows,
                       const void* weight, int64_t rows, int64_t hidden, int64_t n_var, float eps,
                       void* stream) {
  if (rows == 0) return 0;
  REFERENCE_CUDA_DISPATCH(dtype, fused_add_rms_norm_kernel<scalar_t><<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<scalar_t*>(x), x_rows, static_cast<scalar_t*>(residual), res_rows,
      static_cast<const scalar_t*>(weight), hidden, n_var, eps));
  return launch_status();
}

}  // namespace reference_cuda
