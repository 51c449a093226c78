"""Undo what activating a platform in the test process registers: IR providers, register_oot replacements, and the
current platform. A test that activates a plugin (or the vLLM bridge) in process wraps it in `registrations_undone()`,
so the tests after it in the same worker see the reference's own layers and providers (the vLLM bridge registers
vLLM's layers as replacements of ours: a reference DualChunkRotaryEmbedding built afterwards would be vLLM's)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def registrations_undone() -> Iterator[None]:
    from reference_impl.custom_op import CustomOp
    from reference_impl.ir.op import IrOp
    from reference_impl.platforms import CpuPlatform, activate_platform

    with activate_platform(CpuPlatform()):   # the built-in providers register on first activation: not undone below
        pass
    before_ir = {name: set(op.impls) for name, op in IrOp.registry.items()}
    before_oot = dict(CustomOp.op_registry_oot)
    try:
        with activate_platform(CpuPlatform()):   # whatever the block makes current, the previous platform returns
            yield
    finally:
        for name, op in IrOp.registry.items():
            for provider in set(op.impls) - before_ir.get(name, set()):
                op.remove_impl(provider)
        CustomOp.op_registry_oot.clear()
        CustomOp.op_registry_oot.update(before_oot)
