// Torch ops reference_cpu::reshape_and_cache and reference_cpu::paged_attention: argument checks
// (every message names the argument and what is wrong) and dtype dispatch for attention.cpp.
// CPU-only ops, so they are declared here as a fragment of the library rather than in the schemas
// shared with the CUDA library (../common/schemas.inc).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <string>

#include "attention.h"
#include "cpu_bindings.h"

namespace reference_cpu {
namespace {

KvFormat kv_format(c10::string_view name, const char* op) {
  if (name == "auto") return KvFormat::kAuto;
  if (name == "fp8" || name == "fp8_e4m3") return KvFormat::kFp8E4m3;
  if (name == "fp8_e5m2") return KvFormat::kFp8E5m2;
  TORCH_CHECK(false, op, ": kv_cache_dtype '", std::string(name),
              "' is not supported (auto, fp8, fp8_e4m3, fp8_e5m2)");
}

// A [tokens, heads, head_size] tensor with a contiguous last dim.
void check_head_rows(const at::Tensor& t, int64_t heads, int64_t head_size, const char* op, const char* name) {
  check_float(t, op, name);
  TORCH_CHECK(t.dim() == 3 && t.size(1) == heads && t.size(2) == head_size, op, ": ", name,
              " must be [num_tokens, ", heads, ", ", head_size, "], got ", t.sizes());
  TORCH_CHECK(head_size <= 1 || t.stride(2) == 1, op, ": ", name, " must be contiguous in its last dim (stride ",
              t.stride(2), ")");
}

template <typename T>
HeadRows<T> head_rows(const at::Tensor& t) {
  HeadRows<T> r;
  r.data = static_cast<T*>(const_cast<void*>(t.const_data_ptr()));
  r.stride_token = t.stride(0);
  r.stride_head = t.stride(1);
  return r;
}

// The cache's geometry; its dtype must be `model` for kAuto, uint8 for fp8.
PagedCache paged_cache(const at::Tensor& kv_cache, at::ScalarType model, KvFormat format, double k_scale,
                       double v_scale, const char* op) {
  TORCH_CHECK(kv_cache.device().is_cpu(), op, ": kv_cache must be a CPU tensor, got ", kv_cache.device());
  TORCH_CHECK(kv_cache.dim() == 4 && kv_cache.size(3) % 2 == 0, op,
              ": kv_cache must be [num_blocks, num_kv_heads, block_size, 2 * head_size], got ", kv_cache.sizes());
  TORCH_CHECK(kv_cache.size(3) <= 1 || kv_cache.stride(3) == 1, op,
              ": kv_cache must be contiguous in its last dim (stride ", kv_cache.stride(3), ")");
  TORCH_CHECK(kv_cache.size(2) <= 1 || kv_cache.stride(2) == kv_cache.size(3), op,
              ": each block of kv_cache must be contiguous per head (token stride ", kv_cache.stride(2),
              ", expected 2 * head_size = ", kv_cache.size(3),
              "): the kernels keep a block's keys transposed in it");
  TORCH_CHECK(kv_cache.size(2) >= 1 && kv_cache.size(1) >= 1, op, ": kv_cache ", kv_cache.sizes(),
              " has no heads or a zero block size");
  if (format == KvFormat::kAuto) {
    TORCH_CHECK(kv_cache.scalar_type() == model, op, ": kv_cache dtype ", kv_cache.scalar_type(),
                " must equal the activation dtype ", model, " for kv_cache_dtype 'auto'");
  } else {
    TORCH_CHECK(kv_cache.scalar_type() == at::kByte, op, ": kv_cache dtype ", kv_cache.scalar_type(),
                " must be uint8 (fp8 codes) for an fp8 kv_cache_dtype");
  }
  TORCH_CHECK(std::isfinite(k_scale) && k_scale > 0 && std::isfinite(v_scale) && v_scale > 0, op,
              ": k_scale and v_scale must be finite and positive, got ", k_scale, " and ", v_scale);
  PagedCache c;
  c.data = const_cast<void*>(kv_cache.const_data_ptr());
  c.num_blocks = kv_cache.size(0);
  c.kv_heads = kv_cache.size(1);
  c.block_size = kv_cache.size(2);
  c.head_size = kv_cache.size(3) / 2;
  c.stride_block = kv_cache.stride(0);
  c.stride_head = kv_cache.stride(1);
  c.format = format;
  c.k_scale = static_cast<float>(k_scale);
  c.v_scale = static_cast<float>(v_scale);
  return c;
}

at::Tensor int_vector(const at::Tensor& t, at::ScalarType st, int64_t size, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == st && t.dim() == 1 && t.size(0) == size, op, ": ", name,
              " must be a CPU ", st, " tensor of shape [", size, "], got ", t.scalar_type(), " ", t.sizes());
  return t.contiguous();
}

void reshape_and_cache_op(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache,
                          const at::Tensor& slot_mapping, c10::string_view kv_cache_dtype, double k_scale,
                          double v_scale) {
  const char* op = "reference_cpu::reshape_and_cache";
  const KvFormat format = kv_format(kv_cache_dtype, op);
  check_float(key, op, "key");
  const PagedCache cache = paged_cache(kv_cache, key.scalar_type(), format, k_scale, v_scale, op);
  check_head_rows(key, cache.kv_heads, cache.head_size, op, "key");
  check_head_rows(value, cache.kv_heads, cache.head_size, op, "value");
  TORCH_CHECK(value.scalar_type() == key.scalar_type() && value.size(0) == key.size(0), op, ": value ",
              value.scalar_type(), " ", value.sizes(), " must match key ", key.scalar_type(), " ", key.sizes());
  TORCH_CHECK(slot_mapping.device().is_cpu() && slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1,
              op, ": slot_mapping must be a 1-D CPU int64 tensor, got ", slot_mapping.scalar_type(), " ",
              slot_mapping.sizes());
  const int64_t tokens = slot_mapping.size(0);
  TORCH_CHECK(tokens <= key.size(0), op, ": slot_mapping has ", tokens, " slots for ", key.size(0), " key rows");
  const at::Tensor slots = slot_mapping.contiguous();
  const int64_t* s = slots.const_data_ptr<int64_t>();
  const int64_t capacity = cache.num_blocks * cache.block_size;
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK_INDEX(s[t] < capacity, op, ": slot_mapping[", t, "] = ", s[t], " is past the cache's ", capacity,
                      " slots (", cache.num_blocks, " blocks of ", cache.block_size, ")");
  }
  dispatch(key.scalar_type(), [&]<typename T>() {
    reshape_and_cache<T>(head_rows<const T>(key), head_rows<const T>(value), s, tokens, cache);
  });
}

