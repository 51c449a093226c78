// fp8 (e4m3fn) quantization CUDA kernels: static scales, dynamic per token / per tensor (optional
// absmax upper bound), dynamic per group. Arithmetic as reference_impl/ir/ops/quant.py: x * (1 /
// scale) for static and dynamic scales, x / scale for group scales, clamp to +-448 (NaN passes),
// round-to-nearest-even encoding.
//
// Inputs are read in 16-byte units (scalar for tails and unaligned rows) and codes written as
// kVec<T> bytes at once. Per token: one row per team, the row held in registers between its
// absmax and its codes. Per tensor: an absmax pass (one atomic per block) into a workspace, then a
// quantizing pass that derives the scale from it. Per group: a team of up to 32 lanes per group.
#include <cuda_fp8.h>

#include "common.cuh"

namespace reference_cuda {
namespace {

constexpr int kAbsmaxBlocks = 1024;  // blocks of the per-tensor absmax pass (rows loop over them)
constexpr int kGroupBlockThreads = 256;
constexpr int kMaxGroupFallbackThreads = 128;

__device__ __forceinline__ uint8_t encode(float v) {
  v = v > kFp8Max ? kFp8Max : (v < -kFp8Max ? -kFp8Max : v);
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float dynamic_scale(float amax, const float* scale_ub) {
  if (scale_ub != nullptr) amax = nan_min(amax, *scale_ub);
  return nan_max(amax / kFp8Max, kFp8MinScale);
}

// out[j0, min(j0 + V, n)) = codes of f; one V-byte store when `vec` (out row V-byte aligned).
template <int V>
__device__ __forceinline__ void store_codes(uint8_t* out, int64_t j0, int64_t n, bool vec, const float (&f)[V]) {
  if (vec && j0 + V <= n) {
    uint64_t packed = 0;
#pragma unroll
    for (int k = 0; k < V; ++k) packed |= static_cast<uint64_t>(encode(f[k])) << (8 * k);
    if constexpr (V == 8) {
      *reinterpret_cast<uint2*>(out + j0) =
          make_uint2(static_cast<uint32_t>(packed), static_cast<uint32_t>(packed >> 32));
    } else {
      *reinterpret_cast<uint32_t*>(out + j0) = static_cast<uint32_t>(packed);
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (j0 + k < n) out[j0 + k] = encode(f[k]);
    }
  }
}

// x / s rounded exactly as the division, from r = 1 / s (correctly rounded): q0 = x * r, then
// one FMA correction with the exact remainder (Markstein's theorem), for finite s > 0; the
// division itself where s is inf or NaN. The correction loses the sign of a zero quotient
// (-0 + 0 = +0), so the sign is x's, as it is for x / s.
__device__ __forceinline__ float div_by_scale(float x, float s, float r) {
  if (!isfinite(s)) return x / s;
  const float q0 = __fmul_rn(x, r);
  return copysignf(fmaf(fmaf(-q0, s, x), r, q0), x);
}

template <int V>
__device__ __forceinline__ float unit_absmax(const float (&f)[V]) {
  float m = 0.f;
#pragma unroll
  for (int k = 0; k < V; ++k) m = nan_max(m, fabsf(f[k]));
  return m;
}

// ----- static ---------------------------------------------------------------------------------
// Scale groups of `group` features; the reciprocal 1 / scale is taken per unit (per element only
// where a unit straddles two groups).
template <typename T>
__global__ void static_quant_kernel(const T* __restrict__ x, RowIndex x_rows, const float* __restrict__ scale,
                                    RowIndex scale_rows, int64_t group_stride, int64_t group,
                                    uint8_t* __restrict__ out, int64_t rows, int64_t hidden, int lanes) {
  constexpr int V = kVec<T>;
  const int64_t row = grid_row(lanes);
  if (row >= rows) return;
  const T* xr = x + x_rows(row);
  const float* sr = scale + scale_rows(row);
  uint8_t* o = out + row * hidden;
  const bool vec = aligned16(xr) && aligned_to(o, V);
  for (int64_t u = grid_first_unit(lanes); u * V < hidden; u += static_cast<int64_t>(gridDim.y) * lanes) {
    const int64_t j0 = u * V;
    float v[V];
    load_unit(xr, j0, hidden, vec, v);
    const int64_t g0 = j0 / group;
    const int64_t last = (j0 + V <= hidden ? j0 + V : hidden) - 1;
    if (last / group == g0) {
      const float inv = 1.0f / sr[g0 * group_stride];
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] *= inv;
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if (j0 + k < hidden) v[k] *= 1.0f / sr[((j0 + k) / group) * group_stride];
      }
    }
    store_codes(o, j0, hidden, vec, v);
  }
}

// ----- dynamic per token ----------------------------------------------------------------------
template <typename T, bool kWarp>
__global__ void __launch_bounds__(kMaxTeamThreads)
    per_token_quant_kernel(const T* __restrict__ x, RowIndex x_rows, uint8_t* __restrict__ out,
                           float* __restrict__ scale_out, int64_t rows, int64_t hidden,
                           const float* __restrict__ scale_ub) {
  constexpr int V = kVec<T>;
  const RowTeam team = row_team<kWarp>();
  if (team.row >= rows) return;
  const T* xr = x + x_rows(team.row);
  uint8_t* o = out + team.row * hidden;
  const bool vec = aligned16(xr) && aligned_to(o, V);
  const int64_t stride = static_cast<int64_t>(team.size) * V;
  float m = 0.f;
  if (ceil_div(hidden, V) <= static_cast<int64_t>(kTeamItems) * team.size) {
    float v[kTeamItems][V];
#pragma unroll
    for (int i = 0; i < kTeamItems; ++i) {
      const int64_t j0 = team.lane * static_cast<int64_t>(V) + i * stride;
      if (j0 < hidden) {
        load_unit(xr, j0, hidden, vec, v[i]);
        m = nan_max(m, unit_absmax(v[i]));
      }
    }
    const float s = dynamic_scale(team_reduce<kWarp>(m, MaxOp{}, 0.f), scale_ub);
    if (team.lane == 0) scale_out[team.row] = s;
    const float inv = 1.0f / s;
#pragma unroll
    for (int i = 0; i < kTeamItems; ++i) {
      const int64_t j0 = team.lane * static_cast<int64_t>(V) + i * stride;
      if (j0 < hidden) {
#pragma unroll
        for (int k = 0; k < V; ++k) v[i][k] *= inv;
        store_codes(o, j0, hidden, vec, v[i]);
      }
    }
    return;
  }
  for (int64_t j0 = team.lane * static_cast<int64_t>(V); j0 < hidden; j0 += stride) {
    float v[V];
    load_unit(xr, j0, hidden, vec, v);
    m = nan_max(m, unit_absmax(v));
  }
  const float s = dynamic_scale(team_reduce<kWarp>(m, MaxOp{}, 0.f), scale_ub);
  if (team.lane == 0) scale_out[team.row] = s;
  const float inv = 1.0f / s;
  for (int64_t j0 = team.lane * static_cast<int64_t>(V); j0 < hidden; j0 += stride) {
    float v[V];
    load_unit(xr, j0, hidden, vec, v);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] *= inv;
    store_codes(o, j0, hidden, vec, v);
  }
}

