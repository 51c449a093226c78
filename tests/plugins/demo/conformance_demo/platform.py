"""The demo platform: an out-of-tree platform whose tensors live on the CPU."""

import torch

from reference_impl.platforms import Platform, PlatformEnum


class DemoPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name = "demo"
    device_type = "cpu"
    dispatch_key = "CPU"
    supported_dtypes = [torch.float32, torch.float16, torch.bfloat16]

    def import_ir_kernels(self) -> None:
        import conformance_demo.kernels  # noqa: F401

    def get_default_ir_op_priority(self) -> dict[str, list[str]]:
        return {"rms_norm": ["demo", "native"], "fused_add_rms_norm": ["demo", "native"]}
