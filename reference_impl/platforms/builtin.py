"""Built-in platforms and their detectors.

Each detector answers truthfully for this process: it returns the platform class's qualified name
when the device is usable, else None. Resolution (in `reference_impl.platforms`) combines them
with the out-of-tree platform plugins.
"""

from __future__ import annotations

import importlib.util

import torch

from reference_impl.platforms.interface import Platform, PlatformEnum


class UnspecifiedPlatform(Platform):
    _enum = PlatformEnum.UNSPECIFIED
    device_name = "unspecified"
    device_type = "cpu"
    dispatch_key = "CPU"


class CpuPlatform(Platform):
    _enum = PlatformEnum.CPU
    device_name = "cpu"
    device_type = "cpu"
    dispatch_key = "CPU"
    supported_dtypes = [torch.float32, torch.float16, torch.bfloat16]

    def import_ir_kernels(self) -> None:
        import reference_impl.kernels.cpu  # noqa: F401  (registers the C++ CPU providers)
        import reference_impl.kernels.triton  # noqa: F401  (triton provider; not in the cpu defaults: interpreter only)

    def get_default_ir_op_priority(self) -> dict[str, list[str]]:
        from reference_impl.kernels.cpu import default_priority

        return default_priority()

    def get_attn_backend_cls(self, selected_backend, selector_config, num_heads: int | None = None) -> str:
        """The attention backend: the asked-for one, else the C++ paged-attention backend (csrc/cpu) where it
        can be built and serves the layer's configuration, else the reference backend."""
        if selected_backend is None:
            from reference_impl.attention import cpp_backend

            backend = cpp_backend.CppAttentionBackend
            if cpp_backend.available() and not backend.validate_configuration(**selector_config._asdict()):
                return cpp_backend.CLASS_PATH
        return super().get_attn_backend_cls(selected_backend, selector_config, num_heads)

    def opaque_attention_op(self) -> bool:
        """As vLLM's CPU platform: attention is one opaque op under torch.compile."""
        return True


class CudaPlatform(Platform):
    _enum = PlatformEnum.CUDA
    device_name = "cuda"
    device_type = "cuda"
    dispatch_key = "CUDA"
    dist_backend = "nccl"

    def import_ir_kernels(self) -> None:
        import reference_impl.kernels.cuda  # noqa: F401
        import reference_impl.kernels.triton  # noqa: F401

    def get_default_ir_op_priority(self) -> dict[str, list[str]]:
        from reference_impl.kernels.cuda import default_priority

        return default_priority()


class RocmPlatform(Platform):
    _enum = PlatformEnum.ROCM
    device_name = "rocm"
    device_type = "cuda"
    dispatch_key = "CUDA"


class XpuPlatform(Platform):
    _enum = PlatformEnum.XPU
    device_name = "xpu"
    device_type = "xpu"
    dispatch_key = "XPU"


class TpuPlatform(Platform):
    _enum = PlatformEnum.TPU
    device_name = "tpu"
    device_type = "xla"
    dispatch_key = "XLA"
    supported_dtypes = [torch.float32, torch.bfloat16]


def _has_accelerator() -> bool:
    return bool(_cuda_active() or _rocm_active() or _xpu_active() or _tpu_active())


def _cuda_active() -> str | None:
    if torch.version.cuda is not None and torch.cuda.is_available():
        return f"{__name__}.CudaPlatform"
    return None


def _rocm_active() -> str | None:
    if getattr(torch.version, "hip", None) is not None and torch.cuda.is_available():
        return f"{__name__}.RocmPlatform"
    return None


def _xpu_active() -> str | None:
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return f"{__name__}.XpuPlatform"
    return None


def _tpu_active() -> str | None:
    if importlib.util.find_spec("torch_xla") is None:
        return None
    try:
        import torch_xla.runtime as xr  # type: ignore[import-not-found]

        if xr.device_type() == "TPU":
            return f"{__name__}.TpuPlatform"
    except Exception:
        return None
    return None


def _cpu_active() -> str | None:
    """The CPU platform is active when no accelerator is usable in this process."""
    return None if _has_accelerator() else f"{__name__}.CpuPlatform"


# name -> detector; the names are also what `--platform` and `activate_platform` accept.
BUILTIN_PLATFORM_DETECTORS = {
    "cpu": _cpu_active,
    "cuda": _cuda_active,
    "rocm": _rocm_active,
    "xpu": _xpu_active,
    "tpu": _tpu_active,
}



def builtin_device_available(name: str) -> bool:
    """Whether built-in platform `name` can be activated explicitly here: its device is usable.

    Differs from its detector for the CPU, which is always usable but is only the *default*
    platform where no accelerator is (so `--platform=cpu` also runs on a GPU machine).
    """
    if name == "cpu":
        return True
    detector = BUILTIN_PLATFORM_DETECTORS.get(name)
    return detector is None or detector() is not None


BUILTIN_PLATFORM_CLASSES: dict[str, type[Platform]] = {
    "cpu": CpuPlatform,
    "cuda": CudaPlatform,
    "rocm": RocmPlatform,
    "xpu": XpuPlatform,
    "tpu": TpuPlatform,
    "unspecified": UnspecifiedPlatform,
}