// ----- dynamic per tensor ---------------------------------------------------------------------
// absmax of the rows, folded into *amax (float bits of a non-negative value or NaN order like
// ints). Each block loops over rows blockIdx.x, blockIdx.x + gridDim.x, ... and adds one atomic.
template <typename T>
__global__ void tensor_absmax_kernel(const T* __restrict__ x, RowIndex x_rows, float* amax, int64_t rows,
                                     int64_t hidden) {
  constexpr int V = kVec<T>;
  float m = 0.f;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + x_rows(row);
    const bool vec = aligned16(xr);
    for (int64_t j0 = threadIdx.x * static_cast<int64_t>(V); j0 < hidden; j0 += static_cast<int64_t>(blockDim.x) * V) {
      float v[V];
      load_unit(xr, j0, hidden, vec, v);
      m = nan_max(m, unit_absmax(v));
    }
  }
  m = block_reduce(m, MaxOp{}, 0.f);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
}

// Quantizes with the scale derived from the absmax pass; the first thread also stores the scale.
template <typename T>
__global__ void tensor_quant_kernel(const T* __restrict__ x, RowIndex x_rows, uint8_t* __restrict__ out,
                                    const float* __restrict__ amax, const float* __restrict__ scale_ub,
                                    float* __restrict__ scale_out, int64_t rows, int64_t hidden, int lanes) {
  constexpr int V = kVec<T>;
  const float s = dynamic_scale(*amax, scale_ub);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_out = s;
  const int64_t row = grid_row(lanes);
  if (row >= rows) return;
  const T* xr = x + x_rows(row);
  uint8_t* o = out + row * hidden;
  const bool vec = aligned16(xr) && aligned_to(o, V);
  const float inv = 1.0f / s;
  for (int64_t u = grid_first_unit(lanes); u * V < hidden; u += static_cast<int64_t>(gridDim.y) * lanes) {
    float v[V];
    load_unit(xr, u * V, hidden, vec, v);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] *= inv;
    store_codes(o, u * V, hidden, vec, v);
  }
}

