"""The `Platform` base class and `PlatformEnum`: what a vendor subclasses (docs/plugin-api.md §2)."""

from __future__ import annotations

import enum

import torch


class PlatformEnum(enum.Enum):
    CUDA = enum.auto()
    ROCM = enum.auto()
    TPU = enum.auto()
    XPU = enum.auto()
    CPU = enum.auto()
    OOT = enum.auto()
    UNSPECIFIED = enum.auto()


class Platform:
    """A hardware platform: its identity, the dtypes it supports, and its kernel defaults.

    Every hook has a working default so a vendor overrides only what differs.
    """

    _enum: PlatformEnum = PlatformEnum.UNSPECIFIED
    device_name: str = "unspecified"
    device_type: str = "cpu"
    dispatch_key: str = "CPU"
    supported_dtypes: list[torch.dtype] = [torch.float32, torch.float16, torch.bfloat16]
    dist_backend: str = "gloo"     # torch.distributed backend of the device group (vLLM's attribute of that name)

    def is_cuda(self) -> bool:
        return self._enum == PlatformEnum.CUDA

    def is_rocm(self) -> bool:
        return self._enum == PlatformEnum.ROCM

    def is_tpu(self) -> bool:
        return self._enum == PlatformEnum.TPU

    def is_xpu(self) -> bool:
        return self._enum == PlatformEnum.XPU

    def is_cpu(self) -> bool:
        return self._enum == PlatformEnum.CPU

    def is_out_of_tree(self) -> bool:
        return self._enum == PlatformEnum.OOT

    def is_unspecified(self) -> bool:
        return self._enum == PlatformEnum.UNSPECIFIED

    def is_cuda_alike(self) -> bool:
        return self._enum in (PlatformEnum.CUDA, PlatformEnum.ROCM)

    def import_ir_kernels(self) -> None:
        """Import the modules that register this platform's IR implementations (none by default)."""

    def get_default_ir_op_priority(self) -> dict[str, list[str]]:
        """Op name -> provider names, first preferred. An op left out uses `["native"]`."""
        return {}

    def get_attn_backend_cls(self, selected_backend, selector_config, num_heads: int | None = None) -> str:
        """The qualname of the attention backend for a layer (vLLM 0.32's hook): `selected_backend` is an
        `AttentionBackendEnum` member the user asked for (or None), `selector_config` an
        `AttentionSelectorConfig` (reference_impl.attention). Default: the asked-for backend, else the pure-torch
        reference backend (reference_impl/attention/reference.py)."""
        if selected_backend is not None:
            return selected_backend.get_path()
        return "reference_impl.attention.reference.ReferenceAttentionBackend"

    def opaque_attention_op(self) -> bool:
        """Whether attention runs as one opaque custom op (vLLM 0.32's hook): torch.compile then traces only that
        call, never the backend's code (reference_impl/attention/layer.py). False by default, as in vLLM."""
        return False

    def get_device_communicator_cls(self) -> str:
        """The qualname of the device communicator class (vLLM 0.32's hook): vLLM's `GroupCoordinator` builds one per
        group of more than one rank, `cls(cpu_group=, device=, device_group=, unique_name=, use_all2all=)`, with
        `DeviceCommunicatorBase`'s methods. Default: the reference communicator over torch.distributed
        (reference_impl/distributed/communicator.py; its contract: docs/collectives.md)."""
        return "reference_impl.distributed.communicator.ReferenceCommunicator"

    @classmethod
    def check_and_update_config(cls, config) -> None:
        """Adjust the runtime config (a `reference_impl.config.RuntimeConfig`, about to be installed
        by `set_current_config`) for this platform; nothing by default. Not annotated: the config
        module consults the platform, so the platform does not import the config module back."""

    def __repr__(self) -> str:
        return f"{type(self).__module__}.{type(self).__qualname__}(device_name={self.device_name!r})"
