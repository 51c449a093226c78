// Torch library `reference_cpu`: tensor checks, output allocation and dtype dispatch for the
// raw-pointer kernels of kernels.h. Schemas mark the in-place arguments (Tensor(a!)) so compiled
// graphs can trace and functionalize them; fake (meta) implementations of the allocating ops are
// registered from Python (reference_impl/kernels/_cpp_build.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "../common/binding_utils.h"
#include "kernels.h"

namespace reference_cpu {
namespace {

using reference_kernels::leading_numel;
using reference_kernels::slice_len;
using reference_kernels::with_last;

// Calls fn.template operator()<T>() for the activation dtype of `t`.
template <typename Fn>
void dispatch_float(const at::Tensor& t, const char* op, Fn&& fn) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return fn.template operator()<float>();
    case at::kHalf:
      return fn.template operator()<c10::Half>();
    case at::kBFloat16:
      return fn.template operator()<c10::BFloat16>();
    default:
      TORCH_CHECK(false, op, ": unsupported dtype ", t.scalar_type(),
                  " (float32, float16 and bfloat16 are supported)");
  }
}

void check_activation(const at::Tensor& x, const char* op, const char* name) {
  reference_kernels::check_activation(x, c10::DeviceType::CPU, op, name);
}

RowIndex row_index(const at::Tensor& t, int64_t end, const char* op) {
  return reference_kernels::row_index<RowIndex, kMaxRowDims>(t, end, op);
}

// Rows of x: all dims but the last.
RowIndex rows_of(const at::Tensor& x, const char* op) { return row_index(x, x.dim() - 1, op); }
int64_t num_rows(const at::Tensor& x) { return leading_numel(x, x.dim() - 1); }

// ----- norms ----------------------------------------------------------------------------------
at::Tensor rms_norm_op(const at::Tensor& x, const std::optional<at::Tensor>& weight, double epsilon,
                       std::optional<int64_t> variance_size) {
  const char* op = "reference_cpu::rms_norm";
  check_activation(x, op, "x");
  const void* w = reference_kernels::check_weight(weight, x, op);
  at::Tensor out = at::empty(x.sizes(), x.options());
  const int64_t hidden = x.size(-1);
  const RowIndex xr = rows_of(x, op);
  dispatch_float(x, op, [&]<typename T>() {
    rms_norm<T>(x.const_data_ptr<T>(), xr, static_cast<const T*>(w), out.mutable_data_ptr<T>(),
                num_rows(x), hidden, slice_len(hidden, variance_size), static_cast<float>(epsilon));
  });
  return out;
}

void fused_add_rms_norm_op(at::Tensor& x, at::Tensor& x_residual,
                           const std::optional<at::Tensor>& weight, double epsilon,
                           std::optional<int64_t> variance_size) {
  const char* op = "reference_cpu::fused_add_rms_norm";
  check_activation(x, op, "x");
  check_activation(x_residual, op, "x_residual");
  TORCH_CHECK(x.sizes() == x_residual.sizes() && x.scalar_type() == x_residual.scalar_type(), op,
              ": x ", x.sizes(), " ", x.scalar_type(), " and x_residual ", x_residual.sizes(), " ",
              x_residual.scalar_type(), " must have the same shape and dtype");
  const void* w = reference_kernels::check_weight(weight, x, op);
  const int64_t hidden = x.size(-1);
  const RowIndex xr = rows_of(x, op);
  const RowIndex rr = rows_of(x_residual, op);
  dispatch_float(x, op, [&]<typename T>() {
    fused_add_rms_norm<T>(x.mutable_data_ptr<T>(), xr, x_residual.mutable_data_ptr<T>(), rr,
                          static_cast<const T*>(w), num_rows(x), hidden,
                          slice_len(hidden, variance_size), static_cast<float>(epsilon));
  });
}

// ----- activations ----------------------------------------------------------------------------
// Gated ops: output [..., last / 2]; `run` gets (T tag via template, rows, d, out).
template <typename Run>
at::Tensor gated_op(const at::Tensor& x, const char* op, Run&& run) {
  check_activation(x, op, "x");
  const int64_t width = x.size(-1);
  TORCH_CHECK(width % 2 == 0, op, ": last dim ", width, " must be even");
  at::Tensor out = at::empty(with_last(x, width / 2), x.options());
  const RowIndex xr = rows_of(x, op);
  dispatch_float(x, op, [&]<typename T>() {
    run.template operator()<T>(x.const_data_ptr<T>(), xr, out.mutable_data_ptr<T>(), num_rows(x), width / 2);
  });
  return out;
}

