// Rotary embedding CUDA kernel, in place on query and key: one block per token. The token's cos/sin
// row is read once into shared memory, rounded to the activation dtype; threads then walk (head,
// unit) work items in 16-byte units of the head (scalar for tails and unaligned heads). Each
// product is rounded to the activation dtype too, matching the native op's arithmetic in that
// dtype (reference_impl/ir/ops/rotary.py).
//
// Units: neox pairs (i, i + half) take unit i0 of both halves (x1 = head[i0..], x2 = head[half +
// i0..]); GPT-J pairs (2i, 2i + 1) lie inside one unit of the first rot_dim features.
#include "common.cuh"

namespace reference_cuda {
namespace {

constexpr int kMaxThreads = 256;

// o1 = x1 * c - x2 * s, o2 = x2 * c + x1 * s, every product and result rounded to T.
template <typename T>
__device__ __forceinline__ void rotate_pair(float& x1, float& x2, float c, float s) {
  const float o1 = round_to<T>(x1 * c) - round_to<T>(x2 * s);
  const float o2 = round_to<T>(x2 * c) + round_to<T>(x1 * s);
  x1 = o1;
  x2 = o2;
}

template <typename T>
__device__ __forceinline__ void rotate_unit(T* head, int u, int half, bool is_neox, bool vec,
                                            const float* cos_t, const float* sin_t) {
  constexpr int V = kVec<T>;
  const int64_t j0 = static_cast<int64_t>(u) * V;
  if (is_neox) {
    float a[V], b[V];
    load_unit(head, j0, half, vec, a);
    load_unit(head + half, j0, half, vec, b);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int i = static_cast<int>(j0) + k;
      if (i < half) rotate_pair<T>(a[k], b[k], cos_t[i], sin_t[i]);
    }
    store_unit(head, j0, half, vec, a);
    store_unit(head + half, j0, half, vec, b);
  } else {
    float a[V];
    load_unit(head, j0, 2 * half, vec, a);
#pragma unroll
    for (int k = 0; k < V; k += 2) {
      const int i = (static_cast<int>(j0) + k) / 2;
      if (i < half) rotate_pair<T>(a[k], a[k + 1], cos_t[i], sin_t[i]);
    }
    store_unit(head, j0, 2 * half, vec, a);
  }
}

template <typename T, typename C>
__global__ void rotary_kernel(const int64_t* __restrict__ positions, HeadsView query, HeadsView key,
                              const C* __restrict__ cache, int64_t cache_stride, int half, bool is_neox) {
  constexpr int V = kVec<T>;
  extern __shared__ float cos_sin[];  // [2 * half]: cos, then sin, rounded to T
  const int64_t t = blockIdx.x;
  const C* row = cache + positions[t] * cache_stride;
  for (int i = threadIdx.x; i < 2 * half; i += blockDim.x) cos_sin[i] = round_to<T>(to_float(row[i]));
  __syncthreads();

  T* q = static_cast<T*>(query.data) + query.tokens(t);
  T* k = key.data != nullptr ? static_cast<T*>(key.data) + key.tokens(t) : nullptr;
  // Units per head: of each half (neox) or of the rot_dim features (GPT-J).
  const int per_head = static_cast<int>(ceil_div(is_neox ? half : 2 * half, V));
  const bool vec_layout = !is_neox || half % V == 0;
  const bool q_vec = vec_layout && aligned16(q) && query.head_stride % V == 0;
  const bool k_vec = vec_layout && k != nullptr && aligned16(k) && key.head_stride % V == 0;
  const int q_work = static_cast<int>(query.heads) * per_head;
  const int work = q_work + (k != nullptr ? static_cast<int>(key.heads) * per_head : 0);
  for (int w = threadIdx.x; w < work; w += blockDim.x) {
    if (w < q_work) {
      rotate_unit<T>(q + (w / per_head) * query.head_stride, w % per_head, half, is_neox, q_vec, cos_sin,
                     cos_sin + half);
    } else {
      const int kw = w - q_work;
      rotate_unit<T>(k + (kw / per_head) * key.head_stride, kw % per_head, half, is_neox, k_vec, cos_sin,
                     cos_sin + half);
    }
  }
}

template <typename T>
void launch_rotary(const int64_t* positions, int64_t tokens, HeadsView query, HeadsView key, const void* cache,
                   bool cache_is_float, int64_t cache_stride, int half, bool is_neox, cudaStream_t stream) {
  const int64_t per_head = ceil_div(is_neox ? half : 2 * half, kVec<T>);
  const int64_t work = (query.heads + (key.data != nullptr ? key.heads : 0)) * per_head;
  int64_t threads = (work + 31) / 32 * 32;
  threads = threads < 32 ? 32 : (threads > kMaxThreads ? kMaxThreads : threads);
  const size_t smem = 2 * static_cast<size_t>(half) * sizeof(float);
  if (cache_is_float) {
    rotary_kernel<T, float><<<tokens, threads, smem, stream>>>(
        positions, query, key, static_cast<const float*>(cache), cache_stride, half, is_neox);
  } else {
    rotary_kernel<T, T><<<tokens, threads, smem, stream>>>(
        positions, query, key, static_cast<const T*>(cache), cache_stride, half, is_neox);
  }
}

}  // namespace

int rotary_embedding(DType dtype, const int64_t* positions, int64_t tokens, HeadsView query,
                     HeadsView key, const void* cache, bool cache_is_float, int64_t cache_stride,
                     int64_t rot_dim, bool is_neox, void* stream) {
  const int64_t half = rot_dim / 2;
  if (tokens == 0 || half == 0) return 0;
  // Work items of one token are counted in int, and cos/sin must fit in 48 KB of shared memory.
  const int64_t heads = query.heads + (key.data != nullptr ? key.heads : 0);
  if (half > 6144 || heads * rot_dim > (int64_t{1} << 30)) return static_cast<int>(cudaErrorInvalidValue);
  REFERENCE_CUDA_DISPATCH(dtype, launch_rotary<scalar_t>(positions, tokens, query, key, cache, cache_is_float,
                                                         cache_stride, static_cast<int>(half), is_neox,
                                                         static_cast<cudaStream_t>(stream)));
  return launch_status();
}

}  // namespace reference_cuda
