// Device helpers shared by the reference CUDA kernels: fp32 <-> activation dtype conversion,
// rounding through the activation dtype, 16-byte vector units with a scalar fallback, warp and
// block reductions, row teams (a warp or a block per row), and dtype dispatch of launchers.
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

// Reduce `v` over aligned groups of `width` lanes (a power of two, at most 32) of a warp; every
// lane of the group gets the result. All 32 lanes of the warp must call it.
template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op, int width = 32) {
  for (int offset = width >> 1; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Reduce `v` over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `identity` pads the lanes of missing warps (0 for sums, 0 for absmax).
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float identity) {
  __shared__ float partial[32];
  __shared__ float result;
  v = warp_reduce(v, op);
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

// ----- 16-byte units -----------------------------------------------------------------------------
// A unit is kVec<T> consecutive elements (16 bytes of T). Rows are walked unit by unit: a full
// unit at a 16-byte aligned address is one vector load/store, anything else (the row's tail, or a
// row whose pointer is not aligned) goes element by element with bounds checks. Unit j0 starts
// at element j0 (a multiple of kVec<T>).
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

__device__ __forceinline__ bool aligned_to(const void* p, unsigned bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}
__device__ __forceinline__ bool aligned16(const void* p) { return aligned_to(p, 16); }

__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// f = p[j0, j0 + V) widened to fp32; elements at or past n read as 0.
template <typename T>
__device__ __forceinline__ void load_unit(const T* p, int64_t j0, int64_t n, bool vec,
                                          float (&f)[kVec<T>]) {
  constexpr int V = kVec<T>;
  if (vec && j0 + V <= n) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p + j0);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = to_float(e[k]);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = j0 + k < n ? to_float(p[j0 + k]) : 0.f;
  }
}

// p[j0, min(j0 + V, n)) = f rounded to T.
template <typename T>
__device__ __forceinline__ void store_unit(T* p, int64_t j0, int64_t n, bool vec,
                                           const float (&f)[kVec<T>]) {
  constexpr int V = kVec<T>;
  if (vec && j0 + V <= n) {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < V; ++k) e[k] = from_float<T>(f[k]);
    *reinterpret_cast<uint4*>(p + j0) = raw;
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (j0 + k < n) p[j0 + k] = from_float<T>(f[k]);
    }
  }
}

// Host side: whether every row start base + rows(r) (and so every unit) is 16-byte aligned.
template <typename T>
inline bool rows_aligned16(const void* base, const RowIndex& rows) {
  if ((reinterpret_cast<uintptr_t>(base) & 15) != 0) return false;
  for (int d = 0; d < rows.ndim; ++d) {
    if (rows.strides[d] % kVec<T> != 0) return false;
  }
  return true;
}

// ----- row teams ---------------------------------------------------------------------------------
// The threads that process one row: one warp per row for short rows (several rows per block, no
// block-wide synchronization), else the whole block.
struct RowTeam {
  int64_t row;
  int lane;
  int size;
};

template <bool kWarp>
__device__ __forceinline__ RowTeam row_team() {
  if constexpr (kWarp) {
    return {static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5),
            static_cast<int>(threadIdx.x & 31), 32};
  } else {
    return {static_cast<int64_t>(blockIdx.x), static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
  }
}

template <bool kWarp, typename Op>
__device__ __forceinline__ float team_reduce(float v, Op op, float identity) {
  if constexpr (kWarp) {
    return warp_reduce(v, op);
  } else {
    return block_reduce(v, op, identity);
  }
}

// Units a lane of a row team keeps in registers in the single-pass kernels (norms, per-token
// quant); rows of more units take a second pass over memory (mostly L2 hits).
constexpr int kTeamItems = 4;
constexpr int kWarpRowsPerBlock = 4;
// Largest block of a row-team kernel (its __launch_bounds__): 512 threads of up to ~128 registers.
constexpr int kMaxTeamThreads = 512;

// Launch shape of a row-team kernel for rows of `units` units: a warp per row while a warp can
// hold the row, else a block of enough threads for about two units each (64..kMaxTeamThreads).
struct TeamLaunch {
  bool warp;
  unsigned blocks;
  unsigned threads;
};

inline TeamLaunch team_launch(int64_t rows, int64_t units) {
  if (units <= 32 * kTeamItems) {
    return {true, static_cast<unsigned>(ceil_div(rows, kWarpRowsPerBlock)), 32u * kWarpRowsPerBlock};
  }
  int64_t threads = (ceil_div(units, 2) + 31) / 32 * 32;
  threads = threads < 64 ? 64 : (threads > kMaxTeamThreads ? kMaxTeamThreads : threads);
  return {false, static_cast<unsigned>(rows), static_cast<unsigned>(threads)};
}

// Launch shape of an element-wise row kernel: `lanes` threads per row (a power of two up to 256,
// several rows per 256-thread block for short rows), grid.y column blocks of `lanes` units.
struct RowsGrid {
  dim3 grid;
  int lanes;
};

constexpr int kRowsBlockThreads = 256;

inline RowsGrid rows_grid(int64_t rows, int64_t units) {
  int lanes = 1;
  while (lanes < units && lanes < kRowsBlockThreads) lanes <<= 1;
  const int64_t row_blocks = ceil_div(rows, kRowsBlockThreads / lanes);
  int64_t col_blocks = ceil_div(units, lanes);
  col_blocks = col_blocks < 1 ? 1 : (col_blocks > 65535 ? 65535 : col_blocks);
  return {dim3(static_cast<unsigned>(row_blocks), static_cast<unsigned>(col_blocks)), lanes};
}

// Row and first unit of this thread in a rows_grid launch; units then stride by gridDim.y * lanes.
__device__ __forceinline__ int64_t grid_row(int lanes) {
  return static_cast<int64_t>(blockIdx.x) * (blockDim.x / lanes) + threadIdx.x / lanes;
}
__device__ __forceinline__ int64_t grid_first_unit(int lanes) {
  return static_cast<int64_t>(blockIdx.y) * lanes + (threadIdx.x & (lanes - 1));
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
