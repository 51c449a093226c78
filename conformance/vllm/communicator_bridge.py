"""The collective family's ranks under `--platform=vllm`: what a rank does before it builds the communicator, so that
it builds the class vLLM's resolved platform names, on the device and backend vLLM's `GroupCoordinator` would use.

The bridge's platform names this function in `conformance_communicator_setup`; each rank process of the family's
process group (conformance/checks/collective/ranks.py) calls it by that name (the checks never import the bridge).
It resolves vLLM's `current_platform` in the rank (the same plugins, from the inherited environment), imports its
kernels (vLLM's CPU build: `torch.ops._C`, whose `init_shm_manager` and `shm_*` ops CpuCommunicator's tp and pp groups
use), and keeps `VLLM_DIST_IDENT` (the shared-memory group name every rank of a group must agree on) as the runner set
it for the whole group.
"""

from __future__ import annotations


def prepare_rank(rank: int, world: int, recipe: dict) -> dict:
    """{"cls", "device", "backend"} as vLLM's GroupCoordinator resolves them on rank `rank` (its local rank)."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    if current_platform.is_cuda_alike():
        device = f"cuda:{current_platform.logical_device_id_to_visible_device_id(rank)}"
    elif current_platform.is_xpu():
        device = f"xpu:{rank}"
    elif current_platform.is_out_of_tree():
        device = f"{current_platform.device_name}:{rank}"
    else:
        device = "cpu"
    return {"cls": current_platform.get_device_communicator_cls(), "device": device,
            "backend": current_platform.dist_backend or "gloo"}