const float* per_head(const std::optional<at::Tensor>& t, at::Tensor& holder, int64_t heads, const char* op,
                      const char* name) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->device().is_cpu() && t->is_floating_point() && t->dim() == 1 && t->size(0) == heads, op, ": ",
              name, " must be a float CPU tensor of shape [", heads, "], got ", t->scalar_type(), " ", t->sizes());
  holder = t->to(at::kFloat).contiguous();
  return holder.const_data_ptr<float>();
}

void paged_attention_op(at::Tensor& output, const at::Tensor& query, const at::Tensor& kv_cache,
                        const at::Tensor& query_start_loc, const at::Tensor& seq_lens, const at::Tensor& block_table,
                        double scale, bool causal, int64_t sliding_window, double logits_soft_cap,
                        const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& sinks,
                        c10::string_view kv_cache_dtype, double k_scale, double v_scale) {
  const char* op = "reference_cpu::paged_attention";
  const KvFormat format = kv_format(kv_cache_dtype, op);
  check_float(query, op, "query");
  TORCH_CHECK(query.dim() == 3, op, ": query must be [num_tokens, num_heads, head_size], got ", query.sizes());
  const PagedCache cache = paged_cache(kv_cache, query.scalar_type(), format, k_scale, v_scale, op);
  const int64_t heads = query.size(1);
  TORCH_CHECK(heads >= 1 && heads % cache.kv_heads == 0, op, ": num_heads ", heads,
              " is not a multiple of the cache's num_kv_heads ", cache.kv_heads);
  check_head_rows(query, heads, cache.head_size, op, "query");
  check_head_rows(output, heads, cache.head_size, op, "output");
  TORCH_CHECK(output.scalar_type() == query.scalar_type(), op, ": output dtype ", output.scalar_type(),
              " differs from query dtype ", query.scalar_type());
  TORCH_CHECK(sliding_window == -1 || sliding_window > 0, op, ": sliding_window must be -1 (none) or positive, got ",
              sliding_window);
  TORCH_CHECK(std::isfinite(logits_soft_cap) && logits_soft_cap >= 0, op,
              ": logits_soft_cap must be 0 (none) or positive, got ", logits_soft_cap);
  TORCH_CHECK(std::isfinite(scale), op, ": scale must be finite, got ", scale);
  TORCH_CHECK(block_table.device().is_cpu() && block_table.scalar_type() == at::kInt && block_table.dim() == 2, op,
              ": block_table must be a 2-D CPU int32 tensor, got ", block_table.scalar_type(), " ",
              block_table.sizes());
  const int64_t num_seqs = block_table.size(0);
  const at::Tensor qsl = int_vector(query_start_loc, at::kInt, num_seqs + 1, op, "query_start_loc");
  const at::Tensor lens = int_vector(seq_lens, at::kInt, num_seqs, op, "seq_lens");
  const at::Tensor bt = block_table.stride(1) == 1 ? block_table : block_table.contiguous();
  const int32_t* q = qsl.const_data_ptr<int32_t>();
  const int32_t* sl = lens.const_data_ptr<int32_t>();
  const int32_t* table = bt.const_data_ptr<int32_t>();
  const int64_t width = bt.size(1);
  TORCH_CHECK(q[0] >= 0 && q[num_seqs] <= query.size(0), op, ": query_start_loc spans rows [", q[0], ", ",
              q[num_seqs], ") of a query with ", query.size(0), " rows");
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t q_len = q[i + 1] - q[i];
    TORCH_CHECK(q_len >= 0, op, ": query_start_loc decreases at request ", i, " (", q[i], " -> ", q[i + 1], ")");
    TORCH_CHECK(sl[i] >= q_len, op, ": request ", i, " has seq_len ", sl[i], " below its query length ", q_len);
    if (q_len == 0) continue;
    const int64_t blocks = (static_cast<int64_t>(sl[i]) + cache.block_size - 1) / cache.block_size;
    TORCH_CHECK(blocks <= width, op, ": request ", i, " needs ", blocks, " blocks for seq_len ", sl[i],
                " but block_table has ", width, " columns");
    for (int64_t b = 0; b < blocks; ++b) {
      const int32_t id = table[i * bt.stride(0) + b];
      TORCH_CHECK_INDEX(id >= 0 && id < cache.num_blocks, op, ": block_table[", i, ", ", b, "] = ", id,
                        " is outside the cache's ", cache.num_blocks, " blocks");
    }
  }
  at::Tensor alibi_holder, sinks_holder;
  AttentionFeatures f;
  f.num_heads = heads;
  f.scale = static_cast<float>(scale);
  f.causal = causal;
  f.sliding_window = sliding_window;
  f.logits_soft_cap = static_cast<float>(logits_soft_cap);
  f.alibi_slopes = per_head(alibi_slopes, alibi_holder, heads, op, "alibi_slopes");
  f.sinks = per_head(sinks, sinks_holder, heads, op, "sinks");
  PagedBatch batch;
  batch.query_start_loc = q;
  batch.seq_lens = sl;
  batch.block_table = table;
  batch.block_table_stride = bt.stride(0);
  batch.num_seqs = num_seqs;
  dispatch(query.scalar_type(), [&]<typename T>() {
    paged_attention<T>(head_rows<T>(output), head_rows<const T>(query), cache, batch, f);
  });
}

