"""The per-batch state an attention layer reads when it runs as one opaque op: each layer's metadata and slot
mapping by layer name, and the live layers by name. vLLM keeps the same in its forward context, so that a
compiled graph takes only tensors and the layer's name and never guards on a batch's metadata."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

_LAYERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_CONTEXT: dict[str, tuple[Any, Any]] | None = None


def register_layer(name: str, layer) -> None:
    """Make `layer` findable by `name` (its prefix) from inside the opaque op."""
    _LAYERS[name] = layer


def layer_named(name: str):
    layer = _LAYERS.get(name)
    if layer is None:
        raise KeyError(f"no live attention layer named {name!r} (give each Attention layer a distinct prefix)")
    return layer


@contextlib.contextmanager
def set_forward_context(per_layer: dict[str, tuple[Any, Any]]) -> Iterator[None]:
    """Layer name -> (attention metadata, slot mapping) for the batch run inside the block."""
    global _CONTEXT
    previous, _CONTEXT = _CONTEXT, dict(per_layer)
    try:
        yield
    finally:
        _CONTEXT = previous


def batch_of(name: str) -> tuple[Any, Any]:
    """(metadata, slot mapping) of layer `name` in the current forward context."""
    if _CONTEXT is None or name not in _CONTEXT:
        raise RuntimeError(f"attention layer {name!r} runs as an opaque op and reads its metadata from the forward "
                           "context: call it inside set_forward_context({name: (metadata, slot_mapping)})")
    return _CONTEXT[name]
