// Torch ops reference_cpu::pack_gemm_panels and reference_cpu::panel_gemm (gemm.cpp): argument checks
// that name the argument and what is wrong, allocation and dtype dispatch. CPU-only, so a fragment of
// the library like the attention ops.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>

#include "cpu_bindings.h"
#include "kernels.h"

namespace reference_cpu {
namespace {

at::Tensor pack_gemm_panels_op(const at::Tensor& weight) {
  constexpr const char* op = "pack_gemm_panels";
  check_float(weight, op, "weight");
  TORCH_CHECK(weight.dim() == 2, op, ": weight must be 2-D [out_features, in_features], got ", weight.sizes());
  TORCH_CHECK(weight.size(1) <= 1 || weight.stride(1) == 1, op, ": weight must be contiguous in its last dim (stride ",
              weight.stride(1), ")");
  const int64_t n = weight.size(0), k = weight.size(1), cols = gemm_panel_cols();
  at::Tensor panels = at::empty({(n + cols - 1) / cols, k, cols}, weight.options());
  dispatch(weight.scalar_type(), [&]<typename T>() {
    pack_gemm_panels<T>(weight.const_data_ptr<T>(), weight.stride(0), n, k, panels.mutable_data_ptr<T>());
  });
  return panels;
}

at::Tensor panel_gemm_op(const at::Tensor& x, const at::Tensor& panels, int64_t out_features,
                         const std::optional<at::Tensor>& bias) {
  constexpr const char* op = "panel_gemm";
  check_float(x, op, "x");
  check_float(panels, op, "panels");
  const int64_t cols = gemm_panel_cols();
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [rows, in_features], got ", x.sizes());
  TORCH_CHECK(panels.dim() == 3 && panels.size(2) == cols && panels.is_contiguous(), op,
              ": panels must be a contiguous [panels, in_features, ", cols,
              "] tensor from pack_gemm_panels on this build, got ", panels.sizes());
  TORCH_CHECK(x.scalar_type() == panels.scalar_type(), op, ": x dtype ", x.scalar_type(),
              " differs from the panels' dtype ", panels.scalar_type());
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(panels.size(1) == k, op, ": x has ", k, " features, the panels ", panels.size(1));
  TORCH_CHECK(out_features >= 0 && (out_features + cols - 1) / cols == panels.size(0), op, ": out_features ",
              out_features, " does not match ", panels.size(0), " panels of ", cols, " columns");
  TORCH_CHECK(k <= 1 || x.stride(1) == 1, op, ": x must be contiguous in its last dim (stride ", x.stride(1), ")");
  const at::Tensor* b = nullptr;
  if (bias.has_value()) {
    b = &*bias;
    check_float(*b, op, "bias");
    TORCH_CHECK(b->scalar_type() == x.scalar_type(), op, ": bias dtype ", b->scalar_type(), " differs from x's ",
                x.scalar_type());
    TORCH_CHECK(b->dim() == 1 && b->size(0) == out_features && b->is_contiguous(), op,
                ": bias must be a contiguous [", out_features, "] tensor, got ", b->sizes());
  }
  at::Tensor out = at::empty({m, out_features}, x.options());
  dispatch(x.scalar_type(), [&]<typename T>() {
    panel_gemm<T>(x.const_data_ptr<T>(), x.stride(0), m, k, panels.const_data_ptr<T>(), out_features,
                  b == nullptr ? nullptr : b->const_data_ptr<T>(), out.mutable_data_ptr<T>(), out_features);
  });
  return out;
}

}  // namespace
}  // namespace reference_cpu

TORCH_LIBRARY_FRAGMENT(reference_cpu, m) {
  m.def("pack_gemm_panels(Tensor weight) -> Tensor");
  m.def("panel_gemm(Tensor x, Tensor panels, int out_features, Tensor? bias=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(reference_cpu, CPU, m) {
  m.impl("pack_gemm_panels", TORCH_FN(reference_cpu::pack_gemm_panels_op));
  m.impl("panel_gemm", TORCH_FN(reference_cpu::panel_gemm_op));
}
