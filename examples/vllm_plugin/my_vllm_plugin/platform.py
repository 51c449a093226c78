"""The platform: vLLM's CPU platform as an out-of-tree device, preferring the plugin's rms_norm, whose engine
runs in the plugin's worker (worker.py).

vLLM imports this module while it resolves `current_platform`, so it imports nothing that needs
`current_platform` (vllm.config does): that import happens inside the method, as in vLLM's own.
"""

from vllm.platforms import PlatformEnum
from vllm.platforms.cpu import CpuPlatform


class MyCpuPlatform(CpuPlatform):
    # Out of tree: vLLM's CustomOps dispatch to forward_oot, where the plugin's replacements live.
    _enum = PlatformEnum.OOT
    # vLLM builds an out-of-tree platform's devices as torch.device(f"{device_name}:{rank}"): a torch device type
    device_name = "cpu"

    @classmethod
    def get_default_ir_op_priority(cls, vllm_config):
        from vllm.config.kernel import IrOpPriorityConfig

        # the plugin's kernel first; native takes whatever my_cpu's supports_args declines
        return IrOpPriorityConfig.with_default(["native"], rms_norm=["my_cpu", "native"])

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        if vllm_config.parallel_config.worker_cls == "auto":
            vllm_config.parallel_config.worker_cls = "my_vllm_plugin.worker.MyCpuWorker"
        super().check_and_update_config(vllm_config)
