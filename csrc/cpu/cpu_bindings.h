// Argument checks and dtype dispatch shared by the CPU-only torch bindings of reference_cpu
// (attention_bindings.cpp, gemm_bindings.cpp): every message names the op and the argument.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace reference_cpu {

// A CPU tensor of a float dtype the kernels take (float32, float16, bfloat16).
inline void check_float(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got ", t.device());
  const auto st = t.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16, op, ": ", name, " dtype ", st,
              " is not supported (float32, float16, bfloat16)");
}

// fn.template operator()<T>() for a dtype check_float accepted.
template <typename Fn>
void dispatch(at::ScalarType st, Fn&& fn) {
  switch (st) {
    case at::kFloat:
      return fn.template operator()<float>();
    case at::kHalf:
      return fn.template operator()<c10::Half>();
    default:
      return fn.template operator()<c10::BFloat16>();
  }
}

}  // namespace reference_cpu
