"""The shard plan: deterministic, independent of collection order, a partition, balanced by expected cost."""

from __future__ import annotations

import random

import pytest

from conformance.run.shard import Shard, ShardSpecError, item_cost, longest_first, plan


def _items():
    items = [(f"suites/test_numerics.py::test_ir_case[op{i}]", item_cost("numerics", "ir_case")) for i in range(300)]
    items += [(f"suites/test_compile.py::test_ir_compile[op{i}]", item_cost("compile", "ir_compile")) for i in range(16)]
    items += [(f"suites/test_model.py::test_decoder[d{i}]", item_cost("model", "decoder")) for i in range(4)]
    return items


def test_plan_is_a_balanced_partition_that_ignores_collection_order():
    items = _items()
    shuffled = items[:]
    random.Random(0).shuffle(shuffled)
    a = dict(zip((n for n, _ in items), plan(items, 3)))
    b = dict(zip((n for n, _ in shuffled), plan(shuffled, 3)))
    assert a == b
    loads = [sum(c for (n, c) in items if a[n] == s) for s in range(3)]
    heaviest = max(c for _, c in items)
    assert max(loads) - min(loads) <= heaviest
    # heavy items are spread, not piled onto one shard by name order
    heavy = [sum(c for n, c in items if "numerics" not in n and a[n] == s) for s in range(3)]
    assert max(heavy) - min(heavy) <= heaviest
    assert sorted(set(a.values())) == [0, 1, 2]


def test_costs_rank_compile_and_model_above_numerics():
    assert item_cost("model", "decoder") > item_cost("compile", "ir_compile") > item_cost("numerics", "ir_case")
    assert item_cost("no", "such") == item_cost("dispatch", "defaults")


@pytest.mark.parametrize("text", ["", "3", "0/2", "3/2", "1/0", "a/b", "1/2/3"])
def test_malformed_shard_specs_are_refused(text):
    with pytest.raises(ShardSpecError):
        Shard.parse(text)


def test_shard_spec_round_trips():
    assert str(Shard.parse(" 2 / 4 ")) == "2/4" and Shard.parse("1/1") == Shard(1, 1)


def test_malformed_shard_option_stops_the_run_with_one_line(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "pytest", "--platform=cpu", "--conformance-shard=5/3",
                           "--collect-only", "-p", "no:cacheprovider"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 4
    assert "--conformance-shard '5/3': need 1 <= I <= N" in proc.stderr


class _Item:
    """Just what longest_first reads of a pytest item: its conformance marker."""

    def __init__(self, family: str, check: str):
        self.marker = pytest.mark.conformance(family, check).mark
        self.name = f"{family}.{check}"

    def get_closest_marker(self, name):
        return self.marker if name == "conformance" else None


def test_longest_first_puts_heavy_checks_first_and_the_model_last():
    names = ["numerics.ir_case", "model.decoder", "dispatch.supports_args", "aliasing.ir_case", "numerics.ir_case",
             "compile.ir_compile"]
    items = [_Item(*n.split(".")) for n in names]
    longest_first(items)
    assert [i.name for i in items] == ["dispatch.supports_args", "compile.ir_compile", "aliasing.ir_case",
                                       "numerics.ir_case", "numerics.ir_case", "model.decoder"]
