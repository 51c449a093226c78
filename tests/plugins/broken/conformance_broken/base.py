"""Shared pieces of the broken fixtures: a platform base and a correct RMS norm to break."""

import torch

from reference_impl.platforms import Platform, PlatformEnum


def make_platform(fault: str, defaults: dict[str, list[str]] | None = None, attention: bool = False):
    """An OOT CPU platform named after `fault` that imports `conformance_broken.<fault>` for kernels; with
    `attention`, its attention backend is `conformance_broken.<fault>_kernels.Backend`."""

    class BrokenPlatform(Platform):
        _enum = PlatformEnum.OOT
        device_name = f"broken_{fault}"
        device_type = "cpu"
        dispatch_key = "CPU"
        supported_dtypes = [torch.float32, torch.float16, torch.bfloat16]

        def import_ir_kernels(self) -> None:
            import importlib

            importlib.import_module(f"conformance_broken.{fault}_kernels")

        def get_default_ir_op_priority(self) -> dict[str, list[str]]:
            return dict(defaults if defaults is not None else {"rms_norm": ["broken", "native"]})

        def get_attn_backend_cls(self, selected_backend, selector_config, num_heads=None) -> str:
            if attention:
                return f"conformance_broken.{fault}_kernels.Backend"
            return super().get_attn_backend_cls(selected_backend, selector_config, num_heads)

        def opaque_attention_op(self) -> bool:
            return attention      # an attention fixture runs attention as one opaque op, as vLLM's CPU platform

    BrokenPlatform.__qualname__ = BrokenPlatform.__name__ = "Platform"
    BrokenPlatform.__module__ = f"conformance_broken.{fault}"
    return BrokenPlatform


def good_rms_norm(x, weight, epsilon, variance_size=None):
    x32 = x.to(torch.float32)
    stats = x32 if variance_size is None else x32[..., :variance_size]
    out = x32 * torch.rsqrt(stats.square().mean(dim=-1, keepdim=True) + epsilon)
    return weighted(out, weight, x.dtype)


def weighted(normalized, weight, dtype):
    """vLLM 0.32's weighting: the normalized float32 value cast to the weight's dtype, times it, cast to x's."""
    return (normalized.to(weight.dtype) * weight if weight is not None else normalized).to(dtype)
