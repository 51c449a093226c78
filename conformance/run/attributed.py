"""The run header's and scorecard's lines that say whose code the run grades (conformance.collect.origin).

What the platform brings, split by origin: the IR providers and `register_oot` replacements of the
distribution under test, named by the vendor's own function or class (not the bridge's wrapper), and apart
from them upstream code graded on the platform (vLLM's kernels and in-tree classes under a vendor's vLLM
plugin) and, for a bridged runtime, its in-tree classes that no vendor replaced.
"""

from __future__ import annotations


def _label(origin) -> str:
    return f"{origin.distribution or 'unknown distribution'} {origin.version or ''}".strip()


def header_lines(inventory, table) -> list[str]:
    """`IR providers brought`, `CustomOp replacements`, and where any, the in-tree classes and upstream code."""
    own_ir, up_ir = [], []
    for op, providers in inventory.ir_providers.items():
        for provider in providers:
            origin = table.ir.get((op, provider))
            (up_ir if origin is not None and origin.upstream else own_ir).append((op, provider, origin))
    replacements, in_tree, up_layers = [], [], []
    for key, rep in inventory.oot.items():
        origin = table.layers.get(rep.__qualname__)
        code = origin.code if origin is not None and origin.code else f"{rep.__module__}.{rep.__qualname__}"
        if origin is not None and origin.upstream:
            up_layers.append(key)
        elif getattr(rep, "conformance_in_tree", False):
            in_tree.append(f"{key} ({code})")
        else:
            replacements.append(f"{key} -> {code}")
    lines = [f"conformance: IR providers brought: {_providers(own_ir)}",
             f"conformance: CustomOp replacements (register_oot): {', '.join(replacements) or 'none'}"]
    if in_tree:
        lines.append(f"conformance: in-tree classes graded as they run on the platform (not replacements, "
                     f"{_label(table.platform) if table.platform else 'the runtime'}): {', '.join(in_tree)}")
    if up_ir or up_layers:
        dists = sorted({_label(o) for _, _, o in up_ir if o} | {
            _label(table.layers[rep.__qualname__]) for rep in inventory.oot.values()
            if rep.__qualname__ in table.layers and table.layers[rep.__qualname__].upstream})
        lines.append(f"conformance: upstream code graded on the platform ({', '.join(dists)}; not the distribution "
                     f"under test, {table.under_test}): IR providers {_providers(up_ir)}; in-tree classes "
                     f"{', '.join(up_layers) or 'none'}")
    return lines


def _providers(items) -> str:
    by_op: dict[str, list[str]] = {}
    for op, provider, _ in items:
        by_op.setdefault(op, []).append(provider)
    return "; ".join(f"{op}: {', '.join(p)}" for op, p in by_op.items()) or "none"


def layer_note(inventory, table) -> str:
    """'CustomOp layers replaced: N / M (names)' counting the distribution under test's layers; upstream
    classes graded on the platform on a line of their own."""
    replaced = inventory.replaced_layers()
    total = len(inventory.in_tree_layers())
    own, upstream = [], []
    for name, (_, rep) in replaced.items():
        origin = table.layers.get(rep.__qualname__) if table is not None else None
        (upstream if origin is not None and origin.upstream else own).append(name)
    note = f"CustomOp layers replaced: {len(own)} / {total}" + (f" ({', '.join(sorted(own))})" if own else "")
    if upstream:
        note += (f"\nupstream layers graded on the platform, not counted ({len(upstream)}, not your code): "
                 f"{', '.join(sorted(upstream))}")
    return note
