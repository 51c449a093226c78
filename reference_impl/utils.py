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
