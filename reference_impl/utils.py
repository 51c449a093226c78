"""Small helpers shared across the runtime."""

import importlib


def resolve_obj_by_qualname(qualname: str):
    """Import `package.module.Name` and return `Name`; raise ImportError naming the qualname."""
    module_name, _, obj_name = qualname.rpartition(".")
    if not module_name:
        raise ImportError(f"'{qualname}' is not a fully qualified name (expected 'module.Name')")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, obj_name)
    except AttributeError as exc:
        raise ImportError(f"module '{module_name}' has no attribute '{obj_name}' (from '{qualname}')") from exc


def enable_amx_tiles() -> bool:
    """Ask Linux for the AMX tile state where the CPU has AMX, as every engine process has it before its attention
    runs (its first bf16 GEMM, in oneDNN, asks): AMX kernels that assume it (vLLM's CPU attention in bf16) die of
    SIGILL in a process that never asked. True when the state was granted, False on a CPU without AMX."""
    import torch

    if not torch.cpu._is_amx_tile_supported():
        return False
    init = getattr(torch._C._cpu, "_init_amx", None)   # torch 2.3 and later
    return bool(init()) if init is not None else False
