"""vLLM's CPU platform as an out-of-tree device that prefers the plugin's rms_norm.

vLLM imports this module while it resolves `current_platform`: nothing here may need `current_platform`
at import (vllm.config does), so the config import is inside the method.
"""

from vllm.platforms import PlatformEnum
from vllm.platforms.cpu import CpuPlatform


class GoodCpuPlatform(CpuPlatform):
    _enum = PlatformEnum.OOT     # vLLM's CustomOps dispatch to forward_oot, where the replacements live
    device_name = "cpu"          # a torch device type: vLLM builds torch.device(f"{device_name}:{rank}")

    @classmethod
    def get_default_ir_op_priority(cls, vllm_config):
        from vllm.config.kernel import IrOpPriorityConfig

        return IrOpPriorityConfig.with_default(["native"], rms_norm=["good_cpu", "native"])

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        if vllm_config.parallel_config.worker_cls == "auto":   # the engine runs in the plugin's worker
            vllm_config.parallel_config.worker_cls = "conformance_vllm_good.worker.GoodCpuWorker"
        super().check_and_update_config(vllm_config)