// ----- dynamic per group ----------------------------------------------------------------------
// A team of `lanes` lanes (a power of two up to 32, inside one warp) per group of `group_size`
// features, each lane holding up to kTeamItems units. kVecRows: every group starts 16-byte aligned
// (decided on the host for the whole launch, so the lanes of a warp never diverge around the
// shuffles). Teams past the last group still take part in the shuffles.
template <typename T, bool kVecRows>
__global__ void group_quant_kernel(const T* __restrict__ x, RowIndex x_rows, uint8_t* __restrict__ out,
                                   float* __restrict__ scale_out, int64_t rows, int64_t groups, int64_t hidden,
                                   int64_t group_size, int lanes) {
  constexpr int V = kVec<T>;
  const int64_t gid = static_cast<int64_t>(blockIdx.x) * (blockDim.x / lanes) + threadIdx.x / lanes;
  const int lane = threadIdx.x & (lanes - 1);
  const bool valid = gid < rows * groups;
  const int64_t row = valid ? gid / groups : 0, g = valid ? gid % groups : 0;
  const T* xg = x + x_rows(row) + g * group_size;
  uint8_t* o = out + row * hidden + g * group_size;
  float v[kTeamItems][V];
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < kTeamItems; ++i) {
    const int64_t j0 = (lane + static_cast<int64_t>(i) * lanes) * V;
    if (valid && j0 < group_size) {
      load_unit(xg, j0, group_size, kVecRows, v[i]);
      m = nan_max(m, unit_absmax(v[i]));
    }
  }
  const float s = dynamic_scale(warp_reduce(m, MaxOp{}, lanes), nullptr);
  if (!valid) return;
  if (lane == 0) scale_out[gid] = s;
  const float r = 1.0f / s;
#pragma unroll
  for (int i = 0; i < kTeamItems; ++i) {
    const int64_t j0 = (lane + static_cast<int64_t>(i) * lanes) * V;
    if (j0 < group_size) {
#pragma unroll
      for (int k = 0; k < V; ++k) v[i][k] = div_by_scale(v[i][k], s, r);
      store_codes(o, j0, group_size, kVecRows, v[i]);
    }
  }
}

// Groups too long for a warp team: one block per (row, group), two passes over the group.
template <typename T>
__global__ void long_group_quant_kernel(const T* __restrict__ x, RowIndex x_rows, uint8_t* __restrict__ out,
                                        float* __restrict__ scale_out, int64_t hidden, int64_t group_size) {
  constexpr int V = kVec<T>;
  const int64_t row = blockIdx.x, g = blockIdx.y;
  const T* xg = x + x_rows(row) + g * group_size;
  uint8_t* o = out + row * hidden + g * group_size;
  const bool vec = aligned16(xg) && aligned_to(o, V);
  const int64_t stride = static_cast<int64_t>(blockDim.x) * V;
  float m = 0.f;
  for (int64_t j0 = threadIdx.x * static_cast<int64_t>(V); j0 < group_size; j0 += stride) {
    float v[V];
    load_unit(xg, j0, group_size, vec, v);
    m = nan_max(m, unit_absmax(v));
  }
  const float s = dynamic_scale(block_reduce(m, MaxOp{}, 0.f), nullptr);
  if (threadIdx.x == 0) scale_out[row * gridDim.y + g] = s;
  const float r = 1.0f / s;
  for (int64_t j0 = threadIdx.x * static_cast<int64_t>(V); j0 < group_size; j0 += stride) {
    float v[V];
    load_unit(xg, j0, group_size, vec, v);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = div_by_scale(v[k], s, r);
    store_codes(o, j0, group_size, vec, v);
  }
}

template <typename T>
void launch_static(const void* x, RowIndex x_rows, const float* scale, RowIndex scale_rows, int64_t group_stride,
                   int64_t groups, uint8_t* out, int64_t rows, int64_t hidden, cudaStream_t stream) {
  const RowsGrid g = rows_grid(rows, ceil_div(hidden, kVec<T>));
  static_quant_kernel<T><<<g.grid, kRowsBlockThreads, 0, stream>>>(
      static_cast<const T*>(x), x_rows, scale, scale_rows, group_stride, hidden / groups, out, rows, hidden, g.lanes);
}

template <typename T>
void launch_per_token(const void* x, RowIndex x_rows, uint8_t* out, float* scale_out, int64_t rows, int64_t hidden,
                      const float* scale_ub, cudaStream_t stream) {
  const TeamLaunch l = team_launch(rows, ceil_div(hidden, kVec<T>));
  auto go = [&](auto kernel) {
    kernel<<<l.blocks, l.threads, 0, stream>>>(static_cast<const T*>(x), x_rows, out, scale_out, rows, hidden,
                                              scale_ub);
  };
  if (l.warp) {
    go(per_token_quant_kernel<T, true>);
  } else {
    go(per_token_quant_kernel<T, false>);
  }
}

