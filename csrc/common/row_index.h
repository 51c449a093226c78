// RowIndex: flat row number -> element offset, shared by the CPU and CUDA kernels.
//
// For a tensor whose last dim is contiguous and whose leading dims have arbitrary strides
// (row-strided, sliced, broadcast with stride 0). Leading dims are collapsed by the bindings where
// possible, so the common case is one dim: offset = row * stride. Plain C++ (no torch headers),
// callable from host and device code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define REFERENCE_ROW_INDEX_HD __host__ __device__ __forceinline__
#else
#define REFERENCE_ROW_INDEX_HD inline
#endif

namespace reference_common {

constexpr int kMaxRowDims = 8;

struct RowIndex {
  int ndim = 0;
  int64_t sizes[kMaxRowDims] = {};
  int64_t strides[kMaxRowDims] = {};

  REFERENCE_ROW_INDEX_HD int64_t operator()(int64_t row) const {
    if (ndim == 1) return row * strides[0];
    int64_t offset = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      offset += (row % sizes[d]) * strides[d];
      row /= sizes[d];
    }
    return offset;
  }
};

}  // namespace reference_common
