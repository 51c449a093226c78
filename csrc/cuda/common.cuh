// Device helpers shared by the reference CUDA kernels: fp32 <-> activation dtype conversion,
// rounding through the activation dtype, block-wide reductions, and dtype dispatch of launchers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels.h"

namespace reference_cuda {

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// The value the native op sees after an intermediate cast to T.
template <typename T>
__device__ __forceinline__ float round_to(float v) { return to_float<T>(from_float<T>(v)); }

__device__ __forceinline__ float nan_max(float a, float b) { return (isnan(a) || a > b) ? a : b; }
__device__ __forceinline__ float nan_min(float a, float b) { return (isnan(a) || a < b) ? a : b; }

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return nan_max(a, b); }
};

// Reduce `v` over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `identity` pads the lanes of missing warps (0 for sums, 0 for absmax).
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float identity) {
  __shared__ float partial[32];
  __shared__ float result;
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x >> 5;
    float w = lane < warps ? partial[lane] : identity;
    for (int offset = 16; offset > 0; offset >>= 1) w = op(w, __shfl_xor_sync(0xffffffffu, w, offset));
    if (lane == 0) result = w;
  }
  __syncthreads();
  return result;
}

constexpr float kFp8Max = 448.0f;
constexpr float kFp8MinScale = 1.0f / (448.0f * 512.0f);

inline int launch_status() { return static_cast<int>(cudaGetLastError()); }

}  // namespace reference_cuda

// Runs BODY with scalar_t bound to the device type of `dtype`.
#define REFERENCE_CUDA_DISPATCH(dtype, ...)                                 \
  switch (dtype) {                                                          \
    case ::reference_cuda::DType::kFloat32: {                               \
      using scalar_t = float;                                               \
      __VA_ARGS__;                                                          \
      break;                                                                \
    }                                                                       \
    case ::reference_cuda::DType::kFloat16: {                               \
      using scalar_t = __half;                                              \
      __VA_ARGS__;                                                          \
      break;                                                                \
    }                                                                       \
    case ::reference_cuda::DType::kBFloat16: {                              \
      using scalar_t = __nv_bfloat16;                                       \
      __VA_ARGS__;                                                          \
      break;                                                                \
    }                                                                       \
    default:                                                                \
      return static_cast<int>(cudaErrorInvalidValue);                       \
  }
