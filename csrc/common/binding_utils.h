// Tensor-side helpers shared by the CPU and CUDA torch bindings: argument checks, row addressing
// of tensors with a contiguous last dim, Python slice lengths, the heads layout of rotary inputs
// and the broadcast layout of static fp8 scales. Both bindings raise the same messages.
#pragma once

#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <optional>
#include <vector>

namespace reference_kernels {

inline void check_activation(const at::Tensor& x, c10::DeviceType device, const char* op,
                             const char* name) {
  TORCH_CHECK(x.device().type() == device, op, ": ", name, " must be a ", c10::DeviceTypeName(device),
              " tensor, got ", x.device());
  TORCH_CHECK(x.dim() >= 1, op, ": ", name, " must have at least one dim");
  TORCH_CHECK(x.size(-1) <= 1 || x.stride(-1) == 1, op, ": ", name,
              " must be contiguous in its last dim (stride ", x.stride(-1), ")");
}

// Fills a RowIndex-like struct (ndim, sizes[], strides[], capacity kMaxRowDims) over dims [0, end)
// of `t`: size-1 dims dropped, neighbours that address like one dim merged.
template <typename Index, int kMaxDims>
Index row_index(const at::Tensor& t, int64_t end, const char* op) {
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
  TORCH_CHECK(sizes.size() <= static_cast<size_t>(kMaxDims), op, ": more than ", kMaxDims,
              " non-mergeable leading dims");
  Index index;
  index.ndim = static_cast<int>(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    index.sizes[i] = sizes[i];
    index.strides[i] = strides[i];
  }
  return index;
}

inline int64_t leading_numel(const at::Tensor& t, int64_t end) {
  int64_t n = 1;
  for (int64_t d = 0; d < end; ++d) n *= t.size(d);
  return n;
}

// Length of x[..., :stop] (Python slice semantics).
inline int64_t slice_len(int64_t hidden, std::optional<int64_t> stop) {
  if (!stop.has_value()) return hidden;
  const int64_t s = *stop;
  return s < 0 ? std::max<int64_t>(0, hidden + s) : std::min(s, hidden);
}

inline std::vector<int64_t> with_last(const at::Tensor& t, int64_t last) {
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  sizes.back() = last;
  return sizes;
}

// A contiguous [hidden] weight of x's dtype and device, or null.
inline const void* check_weight(const std::optional<at::Tensor>& weight, const at::Tensor& x,
                                const char* op) {
  if (!weight.has_value()) return nullptr;
  const at::Tensor& w = *weight;
  TORCH_CHECK(w.scalar_type() == x.scalar_type(), op, ": weight dtype ", w.scalar_type(),
              " differs from x dtype ", x.scalar_type());
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(-1) && (w.size(0) <= 1 || w.stride(0) == 1), op,
              ": weight must be a contiguous [", x.size(-1), "] tensor, got ", w.sizes(),
              " with strides ", w.strides());
  TORCH_CHECK(w.device() == x.device(), op, ": weight is on ", w.device(), ", x on ", x.device());
  return w.const_data_ptr();
}

// How x.reshape(tokens, -1, head_size) addresses x: the leading `token_dims` dims are tokens,
// then `heads` heads `head_stride` apart, each head_size contiguous features.
struct HeadsLayout {
  int64_t token_dims = 0;
  int64_t heads = 0;
  int64_t head_stride = 0;
};

inline HeadsLayout heads_layout(const at::Tensor& x, int64_t tokens, int64_t head_size, const char* op,
                                const char* name) {
  HeadsLayout layout;
  int64_t prod = 1;
  while (layout.token_dims < x.dim() && prod != tokens) prod *= x.size(layout.token_dims++);
  TORCH_CHECK(prod == tokens, op, ": ", name, " of shape ", x.sizes(), " does not start with dims of ",
              tokens, " tokens (positions.numel())");
  std::vector<int64_t> sizes, strides;  // per-token dims, size-1 dims dropped
  for (int64_t d = layout.token_dims; d < x.dim(); ++d) {
    if (x.size(d) != 1) {
      sizes.push_back(x.size(d));
      strides.push_back(x.stride(d));
    }
  }
  const int64_t per_token = x.numel() / std::max<int64_t>(tokens, 1);
  TORCH_CHECK(head_size > 0 && per_token % head_size == 0, op, ": ", name, " has ", per_token,
              " features per token, not a multiple of head_size ", head_size);
  if (sizes.size() == 2 && sizes[1] == head_size && strides[1] == 1) {
    layout.heads = sizes[0];
    layout.head_stride = strides[0];
    return layout;
  }
  int64_t expect = 1;  // otherwise a token's features must be contiguous: heads head_size apart
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 1; i >= 0; --i) {
    TORCH_CHECK(strides[i] == expect, op, ": unsupported layout of ", name, " (sizes ", x.sizes(),
                ", strides ", x.strides(), ")");
    expect *= sizes[i];
  }
  layout.heads = per_token / head_size;
  layout.head_stride = head_size;
  return layout;
}

// Static fp8 scales as the native op broadcasts them: x and the fp32 scale expanded to the output
// shape, the scale's last dim holding `groups` groups of hidden / groups features.
struct StaticScaleLayout {
  at::Tensor x;
  at::Tensor scale;
  std::vector<int64_t> out_shape;
  int64_t groups = 1;
};

inline StaticScaleLayout static_scale_layout(const at::Tensor& x, const at::Tensor& scale,
                                             const char* op) {
  StaticScaleLayout layout;
  at::Tensor s = scale.to(at::kFloat);
  if (s.dim() == 1 && s.numel() > 1) s = s.unsqueeze(0);
  if (s.dim() == 0) s = s.reshape({1});
  const int64_t hidden = x.size(-1);
  layout.groups = s.size(-1);
  TORCH_CHECK(layout.groups >= 1 && hidden % layout.groups == 0, op, ": hidden size ", hidden,
              " is not divisible into ", layout.groups, " scale groups");
  std::vector<int64_t> s_shape(s.sizes().begin(), s.sizes().end());
  s_shape.back() = layout.groups > 1 ? hidden : 1;
  layout.out_shape = at::infer_size(x.sizes(), s_shape);
  std::vector<int64_t> s_target(layout.out_shape);
  s_target.back() = layout.groups;
  layout.x = x.expand(layout.out_shape);
  layout.scale = s.expand(s_target);
  return layout;
}

}  // namespace reference_kernels
