"""Prepacked GEMMs for the linear layers and the LM head of a model on the CPU.

The same product `x W^T + b` as `F.linear`, from copies of the weight laid out once for a faster kernel:

- Calls of up to `PANEL_MAX_ROWS` rows (decode steps, short prompts) run the C++ panel GEMM
  (`reference_cpu::panel_gemm`, csrc/cpu/gemm.cpp) on the weight packed into column panels in its own
  dtype. Such a product reads every weight once and is bound by that read; oneDNN's prepacked kernels read
  a 125M Llama's float32 weights at 10-22 GB/s on a 2-core AVX2 EPYC, the panels at 16-25 GB/s (1.12-1.52x
  at 1-16 rows, two runs), and 16-bit weights are read as 16-bit (2.64x oneDNN's float32 pack at 8 rows there).
  Sums are fp32 and rounded to the weight's dtype once, as a 16-bit GEMM does.
- Other calls (prefills) run oneDNN on a weight reordered into its blocked layout (what vLLM's CPU backend
  does after loading, `create_onednn_mm`).

16-bit weights on a CPU without 16-bit arithmetic (bf16: AVX512_BF16 or AMX; fp16: AVX512_FP16 or AMX-FP16)
get a float32 oneDNN pack: bf16 products are exact in float32 and both paths accumulate in float32, so only
the summation order differs from a bf16 GEMM. oneDNN does run bf16 on a plain AVX-512 CPU, emulated, and
torch's own bf16 `F.linear` takes that path, but it is about 4x slower than float32 from two rows on (2048x768,
512 rows: 27 ms against 6 ms).

Without the C++ kernels (no compiler, or REFERENCE_IMPL_DISABLE_CPP_KERNELS set), few-row calls take oneDNN
too, and one-row 16-bit calls on such a CPU read 16 bits a weight another way: oneDNN's emulated 16-bit pack
where it has one (1.7-2.4x faster than float32 for a single row), else the layer's own weight through
`F.linear` (AVX2: 1.6-2.1x faster than the float32 pack).

`pack_cpu_gemms(model)` installs one per layer (`layer.cpu_gemm`); layers call `linear(self, x, W, b)`,
which uses it when it is current and falls back to `F.linear` otherwise (no pack, another device,
torch.compile tracing, or a weight written since it was packed). Memory: the oneDNN pack and the panels are
each a copy of the weight (three times the weight memory in float32; for 16-bit weights packed as float32,
four times).
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


# Rows up to which a call takes the panel GEMM: at 64 rows it was still 1.21-1.25x oneDNN in float32 on a 2-core
# AVX2 EPYC, 0.99x at 128; prefills of hundreds of rows keep oneDNN's blocked kernels.
PANEL_MAX_ROWS = 64


def panel_ops():
    """`torch.ops.reference_cpu` when the C++ kernels can be used here (built now on first use), else None."""
    from reference_impl.kernels import _cpp_build

    try:   # raises CppKernelBuildError, naming the problem, where they cannot be built
        return _cpp_build.ops()
    except _cpp_build.CppKernelBuildError:
        return None


class PackedCpuGemm:
    """One weight `[out, in]` prepacked; `__call__(x, bias)` gives `x W^T + bias` in x's dtype.

    `panels` is the weight in column panels for calls of up to PANEL_MAX_ROWS rows (None without the C++
    kernels); `packed` the oneDNN pack in `compute_dtype` (the weight's dtype where the CPU computes it
    natively, else float32). Without panels, for one-row calls, `one_row` is oneDNN's emulated 16-bit pack,
    or None, and `one_row_weight` the 16-bit weight itself where oneDNN has no 16-bit kernel, or None
    (module docstring)."""

    def __init__(self, weight: torch.Tensor, panels: bool = True):
        w = weight.detach()
        self.source = (weight.data_ptr(), weight._version)
        self.out_features = w.shape[0]
        self.one_row = self.one_row_weight = self.panels = None
        ops = panel_ops() if panels else None
        if ops is not None:
            self.panels = ops.pack_gemm_panels(w.contiguous())
            self._panel_gemm = ops.panel_gemm
        if computes_natively(w.dtype):
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
                self.compute_dtype = w.dtype
                return
            except RuntimeError:   # no oneDNN kernel for this dtype: float32 below
                pass
        elif self.panels is None:
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
        rows = x.shape[0]
        if self.panels is not None and rows <= PANEL_MAX_ROWS and dtype == self.panels.dtype:
            if bias is not None:
                bias = bias.to(dtype).contiguous()
            return self._panel_gemm(x if x.stride(-1) == 1 else x.contiguous(), self.panels, self.out_features, bias)
        if rows == 1 and self.one_row is not None:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.one_row, bias, "none", [], "")
        if rows == 1 and self.one_row_weight is not None:
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


MIN_PACKED_ELEMENTS = 1 << 18   # smaller weights: oneDNN's ~25 us call overhead outweighs its faster kernel


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
