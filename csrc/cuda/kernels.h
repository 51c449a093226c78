// Launcher API of the reference CUDA kernels: plain pointers, sizes and a dtype tag.
//
// The CPU torch wheel has no c10 CUDA headers, so the .cu files include neither torch nor this
// project's torch binding; bindings.cpp (built only where CUDA torch exists) checks tensors and
// calls these launchers. Every launcher enqueues on `stream` (a cudaStream_t passed as void*) and
// returns the cudaError_t of the launch as an int (0 on success).
#pragma once

#include <cstdint>

#include "../common/row_index.h"

namespace reference_cuda {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

using reference_common::kMaxRowDims;
using reference_common::RowIndex;

// Heads of one token: data + tokens(t) + h * head_stride.
struct HeadsView {
  void* data = nullptr;
  RowIndex tokens;
  int64_t heads = 0;
  int64_t head_stride = 0;
};

enum class Gated : int { kSiluAndMul, kMulAndSilu, kGeluAndMul, kGeluTanhAndMul, kFatreluAndMul };
enum class Unary : int { kGeluNew, kGeluFast, kQuickGelu, kRelu2 };

// Semantics of each launcher are those of the CPU kernel of the same name (csrc/cpu/kernels.h).
int rms_norm(DType dtype, const void* x, RowIndex x_rows, const void* weight, void* out, int64_t rows,
             int64_t hidden, int64_t n_var, float eps, void* stream);
int fused_add_rms_norm(DType dtype, void* x, RowIndex x_rows, void* residual, RowIndex res_rows,
                       const void* weight, int64_t rows, int64_t hidden, int64_t n_var, float eps,
                       void* stream);
int gated_activation(DType dtype, Gated kind, const void* x, RowIndex x_rows, void* out, int64_t rows,
                     int64_t d, float param, void* stream);
int swigluoai_and_mul(DType dtype, const void* x, RowIndex x_rows, void* out, int64_t rows, int64_t d,
                      float alpha, float limit, void* stream);
int unary_activation(DType dtype, Unary kind, const void* x, RowIndex x_rows, void* out, int64_t rows,
                     int64_t hidden, void* stream);
// cache_is_float: the cos/sin cache is float32 (else it has the activation dtype).
int rotary_embedding(DType dtype, const int64_t* positions, int64_t tokens, HeadsView query,
                     HeadsView key, const void* cache, bool cache_is_float, int64_t cache_stride,
                     int64_t rot_dim, bool is_neox, void* stream);
int static_quant_fp8(DType dtype, const void* x, RowIndex x_rows, const float* scale,
                     RowIndex scale_rows, int64_t scale_group_stride, int64_t groups, uint8_t* out,
                     int64_t rows, int64_t hidden, void* stream);
// Per tensor, `amax_workspace` (one float of device memory, zeroed on `stream` first) collects
// the absmax; it is unused (and may be null) per token.
int dynamic_quant_fp8(DType dtype, const void* x, RowIndex x_rows, uint8_t* out, float* scale_out,
                      float* amax_workspace, int64_t rows, int64_t hidden, bool per_token,
                      const float* scale_ub, void* stream);
int dynamic_group_quant_fp8(DType dtype, const void* x, RowIndex x_rows, uint8_t* out,
                            float* scale_out, int64_t rows, int64_t hidden, int64_t group_size,
                            void* stream);

}  // namespace reference_cuda
