"""Loading the sampling fixtures of tests/plugins/broken/conformance_broken in process, and running the family."""

from __future__ import annotations

import contextlib
import importlib
import sys
from pathlib import Path

BROKEN = Path(__file__).resolve().parents[1] / "plugins" / "broken"


@contextlib.contextmanager
def fixture_platform(name: str):
    """An instance of `conformance_broken.<name>.Platform`, importable for the block; the package (and any IR
    provider its kernels registered) is gone afterwards."""
    from reference_impl.ir.op import IrOp

    before = {op_name: set(op.impls) for op_name, op in IrOp.registry.items()}
    sys.path.insert(0, str(BROKEN))
    try:
        yield importlib.import_module(f"conformance_broken.{name}").Platform()
    finally:
        sys.path.remove(str(BROKEN))
        for mod in [m for m in sys.modules if m == "conformance_broken" or m.startswith("conformance_broken.")]:
            del sys.modules[mod]
        for op_name, op in IrOp.registry.items():
            for provider in set(op.impls) - before.get(op_name, set()):
                op.remove_impl(provider)


def run_checks(platform_name: str, make_platform, family: str = "sampling", level: str = "quick",
               checks: tuple[str, ...] | None = None, dtype: str | None = "float32"):
    """(unit, verdict) of every unit of `family` (or of `checks`) on the platform, in this process."""
    from conformance.checks import records, run_unit
    from conformance.checks.common import CheckContext
    from conformance.collect.inventory import activate

    inventory = activate(platform_name, make_platform)
    ctx = CheckContext(platform_name, inventory.platform, seed=1234, level=level)
    out = []
    for record in records().values():
        if record.family != family or (checks is not None and record.name not in checks):
            continue
        for unit in record.units(inventory, record.family, record.name, level):
            if dtype is None or unit.dtype in (None, dtype):
                out.append((unit, run_unit(ctx, unit)[0]))
    return out
