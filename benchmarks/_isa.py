"""The vector ISA a CPU benchmark runs, and one switch for all three columns: torch, our C++ kernels, vLLM's.

`ATEN_CPU_CAPABILITY=avx2` holds torch to its AVX2 kernels; our kernels build for torch's capability
(reference_impl/kernels/_cpp_build.py). vLLM picks its library (`_C_AVX2`, `_C_AVX512`, `_C`) and its attention
ISA from `torch.cpu._is_avx512_supported()` and friends, which read the CPU: `follow_torch_isa()` makes them
answer for the capability torch was held to, so on an AVX-512 CPU every column runs AVX2 code. That stands in
for an AVX2-only machine (same cores and caches, 256-bit vectors); a real one can still differ.
"""

from __future__ import annotations

import platform

import torch


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def follow_torch_isa() -> str:
    """Call before vLLM is imported. The ISA every column runs, said for the benchmark's header."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "AVX2" and torch.cpu._is_avx512_supported():
        for probe in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported"):
            setattr(torch.cpu, probe, lambda: False)
        return "AVX2 (ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU: torch, our kernels and vLLM's _C_AVX2 run AVX2 code)"
    from reference_impl.utils import enable_amx_tiles

    enable_amx_tiles()   # vLLM's AMX attention kernel assumes a model runner's bf16 GEMM asked for it (else SIGILL)
    return capability
