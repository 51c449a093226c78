// Torch library `reference_cuda`: tensor checks, output allocation and the current stream for the
// launchers of kernels.h. Built only where torch has CUDA (the CPU wheel lacks the c10 CUDA
// configuration headers); the .cu files never include torch. Same schemas as reference_cpu.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "../common/binding_utils.h"
#include "kernels.h"

namespace reference_cuda {
namespace {

using reference_kernels::leading_numel;
using reference_kernels::slice_len;
using reference_kernels::with_last;

DType dtype_of(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    default:
      TORCH_CHECK(false, op, ": unsupported dtype ", t.scalar_type(),
                  " (float32, float16 and bfloat16 are supported)");
  }
}

void* stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

void check_launch(int status, const char* op) {
  TORCH_CHECK(status == 0, op, ": kernel launch failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(status)));
}

void check_activation(const at::Tensor& x, const char* op, const char* name) {
  reference_kernels::check_activation(x, c10::DeviceType::CUDA, op, name);
}

RowIndex row_index(const at::Tensor& t, int64_t end, const char* op) {
  return reference_kernels::row_index<RowIndex, kMaxRowDims>(t, end, op);
}

RowIndex rows_of(const at::Tensor& x, const char* op) { return row_index(x, x.dim() - 1, op); }
int64_t num_rows(const at::Tensor& x) { return leading_numel(x, x.dim() - 1); }

// ----- norms ----------------------------------------------------------------------------------
at::Tensor rms_norm_op(const at::Tensor& x, const std::optional<at::Tensor>& weight, double epsilon,
                       std::optional<int64_t> variance_size) {
  const char* op = "reference_cuda::rms_norm";
  check_activation(x, op, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  const void* w = reference_kernels::check_weight(weight, x, op);
  at::Tensor out = at::empty(x.sizes(), x.options());
  const int64_t hidden = x.size(-1);
  check_launch(rms_norm(dtype_of(x, op), x.const_data_ptr(), rows_of(x, op), w, out.mutable_data_ptr(),
                        num_rows(x), hidden, slice_len(hidden, variance_size),
                        static_cast<float>(epsilon), stream()),
               op);
  return out;
}

void fused_add_rms_norm_op(at::Tensor& x, at::Tensor& x_residual,
                           const std::optional<at::Tensor>& weight, double epsilon,
                           std::optional<int64_t> variance_size) {
  const char* op = "reference_cuda::fused_add_rms_norm";
  check_activation(x, op, "x");
  check_activation(x_residual, op, "x_residual");
  TORCH_CHECK(x.sizes() == x_residual.sizes() && x.scalar_type() == x_residual.scalar_type(), op,
              ": x ", x.sizes(), " ", x.scalar_type(), " and x_residual ", x_residual.sizes(), " ",
              x_residual.scalar_type(), " must have the same shape and dtype");
  const c10::cuda::CUDAGuard guard(x.device());
  const void* w = reference_kernels::check_weight(weight, x, op);
  const int64_t hidden = x.size(-1);
  check_launch(fused_add_rms_norm(dtype_of(x, op), x.mutable_data_ptr(), rows_of(x, op),
                                  x_residual.mutable_data_ptr(), rows_of(x_residual, op), w,
                                  num_rows(x), hidden, slice_len(hidden, variance_size),
                                  static_cast<float>(epsilon), stream()),
               op);
}

// ----- activations ----------------------------------------------------------------------------
at::Tensor gated(const at::Tensor& x, Gated kind, float param, const char* op) {
  check_activation(x, op, "x");
  const int64_t width = x.size(-1);
  TORCH_CHECK(width % 2 == 0, op, ": last dim ", width, " must be even");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(with_last(x, width / 2), x.options());
  check_launch(gated_activation(dtype_of(x, op), kind, x.const_data_ptr(), rows_of(x, op),
                                out.mutable_data_ptr(), num_rows(x), width / 2, param, stream()),
               op);
  return out;
}

at::Tensor silu_and_mul(const at::Tensor& x) {
  return gated(x, Gated::kSiluAndMul, 0.f, "reference_cuda::silu_and_mul");
}

at::Tensor mul_and_silu(const at::Tensor& x) {
  return gated(x, Gated::kMulAndSilu, 0.f, "reference_cuda::mul_and_silu");
}

at::Tensor gelu_and_mul(const at::Tensor& x, c10::string_view approximate) {
  const char* op = "reference_cuda::gelu_and_mul";
  TORCH_CHECK(approximate == "none" || approximate == "tanh", op,
              ": approximate must be 'none' or 'tanh', got '", std::string(approximate), "'");
  return gated(x, approximate == "none" ? Gated::kGeluAndMul : Gated::kGeluTanhAndMul, 0.f, op);
}

at::Tensor fatrelu_and_mul(const at::Tensor& x, double threshold) {
  return gated(x, Gated::kFatreluAndMul, static_cast<float>(threshold), "reference_cuda::fatrelu_and_mul");
}

at::Tensor swigluoai_and_mul_op(const at::Tensor& x, double alpha, double limit) {
  const char* op = "reference_cuda::swigluoai_and_mul";
  check_activation(x, op, "x");
  const int64_t width = x.size(-1);
  TORCH_CHECK(width % 2 == 0, op, ": last dim ", width, " must be even");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(with_last(x, width / 2), x.options());
  check_launch(swigluoai_and_mul(dtype_of(x, op), x.const_data_ptr(), rows_of(x, op), out.mutable_data_ptr(),
                                 num_rows(x), width / 2, static_cast<float>(alpha),
                                 static_cast<float>(limit), stream()),
               op);
  return out;
}

at::Tensor unary(const at::Tensor& x, Unary kind, const char* op) {
  check_activation(x, op, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options());
  check_launch(unary_activation(dtype_of(x, op), kind, x.const_data_ptr(), rows_of(x, op),
                                out.mutable_data_ptr(), num_rows(x), x.size(-1), stream()),
               op);
  return out;
}

at::Tensor gelu_new(const at::Tensor& x) { return unary(x, Unary::kGeluNew, "reference_cuda::gelu_new"); }
at::Tensor gelu_fast(const at::Tensor& x) { return unary(x, Unary::kGeluFast, "reference_cuda::gelu_fast"); }
at::Tensor quick_gelu(const at::Tensor& x) { return unary(x, Unary::kQuickGelu, "reference_cuda::quick_gelu"); }
at::Tensor relu2(const at::Tensor& x) { return unary(x, Unary::kRelu2, "reference_cuda::relu2"); }

// ----- rotary ---------------------------------------------------------------------------------
HeadsView heads_view(at::Tensor& x, int64_t tokens, int64_t head_size, const char* op, const char* name) {
  check_activation(x, op, name);
  const auto layout = reference_kernels::heads_layout(x, tokens, head_size, op, name);
  HeadsView v;
  v.data = x.mutable_data_ptr();
  v.tokens = row_index(x, layout.token_dims, op);
  v.heads = layout.heads;
  v.head_stride = layout.head_stride;
  return v;
}

// Out-of-range positions are not checked here (that would need a device sync); callers pass
// positions below max_position as the native op requires.
void rotary_embedding_op(const at::Tensor& positions, at::Tensor& query,
                         const std::optional<at::Tensor>& key, int64_t head_size,
                         const at::Tensor& cos_sin_cache, bool is_neox_style) {
  const char* op = "reference_cuda::rotary_embedding";
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
  TORCH_CHECK(positions.device() == query.device() && cos_sin_cache.device() == query.device(), op,
              ": positions, query and cos_sin_cache must be on one device");
  const c10::cuda::CUDAGuard guard(query.device());
  const at::Tensor pos = positions.reshape(-1).to(at::kLong).contiguous();
  const int64_t tokens = pos.numel();
  at::Tensor key_t = key.has_value() ? *key : at::Tensor();
  const HeadsView q = heads_view(query, tokens, head_size, op, "query");
  const HeadsView k = key_t.defined() ? heads_view(key_t, tokens, head_size, op, "key") : HeadsView();
  check_launch(rotary_embedding(dtype_of(query, op), pos.const_data_ptr<int64_t>(), tokens, q, k,
                                cos_sin_cache.const_data_ptr(), cache_is_float, cos_sin_cache.stride(0),
                                rot, is_neox_style, stream()),
               op);
}

// ----- fp8 quantization -----------------------------------------------------------------------
uint8_t* fp8_ptr(at::Tensor& t) { return static_cast<uint8_t*>(t.mutable_data_ptr()); }

at::Tensor static_quant_fp8_op(const at::Tensor& x, const at::Tensor& scale) {
  const char* op = "reference_cuda::static_quant_fp8";
  check_activation(x, op, "x");
  TORCH_CHECK(scale.device() == x.device(), op, ": scale is on ", scale.device(), ", x on ", x.device());
  const c10::cuda::CUDAGuard guard(x.device());
  const auto s = reference_kernels::static_scale_layout(x, scale, op);
  at::Tensor out = at::empty(s.out_shape, x.options().dtype(at::kFloat8_e4m3fn));
  const int64_t lead = static_cast<int64_t>(s.out_shape.size()) - 1;
  check_launch(static_quant_fp8(dtype_of(x, op), s.x.const_data_ptr(), row_index(s.x, lead, op),
                                s.scale.const_data_ptr<float>(), row_index(s.scale, lead, op),
                                s.scale.stride(-1), s.groups, fp8_ptr(out), leading_numel(s.x, lead),
                                x.size(-1), stream()),
               op);
  return out;
}

std::tuple<at::Tensor, at::Tensor> dynamic_quant_fp8_op(const at::Tensor& x, bool per_token,
                                                        const std::optional<at::Tensor>& scale_ub) {
  const char* op = "reference_cuda::dynamic_quant_fp8";
  check_activation(x, op, "x");
  const int64_t hidden = x.size(-1);
  TORCH_CHECK(per_token ? hidden > 0 : x.numel() > 0, op, ": cannot take the absmax of an empty ",
              per_token ? "row" : "tensor");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor ub;
  if (scale_ub.has_value()) {
    TORCH_CHECK(scale_ub->numel() == 1 && scale_ub->device() == x.device(), op,
                ": scale_ub must hold one value on ", x.device());
    ub = scale_ub->to(at::kFloat).contiguous();
  }
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = at::empty(per_token ? with_last(x, 1) : std::vector<int64_t>{1},
                               x.options().dtype(at::kFloat));
  at::Tensor amax = per_token ? at::Tensor() : at::empty({1}, x.options().dtype(at::kFloat));
  check_launch(dynamic_quant_fp8(dtype_of(x, op), x.const_data_ptr(), rows_of(x, op), fp8_ptr(q),
                                 scale.mutable_data_ptr<float>(),
                                 amax.defined() ? amax.mutable_data_ptr<float>() : nullptr, num_rows(x),
                                 hidden, per_token,
                                 ub.defined() ? ub.const_data_ptr<float>() : nullptr, stream()),
               op);
  return {q, scale};
}

std::tuple<at::Tensor, at::Tensor> dynamic_group_quant_fp8_op(const at::Tensor& x, int64_t group_size) {
  const char* op = "reference_cuda::dynamic_group_quant_fp8";
  check_activation(x, op, "x");
  const int64_t hidden = x.size(-1);
  TORCH_CHECK(group_size > 0 && hidden % group_size == 0, op, ": hidden size ", hidden,
              " is not a multiple of group_size ", group_size);
  TORCH_CHECK(hidden / group_size <= 65535, op, ": at most 65535 groups per row");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = at::empty(with_last(x, hidden / group_size), x.options().dtype(at::kFloat));
  check_launch(dynamic_group_quant_fp8(dtype_of(x, op), x.const_data_ptr(), rows_of(x, op), fp8_ptr(q),
                                       scale.mutable_data_ptr<float>(), num_rows(x), hidden, group_size,
                                       stream()),
               op);
  return {q, scale};
}

}  // namespace
}  // namespace reference_cuda

TORCH_LIBRARY(reference_cuda, m) {
#include "../common/schemas.inc"
}

TORCH_LIBRARY_IMPL(reference_cuda, CUDA, m) {
  using namespace reference_cuda;
#include "../common/impls.inc"
}