at::Tensor gated(const at::Tensor& x, Gated kind, float param, const char* op) {
  return gated_op(x, op, [&]<typename T>(const T* xp, RowIndex xr, T* o, int64_t rows, int64_t d) {
    gated_activation<T>(kind, xp, xr, o, rows, d, param);
  });
}

at::Tensor silu_and_mul(const at::Tensor& x) {
  return gated(x, Gated::kSiluAndMul, 0.f, "reference_cpu::silu_and_mul");
}

at::Tensor mul_and_silu(const at::Tensor& x) {
  return gated(x, Gated::kMulAndSilu, 0.f, "reference_cpu::mul_and_silu");
}

at::Tensor gelu_and_mul(const at::Tensor& x, c10::string_view approximate) {
  const char* op = "reference_cpu::gelu_and_mul";
  TORCH_CHECK(approximate == "none" || approximate == "tanh", op,
              ": approximate must be 'none' or 'tanh', got '", std::string(approximate), "'");
  return gated(x, approximate == "none" ? Gated::kGeluAndMul : Gated::kGeluTanhAndMul, 0.f, op);
}

at::Tensor fatrelu_and_mul(const at::Tensor& x, double threshold) {
  return gated(x, Gated::kFatreluAndMul, static_cast<float>(threshold), "reference_cpu::fatrelu_and_mul");
}

at::Tensor swigluoai_and_mul_op(const at::Tensor& x, double alpha, double limit) {
  return gated_op(x, "reference_cpu::swigluoai_and_mul",
                  [&]<typename T>(const T* xp, RowIndex xr, T* o, int64_t rows, int64_t d) {
                    swigluoai_and_mul<T>(xp, xr, o, rows, d, static_cast<float>(alpha),
                                         static_cast<float>(limit));
                  });
}

at::Tensor unary(const at::Tensor& x, Unary kind, const char* op) {
  check_activation(x, op, "x");
  at::Tensor out = at::empty(x.sizes(), x.options());
  const RowIndex xr = rows_of(x, op);
  dispatch_float(x, op, [&]<typename T>() {
    unary_activation<T>(kind, x.const_data_ptr<T>(), xr, out.mutable_data_ptr<T>(), num_rows(x), x.size(-1));
  });
  return out;
}

at::Tensor gelu_new(const at::Tensor& x) { return unary(x, Unary::kGeluNew, "reference_cpu::gelu_new"); }
at::Tensor gelu_fast(const at::Tensor& x) { return unary(x, Unary::kGeluFast, "reference_cpu::gelu_fast"); }
at::Tensor quick_gelu(const at::Tensor& x) { return unary(x, Unary::kQuickGelu, "reference_cpu::quick_gelu"); }
at::Tensor relu2(const at::Tensor& x) { return unary(x, Unary::kRelu2, "reference_cpu::relu2"); }

// ----- rotary ---------------------------------------------------------------------------------
template <typename T>
HeadsView<T> heads_view(at::Tensor& x, int64_t tokens, int64_t head_size, const char* op, const char* name) {
  check_activation(x, op, name);
  const auto layout = reference_kernels::heads_layout(x, tokens, head_size, op, name);
  HeadsView<T> v;
  v.data = x.mutable_data_ptr<T>();
  v.tokens = row_index(x, layout.token_dims, op);
  v.heads = layout.heads;
  v.head_stride = layout.head_stride;
  return v;
}

void rotary_embedding_op(const at::Tensor& positions, at::Tensor& query,
                         const std::optional<at::Tensor>& key, int64_t head_size,
                         const at::Tensor& cos_sin_cache, bool is_neox_style) {
  const char* op = "reference_cpu::rotary_embedding";
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.stride(1) == 1, op,
              ": cos_sin_cache must be [max_position, rotary_dim] contiguous in its last dim");
  const int64_t rot = cos_sin_cache.size(1);
  TORCH_CHECK(rot % 2 == 0 && rot <= head_size, op, ": rotary_dim ", rot,
              " must be even and at most head_size ", head_size);
  TORCH_CHECK(!key.has_value() || key->scalar_type() == query.scalar_type(), op,
              ": query and key dtypes differ");
  const bool cache_is_float = cos_sin_cache.scalar_type() != query.scalar_type();
  TORCH_CHECK(!cache_is_float || cos_sin_cache.scalar_type() == at::kFloat, op, ": cos_sin_cache dtype ",
              cos_sin_cache.scalar_type(), " must be float32 or the query dtype ", query.scalar_type());
  const at::Tensor pos = positions.reshape(-1).to(at::kLong).contiguous();
  const int64_t tokens = pos.numel();
  const int64_t* p = pos.const_data_ptr<int64_t>();
  const int64_t max_pos = cos_sin_cache.size(0);
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK_INDEX(p[t] >= 0 && p[t] < max_pos, op, ": position ", p[t],
                      " is out of range for a cos_sin_cache of ", max_pos, " rows");
  }
  at::Tensor key_t = key.has_value() ? *key : at::Tensor();
  dispatch_float(query, op, [&]<typename T>() {
    const HeadsView<T> q = heads_view<T>(query, tokens, head_size, op, "query");
    const HeadsView<T> k = key_t.defined() ? heads_view<T>(key_t, tokens, head_size, op, "key") : HeadsView<T>();
    if constexpr (std::is_same_v<T, float>) {
      rotary_embedding<T, T>(p, tokens, q, k, cos_sin_cache.const_data_ptr<T>(), cos_sin_cache.stride(0),
                             rot, is_neox_style);
    } else if (cache_is_float) {
      rotary_embedding<T, float>(p, tokens, q, k, cos_sin_cache.const_data_ptr<float>(),
                                 cos_sin_cache.stride(0), rot, is_neox_style);
    } else {
      rotary_embedding<T, T>(p, tokens, q, k, cos_sin_cache.const_data_ptr<T>(), cos_sin_cache.stride(0),
                             rot, is_neox_style);
    }
  });
}

