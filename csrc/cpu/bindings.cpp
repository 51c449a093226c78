// Torch library `reference_cpu`: tensor checks, output allocation and dtype dispatch for the
// raw-pointer kernels of kernels.h. Schemas mark the in-place arguments (Tensor(a!)) so compiled
// graphs can trace and functionalize them; fake (meta) implementations of the allocating ops are
// registered from Python (reference_impl/kernels/_cpp_build.py).
#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>
#include <type_traits>
#include <string>
#include <vector>

#include "kernels.h"

namespace reference_cpu {
namespace {

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
      TORCH_CHECK(false, "reference_cpu::", op, ": unsupported dtype ", t.scalar_type(),
                  " (float32, float16 and bfloat16 are supported)");
  }
}

void check_activation(const at::Tensor& x, const char* op, const char* name) {
  TORCH_CHECK(x.device().is_cpu(), "reference_cpu::", op, ": ", name, " must be a CPU tensor, got ",
              x.device());
  TORCH_CHECK(x.dim() >= 1, "reference_cpu::", op, ": ", name, " must have at least one dim");
  TORCH_CHECK(x.size(-1) <= 1 || x.stride(-1) == 1, "reference_cpu::", op, ": ", name,
              " must be contiguous in its last dim (stride ", x.stride(-1), ")");
}

// RowIndex over dims [0, end) of `t` (size-1 dims dropped, mergeable neighbours collapsed).
RowIndex row_index(const at::Tensor& t, int64_t end, const char* op) {
  std::vector<int64_t> sizes, strides;
  for (int64_t d = 0; d < end; ++d) {
    if (t.size(d) == 1) continue;
    if (!sizes.empty() && strides.back() == t.stride(d) * t.size(d)) {
      sizes.back() *= t.size(d);
      strides.back() = t.stride(d);
    } else {
      sizes.push_back(t.size(d));
      strides.push_back(t.stride(d));
    }
  }
  TORCH_CHECK(sizes.size() <= static_cast<size_t>(kMaxRowDims), "reference_cpu::", op,
              ": more than ", kMaxRowDims, " non-mergeable leading dims");
  RowIndex index;
  index.ndim = static_cast<int>(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    index.sizes[i] = sizes[i];
    index.strides[i] = strides[i];
  }
  return index;
}

int64_t leading_numel(const at::Tensor& t, int64_t end) {
  int64_t n = 1;
  for (int64_t d = 0; d < end; ++d) n *= t.size(d);
  return n;
}

// Length of x[..., :variance_size] (Python slice semantics).
int64_t slice_len(int64_t hidden, std::optional<int64_t> stop) {
  if (!stop.has_value()) return hidden;
  const int64_t s = *stop;
  return s < 0 ? std::max<int64_t>(0, hidden + s) : std::min(s, hidden);
}

const void* check_weight(const std::optional<at::Tensor>& weight, const at::Tensor& x,
                         const char* op) {
  if (!weight.has_value()) return nullptr;
  const at::Tensor& w = *weight;
  TORCH_CHECK(w.scalar_type() == x.scalar_type(), "reference_cpu::", op, ": weight dtype ",
              w.scalar_type(), " differs from x dtype ", x.scalar_type());
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(-1) && (w.size(0) <= 1 || w.stride(0) == 1),
              "reference_cpu::", op, ": weight must be a contiguous [", x.size(-1), "] tensor, got ",
              w.sizes(), " with strides ", w.strides());
  TORCH_CHECK(w.device() == x.device(), "reference_cpu::", op, ": weight is on ", w.device());
  return w.const_data_ptr();
}

std::vector<int64_t> with_last(const at::Tensor& t, int64_t last) {
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  sizes.back() = last;
  return sizes;
}

// ----- norms ----------------------------------------------------------------------------------
at::Tensor rms_norm_op(const at::Tensor& x, const std::optional<at::Tensor>& weight, double epsilon,
                       std::optional<int64_t> variance_size) {
  check_activation(x, "rms_norm", "x");
  const void* w = check_weight(weight, x, "rms_norm");
  at::Tensor out = at::empty(x.sizes(), x.options());
  const int64_t hidden = x.size(-1);
  const int64_t rows = leading_numel(x, x.dim() - 1);
  const RowIndex xr = row_index(x, x.dim() - 1, "rms_norm");
  dispatch_float(x, "rms_norm", [&]<typename T>() {
    reference_cpu::rms_norm<T>(x.const_data_ptr<T>(), xr, static_cast<const T*>(w),
                               out.mutable_data_ptr<T>(), rows, hidden,
                               slice_len(hidden, variance_size), static_cast<float>(epsilon));
  });
  return out;
}

