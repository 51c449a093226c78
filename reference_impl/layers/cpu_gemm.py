"""Prepacked oneDNN GEMMs for the linear layers and the LM head of a model on the CPU.

The same product `x W^T + b` as `F.linear`, from a weight reordered once into oneDNN's blocked layout
(what vLLM's CPU backend does after loading, `create_onednn_mm`). With few rows (decode steps of a
small batch) torch's default CPU GEMM runs several times slower than oneDNN on a prepacked weight,
on AVX2 machines especially.

16-bit weights on a CPU without 16-bit arithmetic (bf16: AVX512_BF16 or AMX; fp16: AVX512_FP16 or AMX-FP16)
are packed as float32 copies: bf16 products are exact in float32 and both paths accumulate in float32, so only
the summation order differs from a bf16 GEMM. oneDNN does run bf16 on a plain AVX-512 CPU, emulated, and
torch's own bf16 `F.linear` takes that path, but it is about 4x slower than float32 from two rows on (2048x768,
512 rows: 27 ms against 6 ms). With a single row, a product bound by reading the weight, the emulated kernel
reads half the bytes and is 1.7-2.4x faster, so such a CPU also keeps the 16-bit pack, for one-row calls. Where
oneDNN has no 16-bit kernel at all (an AVX2-only CPU), one-row calls read the layer's own 16-bit weight through
`F.linear` instead: 1.6-2.1x faster than the float32 pack with the weights in DRAM (AMD EPYC, AVX2, 2 threads:
the 125M Llama's shapes, 768x2048 227 against 437 us, its 32000x768 LM head 3.7 against 5.9 ms).

`pack_cpu_gemms(model)` installs one per layer (`layer.cpu_gemm`); layers call `linear(self, x, W, b)`,
which uses it when it is current and falls back to `F.linear` otherwise (no pack, another device,
torch.compile tracing, or a weight written since it was packed). The pack is an extra copy of each
weight (twice the weight memory; three times for 16-bit weights packed as float32, four where the
emulated 16-bit pack is kept beside it).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def available() -> bool:
    """Whether this torch build has the oneDNN linear ops the packs use."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def computes_natively(dtype: torch.dtype) -> bool:
    """Whether this CPU has arithmetic for `dtype` (oneDNN emulates bf16 on plain AVX-512, slowly)."""
    if dtype == torch.float32:
        return True
    if dtype == torch.float16 and getattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: False)():
        return True   # AVX512_FP16 or AMX-FP16, by torch's oneDNN check
    checks = {torch.bfloat16: ("_is_avx512_bf16_supported", "_is_amx_tile_supported"),
              torch.float16: ("_is_amx_fp16_supported",)}.get(dtype, ())
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


class PackedCpuGemm:
    """One weight `[out, in]` reordered for oneDNN; `__call__(x, bias)` gives `x W^T + bias` in x's dtype.

    `packed` is the pack in `compute_dtype` (the weight's dtype where the CPU computes it natively, else
    float32); for one-row calls, `one_row` is the emulated 16-bit pack, or None, and `one_row_weight` the 16-bit
    weight itself where oneDNN has no 16-bit kernel, or None (module docstring)."""

    def __init__(self, weight: torch.Tensor):
        w = weight.detach()
        self.source = (weight.data_ptr(), weight._version)
        self.one_row = self.one_row_weight = None
        if computes_natively(w.dtype):
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
                self.compute_dtype = w.dtype
                return
            except RuntimeError:   # no oneDNN kernel for this dtype: float32 below
                pass
        else:
            try:
                self.one_row = torch.ops.mkldnn._reorder_linear_weight(w, None)
            except RuntimeError:   # oneDNN has no 16-bit kernel here (AVX2): F.linear reads the weight itself
                self.one_row_weight = w
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w.float(), None)
        self.compute_dtype = torch.float32

    def is_current(self, weight: torch.Tensor) -> bool:
        return (weight.data_ptr(), weight._version) == self.source

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        dtype = x.dtype
        if x.shape[0] == 1 and self.one_row is not None:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.one_row, bias, "none", [], "")
        if x.shape[0] == 1 and self.one_row_weight is not None:
            return F.linear(x, self.one_row_weight, bias)
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
