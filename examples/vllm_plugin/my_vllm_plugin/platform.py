"""The platform: vLLM's CPU platform as an out-of-tree device, preferring the plugin's rms_norm.

vLLM imports this module while it resolves `current_platform`, so it imports nothing that needs
`current_platform` (vllm.config does): that import happens inside the method, as in vLLM's own.
"""

from vllm.platforms import PlatformEnum
from vllm.platforms.cpu import CpuPlatform


class MyCpuPlatform(CpuPlatform):
    # Out of tree: vLLM's CustomOps dispatch to forward_oot, where the plugin's replacements live.
    _enum = PlatformEnum.OOT
    device_name = "my_cpu"

    @classmethod
    def get_default_ir_op_priority(cls, vllm_config):
        from vllm.config.kernel import IrOpPriorityConfig

        # the plugin's kernel first; native takes whatever my_cpu's supports_args declines
        return IrOpPriorityConfig.with_default(["native"], rms_norm=["my_cpu", "native"])