void fused_add_rms_norm_op(at::Tensor& x, at::Tensor& x_residual,
                           const std::optional<at::Tensor>& weight, double epsilon,
                           std::optional<int64_t> variance_size) {
  check_activation(x, "fused_add_rms_norm", "x");
  check_activation(x_residual, "fused_add_rms_norm", "x_residual");
  TORCH_CHECK(x.sizes() == x_residual.sizes() && x.scalar_type() == x_residual.scalar_type(),
              "reference_cpu::fused_add_rms_norm: x ", x.sizes(), " ", x.scalar_type(),
              " and x_residual ", x_residual.sizes(), " ", x_residual.scalar_type(),
              " must have the same shape and dtype");
  const void* w = check_weight(weight, x, "fused_add_rms_norm");
  const int64_t hidden = x.size(-1);
  const int64_t rows = leading_numel(x, x.dim() - 1);
  const RowIndex xr = row_index(x, x.dim() - 1, "fused_add_rms_norm");
  const RowIndex rr = row_index(x_residual, x.dim() - 1, "fused_add_rms_norm");
  dispatch_float(x, "fused_add_rms_norm", [&]<typename T>() {
    reference_cpu::fused_add_rms_norm<T>(x.mutable_data_ptr<T>(), xr, x_residual.mutable_data_ptr<T>(),
                                         rr, static_cast<const T*>(w), rows, hidden,
                                         slice_len(hidden, variance_size), static_cast<float>(epsilon));
  });
}

// ----- activations ----------------------------------------------------------------------------
at::Tensor gated(const at::Tensor& x, Gated kind, float param, const char* op) {
  check_activation(x, op, "x");
  const int64_t width = x.size(-1);
  TORCH_CHECK(width % 2 == 0, "reference_cpu::", op, ": last dim ", width, " must be even");
  const int64_t d = width / 2;
  at::Tensor out = at::empty(with_last(x, d), x.options());
  const int64_t rows = leading_numel(x, x.dim() - 1);
  const RowIndex xr = row_index(x, x.dim() - 1, op);
  dispatch_float(x, op, [&]<typename T>() {
    gated_activation<T>(kind, x.const_data_ptr<T>(), xr, out.mutable_data_ptr<T>(), rows, d, param);
  });
  return out;
}

at::Tensor silu_and_mul(const at::Tensor& x) { return gated(x, Gated::kSiluAndMul, 0.f, "silu_and_mul"); }
at::Tensor mul_and_silu(const at::Tensor& x) { return gated(x, Gated::kMulAndSilu, 0.f, "mul_and_silu"); }

at::Tensor gelu_and_mul(const at::Tensor& x, c10::string_view approximate) {
  if (approximate == "none") return gated(x, Gated::kGeluAndMul, 0.f, "gelu_and_mul");
  TORCH_CHECK(approximate == "tanh", "reference_cpu::gelu_and_mul: approximate must be 'none' or "
              "'tanh', got '", std::string(approximate), "'");
  return gated(x, Gated::kGeluTanhAndMul, 0.f, "gelu_and_mul");
}

at::Tensor fatrelu_and_mul(const at::Tensor& x, double threshold) {
  return gated(x, Gated::kFatreluAndMul, static_cast<float>(threshold), "fatrelu_and_mul");
}

at::Tensor swigluoai_and_mul_op(const at::Tensor& x, double alpha, double limit) {
  const char* op = "swigluoai_and_mul";
  check_activation(x, op, "x");
  const int64_t width = x.size(-1);
  TORCH_CHECK(width % 2 == 0, "reference_cpu::", op, ": last dim ", width, " must be even");
  const int64_t d = width / 2;
  at::Tensor out = at::empty(with_last(x, d), x.options());
  const int64_t rows = leading_numel(x, x.dim() - 1);
  const RowIndex xr = row_index(x, x.dim() - 1, op);
  dispatch_float(x, op, [&]<typename T>() {
    swigluoai_and_mul<T>(x.const_data_ptr<T>(), xr, out.mutable_data_ptr<T>(), rows, d,
                         static_cast<float>(alpha), static_cast<float>(limit));
  });
  return out;
}

