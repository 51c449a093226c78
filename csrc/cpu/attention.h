// Raw-pointer entry points of the paged-attention kernels (attention.cpp), bound as
// reference_cpu::reshape_and_cache and reference_cpu::paged_attention by attention_bindings.cpp.
//
// The paged KV cache of one layer is a [num_blocks, num_kv_heads, block_size, 2 * head_size] tensor (the
// attention contract's shape), slot s = block * block_size + offset, each (block, head) contiguous. Inside
// a (block, head) the kernels keep their own packing: the block's keys transposed, [head_size, block_size]
// (key of offset t in column t), then its values as rows, [block_size, head_size], so a decode's scores
// are broadcast query elements times vectors of keys with no reduction (as vLLM's CPU writer packs them).
// bf16 "auto" caches whose head and block sizes are multiples of 32 are packed in pairs instead where the CPU
// has AMX-BF16 and the build is AVX512_BF16 (kv_cache_pairs): the keys [head_size / 2, block_size, 2] (elements
// 2i and 2i + 1 of a key side by side) and the values [block_size / 2, head_size, 2] (element d of two
// consecutive tokens side by side), the operand layout of AMX's TDPBF16PS, so the tiles load them in place.
// Its elements are the model dtype (kv_cache_dtype "auto") or fp8 codes (e4m3fn / e5m2) of k / k_scale
// and v / v_scale, rounded to nearest even with saturation. Semantics: csrc/README.md (attention) and
// the float64 reference in tests/kernels/test_attention_cpu.py.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace reference_cpu {

enum class KvFormat : int { kAuto = 0, kFp8E4m3 = 1, kFp8E5m2 = 2 };

// The cache of one layer: element strides of its block and head dims (a head's block contiguous).
// `data` holds T (kAuto) or uint8 fp8 codes.
struct PagedCache {
  void* data = nullptr;
  int64_t num_blocks = 0;
  int64_t kv_heads = 0;
  int64_t block_size = 0;
  int64_t head_size = 0;
  int64_t stride_block = 0;
  int64_t stride_head = 0;
  KvFormat format = KvFormat::kAuto;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

// A [tokens, heads, head_size] operand with any token and head strides (elements).
template <typename T>
struct HeadRows {
  T* data = nullptr;
  int64_t stride_token = 0;
  int64_t stride_head = 0;
};

// Writes key/value rows of `tokens` tokens into their slots; slots < 0 are skipped.
// Slots are checked by the binding (< num_blocks * block_size).
template <typename T>
void reshape_and_cache(HeadRows<const T> key, HeadRows<const T> value, const int64_t* slots,
                       int64_t tokens, const PagedCache& cache);

// Whether reshape_and_cache and paged_attention keep a bf16 "auto" cache of these sizes in the paired layout
// above (on this CPU, this build).
bool kv_cache_pairs(int64_t head_size, int64_t block_size);

// The batch's metadata and the layer's attention features.
struct PagedBatch {
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1]
  const int32_t* seq_lens = nullptr;         // [num_seqs]
  const int32_t* block_table = nullptr;      // [num_seqs, block_table_stride]
  int64_t block_table_stride = 0;
  int64_t num_seqs = 0;
};

struct AttentionFeatures {
  int64_t num_heads = 0;
  float scale = 1.0f;
  bool causal = true;
  int64_t sliding_window = -1;      // <= 0: none; else keys j > p - w (and j < p + w when not causal)
  float logits_soft_cap = 0.0f;     // 0: none; else s = cap * tanh(s / cap)
  const float* alibi_slopes = nullptr;  // [num_heads] or null: s += -slope * (p - j)
  const float* sinks = nullptr;         // [num_heads] or null: an extra logit with a zero value
};

// output rows [0, query_start_loc[num_seqs]) = attention of the query rows over the paged cache.
template <typename T>
void paged_attention(HeadRows<T> output, HeadRows<const T> query, const PagedCache& cache,
                     const PagedBatch& batch, const AttentionFeatures& features);

}  // namespace reference_cpu
