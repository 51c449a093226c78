"""Prepacked oneDNN GEMMs for the linear layers and the LM head of a model on the CPU.

The same product `x W^T + b` as `F.linear`, from a weight reordered once into oneDNN's blocked layout
(what vLLM's CPU backend does after loading, `create_onednn_mm`). With few rows (decode steps of a
small batch) torch's default CPU GEMM runs several times slower than oneDNN on a prepacked weight,
on AVX2 machines especially. 16-bit weights that oneDNN cannot pack natively on this CPU (no
AVX-512 / AMX bf16) are packed as float32 copies: bf16 products are exact in float32 and both paths
accumulate in float32, so only the summation order differs from a bf16 GEMM.

`pack_cpu_gemms(model)` installs one per layer (`layer.cpu_gemm`); layers call `linear(self, x, W, b)`,
which uses it when it is current and falls back to `F.linear` otherwise (no pack, another device,
torch.compile tracing, or a weight written since it was packed). The pack is an extra copy of each
weight (twice the weight memory; three times for upcast 16-bit weights).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def available() -> bool:
    """Whether this torch build has the oneDNN linear ops the packs use."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedCpuGemm:
    """One weight `[out, in]` reordered for oneDNN; `__call__(x, bias)` gives `x W^T + bias` in x's dtype."""

    def __init__(self, weight: torch.Tensor):
        w = weight.detach()
        self.source = (weight.data_ptr(), weight._version)
        try:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
            self.compute_dtype = w.dtype
        except RuntimeError:   # no native oneDNN kernel for this dtype on this CPU: float32 copy
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w.float(), None)
            self.compute_dtype = torch.float32

    def is_current(self, weight: torch.Tensor) -> bool:
        return (weight.data_ptr(), weight._version) == self.source

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        dtype = x.dtype
        if dtype != self.compute_dtype:
            x = x.to(self.compute_dtype)
            bias = None if bias is None else bias.to(self.compute_dtype)
        out = torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, bias, "none", [], "")
        return out if out.dtype == dtype else out.to(dtype)


def linear(layer: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`x W^T + b` for `layer`: its current CPU pack when it has one and x is a 2-D CPU tensor, else F.linear."""
    if torch.compiler.is_compiling():
        return F.linear(x, weight, bias)
    pack = layer.__dict__.get("cpu_gemm")
    if pack is None or x.device.type != "cpu" or x.dim() != 2 or x.dtype != weight.dtype or not pack.is_current(weight):
        return F.linear(x, weight, bias)
    return pack(x, bias)


MIN_PACKED_ELEMENTS = 1 << 18   # smaller weights: oneDNN's ~25 us call overhead outweighs the faster kernel


def pack_cpu_gemms(model: nn.Module, min_elements: int = MIN_PACKED_ELEMENTS) -> int:
    """Pack the weight of every CPU layer of `model` that computes through `linear` (the layers say so
    with `computes_through_cpu_gemm = True`) and has at least `min_elements` elements; returns how many."""
    if not available():
        return 0
    count = 0
    for module in model.modules():
        if (getattr(module, "computes_through_cpu_gemm", False) and module.weight.device.type == "cpu"
                and module.weight.numel() >= min_elements):
            module.cpu_gemm = PackedCpuGemm(module.weight)
            count += 1
    return count


def unpack_cpu_gemms(model: nn.Module) -> None:
    """Drop every pack `pack_cpu_gemms` installed (the layers go back to F.linear)."""
    for module in model.modules():
        module.__dict__.pop("cpu_gemm", None)