bool paged_cache_pairs_op(const at::Tensor& kv_cache) {
  const char* op = "reference_cpu::paged_cache_pairs";
  TORCH_CHECK(kv_cache.dim() == 4 && kv_cache.size(3) % 2 == 0, op,
              ": kv_cache must be [num_blocks, num_kv_heads, block_size, 2 * head_size], got ", kv_cache.sizes());
  return kv_cache.scalar_type() == at::kBFloat16 && kv_cache_pairs(kv_cache.size(3) / 2, kv_cache.size(2));
}

}  // namespace
}  // namespace reference_cpu

TORCH_LIBRARY_FRAGMENT(reference_cpu, m) {
  m.def("reshape_and_cache(Tensor key, Tensor value, Tensor(a!) kv_cache, Tensor slot_mapping, "
        "str kv_cache_dtype, float k_scale, float v_scale) -> ()");
  m.def("paged_attention(Tensor(a!) output, Tensor query, Tensor kv_cache, Tensor query_start_loc, "
        "Tensor seq_lens, Tensor block_table, float scale, bool causal, int sliding_window, "
        "float logits_soft_cap, Tensor? alibi_slopes, Tensor? sinks, str kv_cache_dtype, float k_scale, "
        "float v_scale) -> ()");
  // whether the kernels keep this (bf16) cache in the AMX pairs layout (attention.h); cpp_backend.as_token_rows
  m.def("paged_cache_pairs(Tensor kv_cache) -> bool");
}

TORCH_LIBRARY_IMPL(reference_cpu, CPU, m) {
  m.impl("reshape_and_cache", TORCH_FN(reference_cpu::reshape_and_cache_op));
  m.impl("paged_attention", TORCH_FN(reference_cpu::paged_attention_op));
  m.impl("paged_cache_pairs", TORCH_FN(reference_cpu::paged_cache_pairs_op));
}
