// Raw-pointer entry points of the reference C++ CPU kernels.
//
// The kernel translation units include only this header and at::vec (no Tensor headers), so they
// compile fast; bindings.cpp checks tensors, allocates outputs and calls these templates, which
// are instantiated for float, c10::Half and c10::BFloat16 in each kernel file.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "../common/row_index.h"

namespace reference_cpu {

using reference_common::kMaxRowDims;
using reference_common::RowIndex;

// ----- norms ---------------------------------------------------------------------------------
// out (contiguous [rows, hidden]) = cast(x * rsqrt(mean(x[:n_var]^2) + eps)) * w   (w may be null)
template <typename T>
void rms_norm(const T* x, RowIndex x_rows, const T* weight, T* out, int64_t rows, int64_t hidden,
              int64_t n_var, float eps);

// In place: s = x + residual (fp32); residual <- cast(s); x <- cast(s * rsqrt(...)) * w.
template <typename T>
void fused_add_rms_norm(T* x, RowIndex x_rows, T* residual, RowIndex res_rows, const T* weight,
                        int64_t rows, int64_t hidden, int64_t n_var, float eps);

// ----- activations ---------------------------------------------------------------------------
enum class Gated { kSiluAndMul, kMulAndSilu, kGeluAndMul, kGeluTanhAndMul, kFatreluAndMul };
enum class Unary { kGeluNew, kGeluFast, kQuickGelu, kRelu2 };

// out (contiguous [rows, d]) = act(x[:, :d]) * x[:, d:] (or x[:, :d] * silu(x[:, d:])).
// `param` is the fatrelu threshold (unused otherwise).
template <typename T>
void gated_activation(Gated kind, const T* x, RowIndex x_rows, T* out, int64_t rows, int64_t d,
                      float param);

// Interleaved gate/up: out[:, j] = (clamp(x[:, 2j+1], -limit, limit) + 1) * g * sigmoid(alpha * g),
// g = min(x[:, 2j], limit).
template <typename T>
void swigluoai_and_mul(const T* x, RowIndex x_rows, T* out, int64_t rows, int64_t d, float alpha,
                       float limit);

// out (contiguous [rows, hidden]) = act(x).
template <typename T>
void unary_activation(Unary kind, const T* x, RowIndex x_rows, T* out, int64_t rows, int64_t hidden);

// ----- rotary --------------------------------------------------------------------------------
// A tensor of heads rotated in place: token t, head h starts at data + tokens(t) + h * head_stride.
template <typename T>
struct HeadsView {
  T* data = nullptr;
  RowIndex tokens;
  int64_t heads = 0;
  int64_t head_stride = 0;
};

// Rotates the first `rot_dim` features of every head of query (and key when key.data != null) in
// place, by the cos/sin row `positions[t]` of `cache` ([max_pos, rot_dim], row stride
// `cache_stride`, cos first then sin). cos/sin are rounded to T first, as the native op does.
template <typename T, typename C>
void rotary_embedding(const int64_t* positions, int64_t tokens, HeadsView<T> query, HeadsView<T> key,
                      const C* cache, int64_t cache_stride, int64_t rot_dim, bool is_neox);

// ----- fp8 (e4m3fn) quantization -------------------------------------------------------------
// out[r, j] = fp8(clamp(x[r, j] * (1 / scale[r, j / (hidden / groups)]), -448, 448)).
// scale rows are addressed by `scale_rows`, groups `scale_group_stride` apart (fp32).
template <typename T>
void static_quant_fp8(const T* x, RowIndex x_rows, const float* scale, RowIndex scale_rows,
                      int64_t scale_group_stride, int64_t groups, uint8_t* out, int64_t rows,
                      int64_t hidden);

// scale = max(min(absmax, ub) / 448, 1 / (448 * 512)) per token (scale_out[rows]) or per tensor
// (scale_out[1]); out = fp8(clamp(x * (1 / scale))). `scale_ub` may be null.
template <typename T>
void dynamic_quant_fp8(const T* x, RowIndex x_rows, uint8_t* out, float* scale_out, int64_t rows,
                       int64_t hidden, bool per_token, const float* scale_ub);

// One scale per `group_size` features: scale_out[rows, hidden / group_size]; out = fp8(x / scale).
template <typename T>
void dynamic_group_quant_fp8(const T* x, RowIndex x_rows, uint8_t* out, float* scale_out,
                             int64_t rows, int64_t hidden, int64_t group_size);

// ----- few-row GEMM on a panel-packed weight -------------------------------------------------------
// The weight [n, k] is packed once into column panels of gemm_panel_cols() columns, each stored k-major:
// panels[p][kk][c] = weight[p * cols + c][kk] (zero past n). A GEMM with few rows then reads its weight
// as one sequential stream, which is what bounds it.
int64_t gemm_panel_cols();

// panels ([ceil(n / cols), k, cols], contiguous) from weight rows `w_stride` apart.
template <typename T>
void pack_gemm_panels(const T* weight, int64_t w_stride, int64_t n, int64_t k, T* panels);

// out[m, :n] (rows `out_stride` apart) = x[m, :k] (rows `x_stride` apart) W^T + bias (bias may be null),
// accumulated in fp32 and rounded to T once.
template <typename T>
void panel_gemm(const T* x, int64_t x_stride, int64_t m, int64_t k, const T* panels, int64_t n, const T* bias,
                T* out, int64_t out_stride);

}  // namespace reference_cpu