at::Tensor unary(const at::Tensor& x, Unary kind, const char* op) {
  check_activation(x, op, "x");
  at::Tensor out = at::empty(x.sizes(), x.options());
  const int64_t hidden = x.size(-1);
  const int64_t rows = leading_numel(x, x.dim() - 1);
  const RowIndex xr = row_index(x, x.dim() - 1, op);
  dispatch_float(x, op, [&]<typename T>() {
    unary_activation<T>(kind, x.const_data_ptr<T>(), xr, out.mutable_data_ptr<T>(), rows, hidden);
  });
  return out;
}

at::Tensor gelu_new(const at::Tensor& x) { return unary(x, Unary::kGeluNew, "gelu_new"); }
at::Tensor gelu_fast(const at::Tensor& x) { return unary(x, Unary::kGeluFast, "gelu_fast"); }
at::Tensor quick_gelu(const at::Tensor& x) { return unary(x, Unary::kQuickGelu, "quick_gelu"); }
at::Tensor relu2(const at::Tensor& x) { return unary(x, Unary::kRelu2, "relu2"); }

// ----- rotary ---------------------------------------------------------------------------------
// Splits x into token dims (whose sizes multiply to `tokens`, as x.reshape(tokens, -1, head_size)
// does) and heads of `head_size` contiguous features.
template <typename T>
HeadsView<T> heads_view(at::Tensor& x, int64_t tokens, int64_t head_size, const char* name) {
  const char* op = "rotary_embedding";
  check_activation(x, op, name);
  int64_t token_dims = 0, prod = 1;
  while (token_dims < x.dim() && prod != tokens) prod *= x.size(token_dims++);
  TORCH_CHECK(prod == tokens, "reference_cpu::", op, ": ", name, " of shape ", x.sizes(),
              " does not start with dims of ", tokens, " tokens (positions.numel())");
  // Per-token dims, size-1 dims dropped.
  std::vector<int64_t> sizes, strides;
  for (int64_t d = token_dims; d < x.dim(); ++d) {
    if (x.size(d) != 1) {
      sizes.push_back(x.size(d));
      strides.push_back(x.stride(d));
    }
  }
  HeadsView<T> v;
  v.data = x.mutable_data_ptr<T>();
  v.tokens = row_index(x, token_dims, op);
  const int64_t per_token = x.numel() / std::max<int64_t>(tokens, 1);
  TORCH_CHECK(head_size > 0 && per_token % head_size == 0, "reference_cpu::", op, ": ", name,
              " has ", per_token, " features per token, not a multiple of head_size ", head_size);
  if (sizes.size() == 2 && sizes[1] == head_size && strides[1] == 1) {
    v.heads = sizes[0];
    v.head_stride = strides[0];
  } else {
    // Contiguous within a token: heads are head_size apart.
    int64_t expect = 1;
    for (int64_t i = static_cast<int64_t>(sizes.size()) - 1; i >= 0; --i) {
      TORCH_CHECK(strides[i] == expect, "reference_cpu::", op, ": unsupported layout of ", name,
                  " (sizes ", x.sizes(), ", strides ", x.strides(), ")");
      expect *= sizes[i];
    }
    v.heads = per_token / head_size;
    v.head_stride = head_size;
  }
  return v;
}

