"""Your platform: identity, dtypes, where its kernels are registered, and their priority."""

import torch

from reference_impl.platforms import Platform, PlatformEnum


class MyVendorPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name = "myvendor"
    device_type = "cpu"          # the torch device type your tensors live on
    dispatch_key = "CPU"
    supported_dtypes = [torch.float32, torch.float16, torch.bfloat16]

    def import_ir_kernels(self) -> None:
        import my_vendor_plugin.kernels  # noqa: F401  (registers the IR implementations)

    def get_default_ir_op_priority(self) -> dict[str, list[str]]:
        return {"rms_norm": ["myvendor", "native"]}
