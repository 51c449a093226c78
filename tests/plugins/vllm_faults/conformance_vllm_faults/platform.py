"""vLLM's CPU platform as an out-of-tree device: vLLM's CustomOps dispatch to forward_oot here."""

from vllm.platforms import PlatformEnum
from vllm.platforms.cpu import CpuPlatform


class FaultsCpuPlatform(CpuPlatform):
    _enum = PlatformEnum.OOT
    device_name = "faults_cpu"
