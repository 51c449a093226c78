"""vLLM's CPU platform naming one of the plugin's communicators (communicators.py).

vLLM imports this module while it resolves `current_platform`: nothing here may need `current_platform` at import.
"""

from vllm.platforms.cpu import CpuPlatform

_COMM = "conformance_vllm_collective.communicators."


class TwinCpuPlatform(CpuPlatform):
    communicator = "TwinCommunicator"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return _COMM + cls.communicator


class WrongDimCpuPlatform(TwinCpuPlatform):
    communicator = "WrongDimCommunicator"


class WrongChunkCpuPlatform(TwinCpuPlatform):
    communicator = "WrongChunkCommunicator"


class RemainderCpuPlatform(TwinCpuPlatform):
    communicator = "RemainderCommunicator"


class IgnoresSrcDstCpuPlatform(TwinCpuPlatform):
    communicator = "IgnoresSrcDstCommunicator"


class HangsCpuPlatform(TwinCpuPlatform):
    communicator = "HangsCommunicator"


class CrashesCpuPlatform(TwinCpuPlatform):
    communicator = "CrashesCommunicator"


class BaseReduceScatterCpuPlatform(TwinCpuPlatform):
    communicator = "BaseReduceScatterCommunicator"
