"""One tolerance table (reference_impl/ir/tolerances.py): every IR op, in-tree layer and the model check
names one of its entries, so a table declared anywhere else (a module-level dict, a literal passed
as `tolerances=`) fails here, and two entries with the same numbers are one entry."""

from __future__ import annotations

import itertools

import pytest
import torch

from conformance.checks import model as model_check
from conformance.collect.inventory import import_catalog
from reference_impl.ir import tolerances
from reference_impl.ir.op import IrOp
from reference_impl.layers.cases import LayerCase, conformance_of, declare_cases

import_catalog()   # every IR op and every in-tree layer module


def _entries() -> dict[str, dict]:
    return {name: value for name, value in vars(tolerances).items() if name.endswith("_TOLERANCES")}


def _subclasses(cls: type):
    for sub in type.__subclasses__(cls):
        yield sub
        yield from _subclasses(sub)


def _reference_ops() -> dict[str, IrOp]:
    return {name: op for name, op in IrOp.registry.items() if op.native_fn.__module__.startswith("reference_impl.")}


def _reference_layers() -> dict[str, object]:
    """Every in-tree layer class's own conformance record (registered or not, e.g. QKVParallelLinear)."""
    return {f"{cls.__module__}.{cls.__qualname__}": conformance_of(cls) for cls in _subclasses(torch.nn.Module)
            if cls.__module__.startswith("reference_impl.") and conformance_of(cls) is not None}


def _declared() -> dict[str, object]:
    """What each judged thing names as its tolerances, as it was given (not a copy)."""
    named = {f"IR op {name}": op.declared_tolerances for name, op in _reference_ops().items()}
    named.update({f"layer {name}": record.declared for name, record in _reference_layers().items()})
    named["check model.decoder"] = model_check.model_tolerances()
    return named


def strays(declared: dict[str, object]) -> list[str]:
    """The names in `declared` whose tolerances are not one of the table's entries (by identity)."""
    entries = _entries().values()
    return sorted(name for name, table in declared.items() if not any(table is entry for entry in entries))


def test_the_catalog_is_there():
    assert len(_reference_ops()) >= 19 and len(_reference_layers()) >= 51


def test_every_op_layer_and_check_names_an_entry_of_the_one_table():
    found = strays(_declared())
    assert not found, ("these declare tolerances outside reference_impl/ir/tolerances.py; name (or add) an "
                       "entry there instead:\n" + "\n".join(found))


def test_a_local_table_is_caught_even_with_the_same_numbers():
    local = dict(tolerances.ELEMENTWISE_TOLERANCES)

    class LocalTableLayer(torch.nn.Module):
        pass

    record = declare_cases(LocalTableLayer, tolerances=local, cases=[
        LayerCase("a", lambda dtype: {}, lambda dtype, device, gen: ())])
    assert record.declared is local
    assert strays({"layer LocalTableLayer": record.declared,
                   "layer Named": tolerances.ELEMENTWISE_TOLERANCES}) == ["layer LocalTableLayer"]


def test_what_is_judged_is_the_entry():
    """An op's effective tolerances are its entry laid over the defaults; a layer's are its entry."""
    for name, op in _reference_ops().items():
        assert op._tolerances == {**tolerances.DEFAULT_TOLERANCES, **op.declared_tolerances}, name
    for name, record in _reference_layers().items():
        assert record.tolerances == record.declared, name


def test_no_two_entries_hold_the_same_numbers():
    same = [(a, b) for (a, x), (b, y) in itertools.combinations(_entries().items(), 2) if x == y]
    assert not same, f"identical entries, make them one: {same}"


def test_every_entry_is_named_by_something():
    used = {id(table) for table in _declared().values()} | {id(tolerances.DEFAULT_TOLERANCES)}
    unused = [name for name, entry in _entries().items() if id(entry) not in used]
    assert not unused, f"entries nothing names: {unused}"


@pytest.mark.parametrize("name", sorted(_entries()))
def test_entries_are_well_formed(name):
    entry = _entries()[name]
    assert entry and all(isinstance(d, torch.dtype) and d.is_floating_point for d in entry), name
    assert all(isinstance(v, float) and v >= 0 for pair in entry.values() for v in pair), name
