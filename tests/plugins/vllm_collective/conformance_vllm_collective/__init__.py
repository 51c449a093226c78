"""vLLM platform plugins (vLLM 0.32's public API only) that differ in their device communicator, each planting one
fault in a correct one (`TwinCommunicator`): choose one with `VLLM_PLUGINS=collective_<name>`.

- `collective_twin`: correct; vLLM's CPU platform with `TwinCommunicator`.
- `collective_wrong_dim`: `all_gather` concatenates along dim 0 whatever `dim` says.
- `collective_wrong_chunk`: `reduce_scatter` hands each rank the next rank's chunk.
- `collective_remainder`: `all_reduce` reduces world-size blocks and leaves the last `numel % world` elements as
  each rank's own input.
- `collective_ignores_src_dst`: `broadcast` always from rank 0, `gather` always to rank 0.
- `collective_hangs`: rank 1 never returns from `broadcast(src=1)`.
- `collective_crashes`: rank 1 dies (SIGSEGV) in `gather(dst=1)`.
- `collective_base_reduce_scatter`: the twin but with vLLM's own `DeviceCommunicatorBase.reduce_scatter` (so its
  fault is vLLM's, upstream of this plugin).
"""

_PLATFORM = "conformance_vllm_collective.platform."


def register_twin() -> str:
    return _PLATFORM + "TwinCpuPlatform"


def register_wrong_dim() -> str:
    return _PLATFORM + "WrongDimCpuPlatform"


def register_wrong_chunk() -> str:
    return _PLATFORM + "WrongChunkCpuPlatform"


def register_remainder() -> str:
    return _PLATFORM + "RemainderCpuPlatform"


def register_ignores_src_dst() -> str:
    return _PLATFORM + "IgnoresSrcDstCpuPlatform"


def register_hangs() -> str:
    return _PLATFORM + "HangsCpuPlatform"


def register_crashes() -> str:
    return _PLATFORM + "CrashesCpuPlatform"


def register_base_reduce_scatter() -> str:
    return _PLATFORM + "BaseReduceScatterCpuPlatform"