void rotary_embedding_op(const at::Tensor& positions, at::Tensor& query,
                         const std::optional<at::Tensor>& key, int64_t head_size,
                         const at::Tensor& cos_sin_cache, bool is_neox_style) {
  const char* op = "rotary_embedding";
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.stride(1) == 1, "reference_cpu::", op,
              ": cos_sin_cache must be [max_position, rotary_dim] contiguous in its last dim");
  const int64_t rot = cos_sin_cache.size(1);
  TORCH_CHECK(rot % 2 == 0 && rot <= head_size, "reference_cpu::", op, ": rotary_dim ", rot,
              " must be even and at most head_size ", head_size);
  TORCH_CHECK(!key.has_value() || key->scalar_type() == query.scalar_type(), "reference_cpu::", op,
              ": query and key dtypes differ");
  TORCH_CHECK(cos_sin_cache.scalar_type() == query.scalar_type() ||
                  cos_sin_cache.scalar_type() == at::kFloat,
              "reference_cpu::", op, ": cos_sin_cache dtype ", cos_sin_cache.scalar_type(),
              " must be float32 or the query dtype ", query.scalar_type());
  const at::Tensor pos = positions.reshape(-1).to(at::kLong).contiguous();
  const int64_t tokens = pos.numel();
  const int64_t* p = pos.const_data_ptr<int64_t>();
  const int64_t max_pos = cos_sin_cache.size(0);
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK_INDEX(p[t] >= 0 && p[t] < max_pos, "reference_cpu::", op, ": position ", p[t],
                      " is out of range for a cos_sin_cache of ", max_pos, " rows");
  }
  at::Tensor key_t = key.has_value() ? *key : at::Tensor();
  dispatch_float(query, op, [&]<typename T>() {
    HeadsView<T> q = heads_view<T>(query, tokens, head_size, "query");
    HeadsView<T> k;
    if (key_t.defined()) k = heads_view<T>(key_t, tokens, head_size, "key");
    if (cos_sin_cache.scalar_type() == query.scalar_type()) {
      reference_cpu::rotary_embedding<T, T>(p, tokens, q, k, cos_sin_cache.const_data_ptr<T>(),
                                            cos_sin_cache.stride(0), rot, is_neox_style);
    } else if constexpr (!std::is_same_v<T, float>) {
      reference_cpu::rotary_embedding<T, float>(p, tokens, q, k, cos_sin_cache.const_data_ptr<float>(),
                                                cos_sin_cache.stride(0), rot, is_neox_style);
    }
  });
}

