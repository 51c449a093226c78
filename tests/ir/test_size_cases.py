"""The cases at the sizes where real kernels break (reference_impl.ir.size_cases): every IR op declares them, at the
levels and dtypes the issue asks for, and a case that needs more memory than is free is skipped with the reason."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conformance.checks import CheckContext, run_unit
from conformance.checks.common import clone_args
from conformance.collect.inventory import activate
from conformance.collect.units import Unit
from conformance.results.result import Outcome
from reference_impl import ir
from reference_impl.ir import size_cases
from reference_impl.ir.size_cases import (
    INT32_ELEMENTS,
    INT32_FLAG,
    JUDGE_BYTES_PER_ELEMENT,
    JUDGE_CHUNK_ELEMENTS,
    RUN_BYTES_PER_ELEMENT,
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
    # the 65,537-row case in the smallest dtype only (the standard run's cost), the others in every dtype
    assert {(_rows(c), c.dtypes) for c in rows} == {(4097, None), (65537, SMALLEST_DTYPES), (1048577, None)}
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
    elements = shape[0] * shape[1]
    # run in full (inputs, the provider's copy, its output), judged one chunk at a time
    assert opts["memory_bytes"] == 2 * (elements * RUN_BYTES_PER_ELEMENT + JUDGE_CHUNK_ELEMENTS * JUDGE_BYTES_PER_ELEMENT)
    assert opts["whole_memory_bytes"] == 2 * elements * JUDGE_BYTES_PER_ELEMENT
    assert opts["memory_bytes"] < 72 << 30 and opts["whole_memory_bytes"] > 500 << 30    # a 128 GiB host runs it
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


def _judge_memory(*argv: str) -> float:
    script = Path(__file__).with_name("_judge_memory.py")
    out = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert out.endswith("(FAIL)\n"), out
    return float(out.split()[0])


def test_the_memory_estimate_covers_a_measured_judgement():
    """JUDGE_BYTES_PER_ELEMENT against the peak tensor memory of judging a failing output (the full float64
    comparison) of 2^22 elements in a fresh process, in one piece and in row chunks of 2^18 elements: what the
    >2^31-element case is sized by. The peak is counted from the profiler's allocation events
    (tests/ir/_judge_memory.py), so it is the same on every run: 94 bytes an element for rms_norm at 2^16, 2^19 and
    2^22 elements alike in one piece; in chunks 6.1 bytes an element of the whole, 98 an element of a chunk."""
    elements, chunk = 1 << 22, 1 << 18
    whole = _judge_memory("rms_norm", str(elements // 8), "8")
    # the floor says the measurement saw the judgement at all: it holds at least one float64 copy of the output
    assert 8 <= whole < JUDGE_BYTES_PER_ELEMENT, whole
    chunked = _judge_memory("rms_norm", str(elements // 8), "8", str(chunk))
    assert 8 * chunk <= chunked * elements < JUDGE_BYTES_PER_ELEMENT * chunk, chunked
    assert chunked * 8 < whole


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


# ----- judging in row chunks (conformance.judge.oracle.judge_in_chunks) -----------------------------------------------
def _size_case_args(op, rows=4097):
    case = next(c for c in op.cases if c.name.split(",")[0] == f"tokens={rows}" and ROWS_FLAG in c.name)
    return case.make_args(torch.bfloat16, "cpu", torch.Generator().manual_seed(1))


def _as_whole(a, b):
    return (a.outcome, a.message, a.max_abs_err, a.max_rel_err, a.err_to_tol) == (
        b.outcome, b.message, b.max_abs_err, b.max_rel_err, b.err_to_tol)


@pytest.mark.parametrize("name", ir.ops.__all__)
def test_a_judgement_in_row_chunks_is_the_judgement_in_one_piece(name):
    """Counts, first bad row, runs, the worst element's index and the maxima are of the whole output, whichever
    chunk they are in (chunks of 500 rows; rows 3000..4096 zeroed, a run over three chunks)."""
    from conformance.judge.oracle import judge

    op = getattr(ir.ops, name)
    args = _size_case_args(op)
    good = op.native_fn(*clone_args(args))

    def zero_tail(t):
        t = t.clone()
        t[3000:] = 0
        return t

    bad = tuple(zero_tail(t) for t in good) if isinstance(good, tuple) else zero_tail(good)
    verdicts = []
    for out in (bad, good):
        whole = judge(op, args, out, torch.bfloat16)
        chunked = judge(op, args, out, torch.bfloat16, chunk_elements=500 * args[op.activation_indices[0]][0].numel())
        assert _as_whole(whole, chunked), (whole.message, chunked.message)
        verdicts.append(chunked)
    first = re.search(r"first bad row (\d+) \(", verdicts[0].message)        # sparse outputs are zero in places
    assert verdicts[0].outcome is Outcome.FAIL and first and 3000 <= int(first.group(1)) < 3100, verdicts[0].message
    assert verdicts[1].outcome is Outcome.PASS


def test_chunked_failures_of_every_kind_read_as_the_whole_outputs():
    from conformance.judge.oracle import judge

    op = ir.ops.rms_norm
    args = _size_case_args(op)
    good = op.native_fn(*clone_args(args))
    nan, scattered, small = good.clone(), good.clone(), good.clone()
    nan[[10, 3000], 1] = float("nan")
    scattered[[7, 100, 2500, 2501, 4096]] *= 1.5
    small[1234, 3] = small[1234, 3] * 1.02 + 0.01          # within what native's rounding could be: PASS
    for out, fragment in ((nan, "nan positions differ from native (2 elements in 2 of 4097 rows, first bad row 10 "
                                "(row 10, row 3000)); first at index (10, 1)"),
                          (scattered, "in 5 of 4097 rows, first bad row 7 (row 7, row 100, rows 2500..2501 and 1 more "
                                      "run of bad rows)"),
                          (small, "within atol")):
        whole = judge(op, args, out, torch.bfloat16)
        chunked = judge(op, args, out, torch.bfloat16, chunk_elements=8 * 333)
        assert _as_whole(whole, chunked) and fragment in chunked.message, (whole.message, chunked.message)


def test_an_ignored_argument_is_named_from_the_chunk_of_the_worst_element():
    from conformance.judge.oracle import judge

    op = ir.ops.rotary_embedding
    args = _size_case_args(op)
    flag = op.param_names.index("is_neox_style")
    flipped = args[:flag] + (not args[flag],) + args[flag + 1:]
    out = op.native_fn(*clone_args(flipped))                  # a kernel that ignores is_neox_style
    chunked = judge(op, args, out, torch.bfloat16, chunk_elements=8 * 700)
    assert chunked.outcome is Outcome.FAIL and "The output is native's for is_neox_style=" in chunked.message
    assert _as_whole(judge(op, args, out, torch.bfloat16), chunked)


def test_an_op_whose_result_is_not_row_by_row_is_judged_in_one_piece():
    from conformance.judge.oracle import judge_in_chunks, row_count

    op = ir.ops.dynamic_quant_fp8
    case = next(c for c in op.cases if INT32_FLAG in c.name and c.name.endswith("per_tensor"))
    assert case.memory_bytes == case.whole_memory_bytes          # its memory need is the whole judgement's
    args = (torch.randn(64, 8).to(torch.bfloat16), False, None)  # per-tensor: one scale for every row
    out = op.native_fn(*clone_args(args))
    assert row_count(op, args, out) is None and judge_in_chunks(op, args, out, torch.bfloat16, 64) is None
    per_token = next(c for c in op.cases if INT32_FLAG in c.name and c.name.endswith("per_token"))
    assert per_token.memory_bytes < per_token.whole_memory_bytes


def test_the_numerics_check_judges_a_case_with_a_memory_need_in_chunks(cpu_ctx, monkeypatch):
    import dataclasses

    from conformance.checks import lookup
    from conformance.judge import oracle

    ctx, _ = cpu_ctx
    case = next(c for c in ir.ops.rms_norm.cases if c.name.startswith("tokens=4097,") and ROWS_FLAG in c.name)
    flagged = dataclasses.replace(case, memory_bytes=1)
    monkeypatch.setattr(lookup, "ir_case", lambda op, name: flagged if name == case.name else None)
    calls = []
    real = oracle.judge_in_chunks
    monkeypatch.setattr(oracle, "judge_in_chunks", lambda *a, **k: calls.append(a[4]) or real(*a, **k))
    # the native provider: registered in every process (another test module may have unregistered cpp's kernels)
    verdict = run_unit(ctx, Unit("numerics", "ir_case", "rms_norm", "native", "bfloat16", case.name))[0]
    assert verdict.outcome is Outcome.PASS and calls == [size_cases.JUDGE_CHUNK_ELEMENTS]
    monkeypatch.setattr(lookup, "ir_case", lambda op, name: case)          # no memory need: in one piece
    calls.clear()
    assert run_unit(ctx, Unit("numerics", "ir_case", "rms_norm", "native", "bfloat16", case.name))[0].outcome is \
        Outcome.PASS and calls == []
