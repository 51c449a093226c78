// RMS norm CUDA kernels, one row per team (a warp for short rows, else a block). A row of up to
// kTeamItems units per lane is read once in 16-byte units and held in registers: the fp32 sum of
// squares of the first n_var features is reduced by warp shuffles, then the lane writes
// cast(cast(x * inv_rms) * w) from its registers (as the native rms_norm of the IR). Longer
// rows read the row a second time. The fused form holds s = x + residual in fp32 and writes
// residual = cast(s) and x = normalized s in place: each element is read and then written by the
// same lane, so the in-place update is safe.
#include "common.cuh"

namespace reference_cuda {
namespace {

__device__ __forceinline__ float inv_rms(float sum_sq, int64_t n_var, float eps) {
  return rsqrtf(sum_sq / static_cast<float>(n_var) + eps);
}

// cast(v * inv) to T's precision, times the weight (has_w) in fp32.
template <typename T>
__device__ __forceinline__ float normalize(float v, float inv, bool has_w, float w) {
  v *= inv;
  return has_w ? round_to<T>(v) * w : v;
}

// Squares of the unit's elements below n_var.
template <int V>
__device__ __forceinline__ float unit_sum_sq(const float (&v)[V], int64_t j0, int64_t n_var) {
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < V; ++k) acc += j0 + k < n_var ? v[k] * v[k] : 0.f;
  return acc;
}

// Writes unit j0 of the normalized row (values v, already in fp32) to o.
template <typename T>
__device__ __forceinline__ void write_normalized(T* o, const T* w, int64_t j0, int64_t hidden, bool vec,
                                                 const float (&v)[kVec<T>], float inv) {
  constexpr int V = kVec<T>;
  float wv[V];
  if (w != nullptr) load_unit(w, j0, hidden, vec, wv);
  float r[V];
#pragma unroll
  for (int k = 0; k < V; ++k) r[k] = normalize<T>(v[k], inv, w != nullptr, w != nullptr ? wv[k] : 0.f);
  store_unit(o, j0, hidden, vec, r);
}

template <typename T, bool kWarp>
__global__ void __launch_bounds__(kMaxTeamThreads)
    rms_norm_kernel(const T* __restrict__ x, RowIndex x_rows, const T* __restrict__ w, T* __restrict__ out,
                    int64_t rows, int64_t hidden, int64_t n_var, float eps) {
  constexpr int V = kVec<T>;
  const RowTeam team = row_team<kWarp>();
  if (team.row >= rows) return;  // whole warps only (warp teams); a block team always has a row
  const T* xr = x + x_rows(team.row);
  T* o = out + team.row * hidden;
  const bool vec = aligned16(xr) && aligned16(o) && (w == nullptr || aligned16(w));
  const int64_t units = ceil_div(hidden, V);
  float acc = 0.f;
  if (units <= static_cast<int64_t>(kTeamItems) * team.size) {
    float v[kTeamItems][V];
#pragma unroll
    for (int i = 0; i < kTeamItems; ++i) {
      const int64_t j0 = (team.lane + static_cast<int64_t>(i) * team.size) * V;
      if (j0 < hidden) {
        load_unit(xr, j0, hidden, vec, v[i]);
        acc += unit_sum_sq(v[i], j0, n_var);
      }
    }
    const float inv = inv_rms(team_reduce<kWarp>(acc, SumOp{}, 0.f), n_var, eps);
#pragma unroll
    for (int i = 0; i < kTeamItems; ++i) {
      const int64_t j0 = (team.lane + static_cast<int64_t>(i) * team.size) * V;
      if (j0 < hidden) write_normalized(o, w, j0, hidden, vec, v[i], inv);
    }
    return;
  }
  for (int64_t j0 = static_cast<int64_t>(team.lane) * V; j0 < hidden; j0 += static_cast<int64_t>(team.size) * V) {
    float v[V];
    load_unit(xr, j0, hidden, vec, v);
    acc += unit_sum_sq(v, j0, n_var);
  }
  const float inv = inv_rms(team_reduce<kWarp>(acc, SumOp{}, 0.f), n_var, eps);
  for (int64_t j0 = static_cast<int64_t>(team.lane) * V; j0 < hidden; j0 += static_cast<int64_t>(team.size) * V) {
    float v[V];
    load_unit(xr, j0, hidden, vec, v);
    write_normalized(o, w, j0, hidden, vec, v, inv);
  }
}

// s = x + residual for unit j0 (fp32).
template <typename T>
__device__ __forceinline__ void load_sum(const T* xr, const T* rr, int64_t j0, int64_t hidden, bool vec,
                                         float (&s)[kVec<T>]) {
  constexpr int V = kVec<T>;
  float r[V];
  load_unit(xr, j0, hidden, vec, s);
  load_unit(rr, j0, hidden, vec, r);
#pragma unroll
  for (int k = 0; k < V; ++k) s[k] += r[k];
}

template <typename T, bool kWarp>
__global__ void __launch_bounds__(kMaxTeamThreads)
    fused_add_rms_norm_kernel(T* x, RowIndex x_rows, T* residual, RowIndex res_rows, const T* __restrict__ w,
                              int64_t rows, int64_t hidden, int64_t n_var, float eps) {
  constexpr int V = kVec<T>;
  const RowTeam team = row_team<kWarp>();
  if (team.row >= rows) return;
  T* xr = x + x_rows(team.row);
  T* rr = residual + res_rows(team.row);
  const bool vec = aligned16(xr) && aligned16(rr) && (w == nullptr || aligned16(w));
  const int64_t units = ceil_div(hidden, V);
  float acc = 0.f;
  if (units <= static_cast<int64_t>(kTeamItems) * team.size) {
    float s[kTeamItems][V];
#pragma unroll
    for (int i = 0; i < kTeamItems; ++i) {
      const int64_t j0 = (team.lane + static_cast<int64_t>(i) * team.size) * V;
      if (j0 < hidden) {
        load_sum(xr, rr, j0, hidden, vec, s[i]);
        acc += unit_sum_sq(s[i], j0, n_var);
      }
    }
    const float inv = inv_rms(team_reduce<kWarp>(acc, SumOp{}, 0.f), n_var, eps);
#pragma unroll
    for (int i = 0; i < kTeamItems; ++i) {
      const int64_t j0 = (team.lane + static_cast<int64_t>(i) * team.size) * V;
      if (j0 < hidden) {
        store_unit(rr, j0, hidden, vec, s[i]);
        write_normalized(xr, w, j0, hidden, vec, s[i], inv);
      }
    }
    return;
  }
  for (int64_t j0 = static_cast<int64_t>(team.lane) * V; j0 < hidden; j0 += static_cast<int64_t>(team.size) * V) {
    float s[V];
    load_sum(xr, rr, j0, hidden, vec, s);
    acc += unit_sum_sq(s, j0, n_var);
  }
  const float inv = inv_rms(team_reduce<kWarp>(acc, SumOp{}, 0.f), n_var, eps);
  for (int64_t j0 = static_cast<int64_t>(team.lane) * V; j0 < hidden; j0 += static_cast<int64_t>(team.size) * V) {
    float s[V];
    load_sum(xr, rr, j0, hidden, vec, s);
    store_unit(rr, j0, hidden, vec, s);
    write_normalized(xr, w, j0, hidden, vec, s, inv);
  }
}

template <typename T>
void launch_rms_norm(const void* x, RowIndex x_rows, const void* weight, void* out, int64_t rows,
                     int64_t hidden, int64_t n_var, float eps, cudaStream_t stream) {
  const TeamLaunch l = team_launch(rows, ceil_div(hidden, kVec<T>));
  auto args = [&](auto kernel) {
    kernel<<<l.blocks, l.threads, 0, stream>>>(static_cast<const T*>(x), x_rows, static_cast<const T*>(weight),
                                              static_cast<T*>(out), rows, hidden, n_var, eps);
  };
  if (l.warp) {
    args(rms_norm_kernel<T, true>);
  } else {
    args(rms_norm_kernel<T, false>);
  }
}

template <typename T>
void launch_fused_add_rms_norm(void* x, RowIndex x_rows, void* residual, RowIndex res_rows,
                               const void* weight, int64_t rows, int64_t hidden, int64_t n_var,
                               float eps, cudaStream_t stream) {
  const TeamLaunch l = team_launch(rows, ceil_div(hidden, kVec<T>));
  auto args = [&](auto kernel) {
    kernel<<<l.blocks, l.threads, 0, stream>>>(static_cast<T*>(x), x_rows, static_cast<T*>(residual), res_rows,
                                              static_cast<const T*>(weight), rows, hidden, n_var, eps);
  };
  if (l.warp) {
    args(fused_add_rms_norm_kernel<T, true>);
  } else {
    args(fused_add_rms_norm_kernel<T, false>);
  }
}

}  // namespace

int rms_norm(DType dtype, const void* x, RowIndex x_rows, const void* weight, void* out, int64_t rows,
             int64_t hidden, int64_t n_var, float eps, void* stream) {
  if (rows == 0 || hidden == 0) return 0;
  REFERENCE_CUDA_DISPATCH(dtype, launch_rms_norm<scalar_t>(x, x_rows, weight, out, rows, hidden, n_var, eps,
                                                           static_cast<cudaStream_t>(stream)));
  return launch_status();
}

int fused_add_rms_norm(DType dtype, void* x, RowIndex x_rows, void* residual, RowIndex res_rows,
                       const void* weight, int64_t rows, int64_t hidden, int64_t n_var, float eps,
                       void* stream) {
  if (rows == 0 || hidden == 0) return 0;
  REFERENCE_CUDA_DISPATCH(dtype, launch_fused_add_rms_norm<scalar_t>(x, x_rows, residual, res_rows, weight, rows,
                                                                     hidden, n_var, eps,
                                                                     static_cast<cudaStream_t>(stream)));
  return launch_status();
}

}  // namespace reference_cuda