// ----- fp8 quantization -----------------------------------------------------------------------
at::Tensor static_quant_fp8_op(const at::Tensor& x, const at::Tensor& scale) {
  const char* op = "static_quant_fp8";
  check_activation(x, op, "x");
  at::Tensor s = scale.to(at::kFloat);
  if (s.dim() == 1 && s.numel() > 1) s = s.unsqueeze(0);
  const int64_t hidden = x.size(-1);
  const int64_t groups = s.dim() >= 1 ? s.size(-1) : 1;
  TORCH_CHECK(groups >= 1 && hidden % groups == 0, "reference_cpu::", op, ": hidden size ", hidden,
              " is not divisible into ", groups, " scale groups");
  // Output shape: x broadcast against the scale expanded over the hidden dim.
  std::vector<int64_t> s_shape(s.sizes().begin(), s.sizes().end());
  if (s_shape.empty()) s_shape.push_back(1);
  s_shape.back() = groups > 1 ? hidden : 1;
  const std::vector<int64_t> out_shape = at::infer_size(x.sizes(), s_shape);
  std::vector<int64_t> s_target(out_shape);
  s_target.back() = groups;
  const at::Tensor xe = x.expand(out_shape);
  const at::Tensor se = (s.dim() == 0 ? s.reshape({1}) : s).expand(s_target);
  at::Tensor out = at::empty(out_shape, x.options().dtype(at::kFloat8_e4m3fn));
  const int64_t lead = static_cast<int64_t>(out_shape.size()) - 1;
  const RowIndex xr = row_index(xe, lead, op);
  const RowIndex sr = row_index(se, lead, op);
  const int64_t rows = leading_numel(xe, lead);
  dispatch_float(x, op, [&]<typename T>() {
    static_quant_fp8<T>(xe.const_data_ptr<T>(), xr, se.const_data_ptr<float>(), sr, se.stride(-1),
                        groups, static_cast<uint8_t*>(out.mutable_data_ptr()), rows, hidden);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> dynamic_quant_fp8_op(const at::Tensor& x, bool per_token,
                                                        const std::optional<at::Tensor>& scale_ub) {
  const char* op = "dynamic_quant_fp8";
  check_activation(x, op, "x");
  const int64_t hidden = x.size(-1);
  const int64_t rows = leading_numel(x, x.dim() - 1);
  TORCH_CHECK(per_token ? hidden > 0 : x.numel() > 0, "reference_cpu::", op,
              ": cannot take the absmax of an empty ", per_token ? "row" : "tensor");
  float ub = 0.f;
  if (scale_ub.has_value()) {
    TORCH_CHECK(scale_ub->numel() == 1, "reference_cpu::", op, ": scale_ub must hold one value");
    ub = scale_ub->to(at::kFloat).item<float>();
  }
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = per_token ? at::empty(with_last(x, 1), x.options().dtype(at::kFloat))
                               : at::empty({1}, x.options().dtype(at::kFloat));
  const RowIndex xr = row_index(x, x.dim() - 1, op);
  dispatch_float(x, op, [&]<typename T>() {
    dynamic_quant_fp8<T>(x.const_data_ptr<T>(), xr, static_cast<uint8_t*>(q.mutable_data_ptr()),
                         scale.mutable_data_ptr<float>(), rows, hidden, per_token,
                         scale_ub.has_value() ? &ub : nullptr);
  });
  return {q, scale};
}

std::tuple<at::Tensor, at::Tensor> dynamic_group_quant_fp8_op(const at::Tensor& x, int64_t group_size) {
  const char* op = "dynamic_group_quant_fp8";
  check_activation(x, op, "x");
  const int64_t hidden = x.size(-1);
  TORCH_CHECK(group_size > 0 && hidden % group_size == 0, "reference_cpu::", op, ": hidden size ",
              hidden, " is not a multiple of group_size ", group_size);
  const int64_t rows = leading_numel(x, x.dim() - 1);
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = at::empty(with_last(x, hidden / group_size), x.options().dtype(at::kFloat));
  const RowIndex xr = row_index(x, x.dim() - 1, op);
  dispatch_float(x, op, [&]<typename T>() {
    dynamic_group_quant_fp8<T>(x.const_data_ptr<T>(), xr, static_cast<uint8_t*>(q.mutable_data_ptr()),
                               scale.mutable_data_ptr<float>(), rows, hidden, group_size);
  });
  return {q, scale};
}

}  // namespace
}  // namespace reference_cpu

TORCH_LIBRARY(reference_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor? weight, float epsilon, int? variance_size) -> Tensor");
  m.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) x_residual, Tensor? weight, float epsilon, "
        "int? variance_size) -> ()");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("mul_and_silu(Tensor x) -> Tensor");
  m.def("gelu_and_mul(Tensor x, str approximate) -> Tensor");
  m.def("fatrelu_and_mul(Tensor x, float threshold) -> Tensor");
  m.def("swigluoai_and_mul(Tensor x, float alpha, float limit) -> Tensor");
  m.def("gelu_new(Tensor x) -> Tensor");
  m.def("gelu_fast(Tensor x) -> Tensor");
  m.def("quick_gelu(Tensor x) -> Tensor");
  m.def("relu2(Tensor x) -> Tensor");
  m.def("rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, "
        "Tensor cos_sin_cache, bool is_neox_style) -> ()");
  m.def("static_quant_fp8(Tensor x, Tensor scale) -> Tensor");
  m.def("dynamic_quant_fp8(Tensor x, bool per_token, Tensor? scale_ub) -> (Tensor, Tensor)");
  m.def("dynamic_group_quant_fp8(Tensor x, int group_size) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(reference_cpu, CPU, m) {
  using namespace reference_cpu;
  m.impl("rms_norm", TORCH_FN(rms_norm_op));
  m.impl("fused_add_rms_norm", TORCH_FN(fused_add_rms_norm_op));
  m.impl("silu_and_mul", TORCH_FN(silu_and_mul));
  m.impl("mul_and_silu", TORCH_FN(mul_and_silu));
  m.impl("gelu_and_mul", TORCH_FN(gelu_and_mul));
  m.impl("fatrelu_and_mul", TORCH_FN(fatrelu_and_mul));
  m.impl("swigluoai_and_mul", TORCH_FN(swigluoai_and_mul_op));
  m.impl("gelu_new", TORCH_FN(gelu_new));
  m.impl("gelu_fast", TORCH_FN(gelu_fast));
  m.impl("quick_gelu", TORCH_FN(quick_gelu));
  m.impl("relu2", TORCH_FN(relu2));
  m.impl("rotary_embedding", TORCH_FN(rotary_embedding_op));
  m.impl("static_quant_fp8", TORCH_FN(static_quant_fp8_op));
  m.impl("dynamic_quant_fp8", TORCH_FN(dynamic_quant_fp8_op));
  m.impl("dynamic_group_quant_fp8", TORCH_FN(dynamic_group_quant_fp8_op));
}
