// Rotary embedding CUDA kernel, in place on query and key: one block per token, threads over
// (head, pair). cos/sin are rounded to the activation dtype and each product is rounded too,
// matching the native op's arithmetic in that dtype (reference_impl/ir/ops/rotary.py).
#include "common.cuh"

namespace reference_cuda {
namespace {

constexpr int kThreads = 128;

template <typename T, typename C>
__device__ __forceinline__ void rotate(T* head, const C* row, int64_t i, int64_t half, bool is_neox) {
  const float c = round_to<T>(to_float(row[i]));
  const float s = round_to<T>(to_float(row[half + i]));
  const int64_t i1 = is_neox ? i : 2 * i;
  const int64_t i2 = is_neox ? i + half : 2 * i + 1;
  const float x1 = to_float(head[i1]), x2 = to_float(head[i2]);
  head[i1] = from_float<T>(round_to<T>(x1 * c) - round_to<T>(x2 * s));
  head[i2] = from_float<T>(round_to<T>(x2 * c) + round_to<T>(x1 * s));
}

template <typename T, typename C>
__global__ void rotary_kernel(const int64_t* __restrict__ positions, HeadsView query, HeadsView key,
                              const C* __restrict__ cache, int64_t cache_stride, int64_t half,
                              bool is_neox) {
  const int64_t t = blockIdx.x;
  const C* row = cache + positions[t] * cache_stride;
  T* q = static_cast<T*>(query.data) + query.tokens(t);
  T* k = key.data != nullptr ? static_cast<T*>(key.data) + key.tokens(t) : nullptr;
  const int64_t q_work = query.heads * half;
  const int64_t work = q_work + (k != nullptr ? key.heads * half : 0);
  for (int64_t w = threadIdx.x; w < work; w += blockDim.x) {
    if (w < q_work) {
      rotate<T, C>(q + (w / half) * query.head_stride, row, w % half, half, is_neox);
    } else {
      const int64_t kw = w - q_work;
      rotate<T, C>(k + (kw / half) * key.head_stride, row, kw % half, half, is_neox);
    }
  }
}

}  // namespace

int rotary_embedding(DType dtype, const int64_t* positions, int64_t tokens, HeadsView query,
                     HeadsView key, const void* cache, bool cache_is_float, int64_t cache_stride,
                     int64_t rot_dim, bool is_neox, void* stream) {
  const int64_t half = rot_dim / 2;
  if (tokens == 0 || half == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  REFERENCE_CUDA_DISPATCH(dtype, {
    if (cache_is_float) {
      rotary_kernel<scalar_t, float><<<tokens, kThreads, 0, s>>>(
          positions, query, key, static_cast<const float*>(cache), cache_stride, half, is_neox);
    } else {
      rotary_kernel<scalar_t, scalar_t><<<tokens, kThreads, 0, s>>>(
          positions, query, key, static_cast<const scalar_t*>(cache), cache_stride, half, is_neox);
    }
  });
  return launch_status();
}

}  // namespace reference_cuda
