"""The cases at the sizes where real kernels break (reference_impl.ir.size_cases): every IR op declares them, at the
levels and dtypes the issue asks for, and a case that needs more memory than is free is skipped with the reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conformance.checks import CheckContext, run_unit
from conformance.collect.inventory import activate
from conformance.collect.units import Unit
from conformance.results.result import Outcome
from reference_impl import ir
from reference_impl.ir import size_cases
from reference_impl.ir.size_cases import (
    INT32_ELEMENTS,
    INT32_FLAG,
    JUDGE_BYTES_PER_ELEMENT,
    ROWS_FLAG,
    SMALLEST_DTYPES,
    memory_shortfall,
    size_rows,
)

ROWS = {4097: "standard", 65537: "standard", 1048577: "full"}


def _rows(case) -> int:
    return int(case.name.split(",")[0].removeprefix("tokens="))


@pytest.mark.parametrize("name", ir.ops.__all__)
def test_every_ir_op_declares_rows_just_past_each_limit_and_one_case_past_2_31_elements(name):
    op = getattr(ir.ops, name)
    rows = [c for c in op.cases if ROWS_FLAG in c.name.split(",")]
    big = [c for c in op.cases if INT32_FLAG in c.name.split(",")]
    assert rows and big, f"{name} declares no size cases"
    assert {(_rows(c), c.level) for c in rows} == set(ROWS.items())
    for case in rows + big:
        assert case.numerics_only, case.name
    for case in big:
        assert case.level == "full" and case.dtypes == SMALLEST_DTYPES and case.memory_bytes, case.name
    # the row-limit cases hold a small row each, so the standard run stays cheap
    for case in rows:
        if case.level == "standard":
            args = case.make_args(torch.float32, "cpu", torch.Generator().manual_seed(0))
            first = args[op.activation_indices[0]]
            assert first.shape[0] == _rows(case) and first.numel() <= _rows(case) * 16, (case.name, first.shape)


def test_the_large_row_is_past_2_31_elements_and_counts_its_memory():
    *rows, big = size_rows(8, "hidden=8", {"scale": 2.0}, tensors=2)
    name, shape, level, opts = big
    assert shape[0] * shape[1] > INT32_ELEMENTS and (shape[0] - 1) * shape[1] <= INT32_ELEMENTS
    assert name == f"tokens={shape[0]},hidden=8,{INT32_FLAG}" and level == "full"
    assert opts["memory_bytes"] == 2 * shape[0] * shape[1] * JUDGE_BYTES_PER_ELEMENT
    assert opts["scale"] == 2.0 and all(r[3]["scale"] == 2.0 and "memory_bytes" not in r[3] for r in rows)
    with pytest.raises(ValueError, match="width 0 must be positive"):
        size_rows(0, "hidden=0")


def test_memory_shortfall_names_what_is_missing_and_where():
    assert memory_shortfall(None, "cpu") is None and memory_shortfall(1, "cpu") is None
    short = memory_shortfall(1 << 60, "cpu")
    assert short.startswith("needs 1073741824.0 GiB free on host to run and judge, the host's MemAvailable "
                            "(/proc/meminfo) reports ")


def test_a_device_that_cannot_say_its_free_memory_is_a_reason(monkeypatch):
    monkeypatch.setattr(size_cases, "available_bytes",
                        lambda device: (1 << 50, "the host's MemAvailable") if str(device) == "cpu"
                        else (None, "torch.meta.mem_get_info"))
    assert memory_shortfall(1 << 30, "meta") == ("needs 1.0 GiB free on meta, and torch.meta.mem_get_info cannot say "
                                                 "how much is free")


def test_the_memory_estimate_covers_a_measured_judgement():
    """JUDGE_BYTES_PER_ELEMENT against the peak tensor memory of judging a failing output (the full float64
    comparison) of 2^22 elements in a fresh process: what the >2^31-element case is sized by. The peak is counted
    from the profiler's allocation events (tests/ir/_judge_memory.py), so it is the same on every run: 94 bytes an
    element for rms_norm at 2^16, 2^19 and 2^22 elements alike."""
    script = Path(__file__).with_name("_judge_memory.py")
    out = subprocess.run([sys.executable, str(script), "rms_norm", str(1 << 19), "8"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    per_element = float(out.split()[0])
    # the floor says the measurement saw the judgement at all: it holds at least one float64 copy of the output
    assert 8 <= per_element < JUDGE_BYTES_PER_ELEMENT, out
    assert out.endswith("(FAIL)\n"), out


@pytest.fixture(scope="module")
def cpu_ctx():
    inventory = activate("cpu")
    return CheckContext("cpu", inventory.platform, seed=1234, level="full"), inventory


def test_a_case_past_the_free_memory_is_a_skip_naming_it(cpu_ctx, monkeypatch):
    ctx, _ = cpu_ctx
    monkeypatch.setattr(size_cases, "_host_available", lambda: 3 << 30)
    big = next(c for c in ir.ops.rms_norm.cases if INT32_FLAG in c.name)
    for family in ("numerics", "aliasing"):
        verdict = run_unit(ctx, Unit(family, "ir_case", "rms_norm", "cpp", "bfloat16", big.name))[0]
        assert verdict.outcome is Outcome.SKIP
        assert verdict.message == (f"case {big.name} needs {big.memory_bytes / (1 << 30):.1f} GiB free on host to run "
                                   "and judge, the host's MemAvailable (/proc/meminfo) reports 3.0 GiB")


def test_the_size_cases_are_numerics_units_only(cpu_ctx):
    from conformance.checks.dispatch import case_inputs

    ctx, inventory = cpu_ctx
    numerics = {u.case for u in inventory.ir_case_units("numerics", "ir_case", "standard")}
    aliasing = {u.case for u in inventory.ir_case_units("aliasing", "ir_case", "standard")}
    assert any(ROWS_FLAG in c for c in numerics)
    assert not any(ROWS_FLAG in c for c in aliasing) and aliasing < numerics
    dispatched = {name for name, _, _ in case_inputs(ctx, ir.ops.rms_norm)}     # the dispatch checks' inputs
    assert dispatched and not any(ROWS_FLAG in c or INT32_FLAG in c for c in dispatched)
