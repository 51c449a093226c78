"""Host-side helpers of the Triton provider: row views, launch options, argument checks."""

from __future__ import annotations

import torch

from reference_impl.kernels.triton import _env

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Passed to every launch; the interpreter drops options it does not know. FMA contraction stays
# off so float32 results round like the native op's separate multiply and add.
LAUNCH_OPTIONS = {"enable_fp_fusion": False}


def rows_view(t: torch.Tensor) -> torch.Tensor | None:
    """`t` as a 2-D `[rows, last]` view sharing its memory, or None when no such view exists."""
    if t.dim() == 0:
        return None
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return None


def rows_or_copy(t: torch.Tensor) -> torch.Tensor:
    """A 2-D `[rows, last]` view of `t`, copying only when the leading dims cannot be merged."""
    view = rows_view(t)
    return view if view is not None else t.reshape(-1, t.shape[-1])


def float_tensor_ok(t: torch.Tensor | None) -> bool:
    """A tensor the kernels can read: a supported float dtype, on a device triton can reach."""
    return t is None or (t.dtype in FLOAT_DTYPES and _env.device_ok(t))


def slice_length(n: int, stop: int | None) -> int:
    """`len(range(n)[:stop])`: how many features `x[..., :stop]` keeps."""
    return n if stop is None else len(range(n)[:stop])


LIBRARY = "reference_triton"


def triton_op(name: str, *, mutates_args: tuple[str, ...] = (), fake=None):
    """Declare the decorated launcher as the opaque torch op `reference_triton::<name>`.

    Compiled graphs then call the op instead of tracing into the Triton launch (which needs real
    data pointers). `fake` computes output metadata: the IR op's native function for functional
    ops; in-place (mutating) ops return nothing and need none.
    """

    def decorator(fn):
        op = torch.library.custom_op(f"{LIBRARY}::{name}", fn, mutates_args=mutates_args)
        if fake is not None:
            op.register_fake(fake)
        return op

    return decorator
