// fp8 (e4m3fn) quantization CUDA kernels: static scales, dynamic per token / per tensor (optional
// absmax upper bound), dynamic per group. Arithmetic as reference_impl/ir/ops/quant.py: x * (1 /
// scale) for static and dynamic scales, x / scale for group scales, clamp to +-448 (NaN passes),
// round-to-nearest-even encoding.
#include <cuda_fp8.h>

#include "common.cuh"

namespace reference_cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kGroupThreads = 128;

__device__ __forceinline__ uint8_t encode(float v) {
  v = v > kFp8Max ? kFp8Max : (v < -kFp8Max ? -kFp8Max : v);
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float dynamic_scale(float amax, const float* scale_ub) {
  if (scale_ub != nullptr) amax = nan_min(amax, *scale_ub);
  return nan_max(amax / kFp8Max, kFp8MinScale);
}

template <typename T>
__device__ __forceinline__ float row_absmax(const T* xr, int64_t n) {
  float m = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = nan_max(m, fabsf(to_float(xr[j])));
  return block_reduce(m, MaxOp{}, 0.f);
}

template <typename T>
__global__ void static_quant_kernel(const T* __restrict__ x, RowIndex x_rows, const float* __restrict__ scale,
                                    RowIndex scale_rows, int64_t group_stride, int64_t group,
                                    uint8_t* __restrict__ out, int64_t hidden) {
  const int64_t row = blockIdx.x;
  const T* xr = x + x_rows(row);
  const float* sr = scale + scale_rows(row);
  uint8_t* o = out + row * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const float inv = 1.0f / sr[(j / group) * group_stride];
    o[j] = encode(to_float(xr[j]) * inv);
  }
}

template <typename T>
__global__ void per_token_quant_kernel(const T* __restrict__ x, RowIndex x_rows, uint8_t* __restrict__ out,
                                       float* __restrict__ scale_out, int64_t hidden,
                                       const float* __restrict__ scale_ub) {
  const int64_t row = blockIdx.x;
  const T* xr = x + x_rows(row);
  const float s = dynamic_scale(row_absmax(xr, hidden), scale_ub);
  if (threadIdx.x == 0) scale_out[row] = s;
  const float inv = 1.0f / s;
  uint8_t* o = out + row * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) o[j] = encode(to_float(xr[j]) * inv);
}

// absmax of the rows, folded into *amax (float bits of a non-negative value or NaN order like ints).
template <typename T>
__global__ void tensor_absmax_kernel(const T* __restrict__ x, RowIndex x_rows, float* amax,
                                     int64_t hidden) {
  const float m = row_absmax(x + x_rows(blockIdx.x), hidden);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
}

__global__ void absmax_to_scale_kernel(float* scale, const float* __restrict__ scale_ub) {
  *scale = dynamic_scale(*scale, scale_ub);
}

template <typename T>
__global__ void tensor_quant_kernel(const T* __restrict__ x, RowIndex x_rows, uint8_t* __restrict__ out,
                                    const float* __restrict__ scale, int64_t hidden) {
  const int64_t row = blockIdx.x;
  const T* xr = x + x_rows(row);
  const float inv = 1.0f / *scale;
  uint8_t* o = out + row * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) o[j] = encode(to_float(xr[j]) * inv);
}

template <typename T>
__global__ void group_quant_kernel(const T* __restrict__ x, RowIndex x_rows, uint8_t* __restrict__ out,
                                   float* __restrict__ scale_out, int64_t hidden, int64_t group_size) {
  const int64_t row = blockIdx.x, g = blockIdx.y;
  const T* xg = x + x_rows(row) + g * group_size;
  const float s = dynamic_scale(row_absmax(xg, group_size), nullptr);
  if (threadIdx.x == 0) scale_out[row * gridDim.y + g] = s;
  uint8_t* o = out + row * hidden + g * group_size;
  for (int64_t j = threadIdx.x; j < group_size; j += blockDim.x) o[j] = encode(to_float(xg[j]) / s);
}

}  // namespace

int static_quant_fp8(DType dtype, const void* x, RowIndex x_rows, const float* scale,
                     RowIndex scale_rows, int64_t scale_group_stride, int64_t groups, uint8_t* out,
                     int64_t rows, int64_t hidden, void* stream) {
  if (rows == 0 || hidden == 0) return 0;
  REFERENCE_CUDA_DISPATCH(dtype, static_quant_kernel<scalar_t><<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const scalar_t*>(x), x_rows, scale, scale_rows, scale_group_stride, hidden / groups,
      out, hidden));
  return launch_status();
}

int dynamic_quant_fp8(DType dtype, const void* x, RowIndex x_rows, uint8_t* out, float* scale_out,
                      int64_t rows, int64_t hidden, bool per_token, const float* scale_ub,
                      void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (per_token) {
    if (rows == 0) return 0;
    REFERENCE_CUDA_DISPATCH(dtype, per_token_quant_kernel<scalar_t><<<rows, kThreads, 0, s>>>(
        static_cast<const scalar_t*>(x), x_rows, out, scale_out, hidden, scale_ub));
    return launch_status();
  }
  const cudaError_t zeroed = cudaMemsetAsync(scale_out, 0, sizeof(float), s);
  if (zeroed != cudaSuccess) return static_cast<int>(zeroed);
  REFERENCE_CUDA_DISPATCH(dtype, {
    tensor_absmax_kernel<scalar_t><<<rows, kThreads, 0, s>>>(static_cast<const scalar_t*>(x), x_rows,
                                                              scale_out, hidden);
    absmax_to_scale_kernel<<<1, 1, 0, s>>>(scale_out, scale_ub);
    tensor_quant_kernel<scalar_t><<<rows, kThreads, 0, s>>>(static_cast<const scalar_t*>(x), x_rows,
                                                             out, scale_out, hidden);
  });
  return launch_status();
}

int dynamic_group_quant_fp8(DType dtype, const void* x, RowIndex x_rows, uint8_t* out,
                            float* scale_out, int64_t rows, int64_t hidden, int64_t group_size,
                            void* stream) {
  const int64_t groups = hidden / group_size;
  if (rows == 0 || groups == 0) return 0;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(groups));
  REFERENCE_CUDA_DISPATCH(dtype, group_quant_kernel<scalar_t><<<grid, kGroupThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const scalar_t*>(x), x_rows, out, scale_out, hidden, group_size));
  return launch_status();
}

}  // namespace reference_cuda