template <typename T>
void launch_per_tensor(const void* x, RowIndex x_rows, uint8_t* out, float* scale_out, float* amax, int64_t rows,
                       int64_t hidden, const float* scale_ub, cudaStream_t stream) {
  const unsigned absmax_blocks = static_cast<unsigned>(rows < kAbsmaxBlocks ? rows : kAbsmaxBlocks);
  tensor_absmax_kernel<T><<<absmax_blocks, kRowsBlockThreads, 0, stream>>>(static_cast<const T*>(x), x_rows, amax,
                                                                           rows, hidden);
  const RowsGrid g = rows_grid(rows, ceil_div(hidden, kVec<T>));
  tensor_quant_kernel<T><<<g.grid, kRowsBlockThreads, 0, stream>>>(static_cast<const T*>(x), x_rows, out, amax,
                                                                   scale_ub, scale_out, rows, hidden, g.lanes);
}

template <typename T>
void launch_group(const void* x, RowIndex x_rows, uint8_t* out, float* scale_out, int64_t rows, int64_t hidden,
                  int64_t group_size, cudaStream_t stream) {
  constexpr int V = kVec<T>;
  const int64_t groups = hidden / group_size;
  const int64_t units = ceil_div(group_size, V);
  if (units > 32 * kTeamItems) {
    const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(groups));
    long_group_quant_kernel<T><<<grid, kMaxGroupFallbackThreads, 0, stream>>>(static_cast<const T*>(x), x_rows, out,
                                                                              scale_out, hidden, group_size);
    return;
  }
  int lanes = 1;
  while (lanes < units && lanes < 32) lanes <<= 1;
  const unsigned blocks = static_cast<unsigned>(ceil_div(rows * groups, kGroupBlockThreads / lanes));
  const bool vec = rows_aligned16<T>(x, x_rows) && group_size % V == 0 &&
                   (reinterpret_cast<uintptr_t>(out) % V) == 0;
  auto go = [&](auto kernel) {
    kernel<<<blocks, kGroupBlockThreads, 0, stream>>>(static_cast<const T*>(x), x_rows, out, scale_out, rows,
                                                      groups, hidden, group_size, lanes);
  };
  if (vec) {
    go(group_quant_kernel<T, true>);
  } else {
    go(group_quant_kernel<T, false>);
  }
}

}  // namespace

int static_quant_fp8(DType dtype, const void* x, RowIndex x_rows, const float* scale,
                     RowIndex scale_rows, int64_t scale_group_stride, int64_t groups, uint8_t* out,
                     int64_t rows, int64_t hidden, void* stream) {
  if (rows == 0 || hidden == 0) return 0;
  REFERENCE_CUDA_DISPATCH(dtype, launch_static<scalar_t>(x, x_rows, scale, scale_rows, scale_group_stride, groups,
                                                         out, rows, hidden, static_cast<cudaStream_t>(stream)));
  return launch_status();
}

int dynamic_quant_fp8(DType dtype, const void* x, RowIndex x_rows, uint8_t* out, float* scale_out,
                      float* amax_workspace, int64_t rows, int64_t hidden, bool per_token,
                      const float* scale_ub, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (per_token) {
    if (rows == 0) return 0;
    REFERENCE_CUDA_DISPATCH(dtype, launch_per_token<scalar_t>(x, x_rows, out, scale_out, rows, hidden, scale_ub, s));
    return launch_status();
  }
  if (rows == 0 || hidden == 0) return static_cast<int>(cudaErrorInvalidValue);
  const cudaError_t zeroed = cudaMemsetAsync(amax_workspace, 0, sizeof(float), s);
  if (zeroed != cudaSuccess) return static_cast<int>(zeroed);
  REFERENCE_CUDA_DISPATCH(dtype, launch_per_tensor<scalar_t>(x, x_rows, out, scale_out, amax_workspace, rows, hidden,
                                                             scale_ub, s));
  return launch_status();
}

int dynamic_group_quant_fp8(DType dtype, const void* x, RowIndex x_rows, uint8_t* out,
                            float* scale_out, int64_t rows, int64_t hidden, int64_t group_size,
                            void* stream) {
  if (rows == 0 || group_size <= 0 || hidden / group_size == 0) return 0;
  REFERENCE_CUDA_DISPATCH(dtype, launch_group<scalar_t>(x, x_rows, out, scale_out, rows, hidden, group_size,
                                                        static_cast<cudaStream_t>(stream)));
  return launch_status();
}

}  // namespace reference_cuda