// ----- fp8 quantization -----------------------------------------------------------------------
uint8_t* fp8_ptr(at::Tensor& t) { return static_cast<uint8_t*>(t.mutable_data_ptr()); }

at::Tensor static_quant_fp8_op(const at::Tensor& x, const at::Tensor& scale) {
  const char* op = "reference_cpu::static_quant_fp8";
  check_activation(x, op, "x");
  const auto s = reference_kernels::static_scale_layout(x, scale, op);
  at::Tensor out = at::empty(s.out_shape, x.options().dtype(at::kFloat8_e4m3fn));
  const int64_t lead = static_cast<int64_t>(s.out_shape.size()) - 1;
  const RowIndex xr = row_index(s.x, lead, op);
  const RowIndex sr = row_index(s.scale, lead, op);
  dispatch_float(x, op, [&]<typename T>() {
    static_quant_fp8<T>(s.x.const_data_ptr<T>(), xr, s.scale.const_data_ptr<float>(), sr,
                        s.scale.stride(-1), s.groups, fp8_ptr(out), leading_numel(s.x, lead), x.size(-1));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> dynamic_quant_fp8_op(const at::Tensor& x, bool per_token,
                                                        const std::optional<at::Tensor>& scale_ub) {
  const char* op = "reference_cpu::dynamic_quant_fp8";
  check_activation(x, op, "x");
  const int64_t hidden = x.size(-1);
  TORCH_CHECK(per_token ? hidden > 0 : x.numel() > 0, op, ": cannot take the absmax of an empty ",
              per_token ? "row" : "tensor");
  float ub = 0.f;
  if (scale_ub.has_value()) {
    TORCH_CHECK(scale_ub->numel() == 1, op, ": scale_ub must hold one value");
    ub = scale_ub->to(at::kFloat).item<float>();
  }
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = at::empty(per_token ? with_last(x, 1) : std::vector<int64_t>{1},
                               x.options().dtype(at::kFloat));
  const RowIndex xr = rows_of(x, op);
  dispatch_float(x, op, [&]<typename T>() {
    dynamic_quant_fp8<T>(x.const_data_ptr<T>(), xr, fp8_ptr(q), scale.mutable_data_ptr<float>(),
                         num_rows(x), hidden, per_token, scale_ub.has_value() ? &ub : nullptr);
  });
  return {q, scale};
}

std::tuple<at::Tensor, at::Tensor> dynamic_group_quant_fp8_op(const at::Tensor& x, int64_t group_size) {
  const char* op = "reference_cpu::dynamic_group_quant_fp8";
  check_activation(x, op, "x");
  const int64_t hidden = x.size(-1);
  TORCH_CHECK(group_size > 0 && hidden % group_size == 0, op, ": hidden size ", hidden,
              " is not a multiple of group_size ", group_size);
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = at::empty(with_last(x, hidden / group_size), x.options().dtype(at::kFloat));
  const RowIndex xr = rows_of(x, op);
  dispatch_float(x, op, [&]<typename T>() {
    dynamic_group_quant_fp8<T>(x.const_data_ptr<T>(), xr, fp8_ptr(q), scale.mutable_data_ptr<float>(),
                               num_rows(x), hidden, group_size);
  });
  return {q, scale};
}

}  // namespace
}  // namespace reference_cpu

// The schemas are shared with the CUDA library (csrc/cuda/bindings.cpp).
TORCH_LIBRARY(reference_cpu, m) {
#include "../common/schemas.inc"
}

TORCH_LIBRARY_IMPL(reference_cpu, CPU, m) {
  using namespace reference_cpu;
#include "../common/impls.inc"
}
