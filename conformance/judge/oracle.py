"""The op oracle: an implementation's outputs judged against the op's native semantics.

It is one of three (docs/architecture.md, "The oracles"): attention is judged by the float64 paged-attention oracle
(`reference_impl.attention.oracle`) and the engine by the reference decoder in float64
(`conformance.checks.engine.oracle`), each with its own stated tolerances.

The harness's numerics checks (`conformance.checks.numerics`) and the project's own kernel tests
judge with the same function, so a kernel passes our tests exactly when a vendor's kernel with the
same outputs would pass conformance. Native runs on copies of the arguments; a float64 run of
native, where the op has one, grades quality (`compare_outputs` in `conformance.judge.comparison`).
A failure that native reproduces with another value of one argument (is_neox_style flipped,
approximate='tanh' for 'none') says so: the kernel ignores that argument, which no tolerance fixes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from conformance.judge.comparison import (
    Comparison,
    as_outputs,
    compare_outputs,
    identical,
    merge_golden_errors,
    merged,
    output_golden_errors,
)
from conformance.collect.units import dtype_name
from conformance.judge.golden import clone_args, to_golden
from conformance.results.result import Outcome


def judge(op, args: tuple, out: Any, dtype: torch.dtype, *, compare_nan: bool = True,
          chunk_elements: int | None = None) -> Comparison:
    """`out` (what an implementation returned for `args`) against `op`'s native result, within its tolerance.

    `chunk_elements` (a case past 2^31 elements, reference_impl.ir.size_cases): judged in row chunks of about that
    many elements (`judge_in_chunks`) where the op is row-parallel here; otherwise, and by default, in one piece."""
    if chunk_elements is not None:
        chunked = judge_in_chunks(op, args, out, dtype, chunk_elements, compare_nan=compare_nan)
        if chunked is not None:
            return chunked
    ref = op.native_fn(*clone_args(args))
    golden = None
    if not _identical(out, ref):    # equal to native: nothing the float64 run could grade
        try:
            golden = op.native_fn(*to_golden(args, dtype))
        except Exception:  # noqa: BLE001 - an op without a float64 path is graded against native only
            golden = None
    atol, rtol = op.get_tolerance(dtype)
    hint = f"ir.ops.{op.name}.override_tolerance(torch.{dtype_name(dtype)}, atol={{atol:.2g}}, rtol={{rtol:g}})"
    cmp = compare_outputs(out, ref, golden, atol=atol, rtol=rtol, compare_nan=compare_nan, dtype=dtype,
                          tolerance_hint=hint)
    if cmp.outcome is Outcome.FAIL and cmp.advice is not None:
        ignored = ignored_argument(op, args, out, dtype, compare_nan)
        if ignored is not None:
            cmp = cmp.with_advice(ignored)
    return cmp


def _identical(out: Any, ref: Any) -> bool:
    """Whether every output is native's bit for bit (`compare_outputs` then needs no float64 result)."""
    outs, refs = as_outputs(out), as_outputs(ref)
    return (isinstance(out, (tuple, list)) == isinstance(ref, (tuple, list)) and len(outs) == len(refs)
            and all(isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor) and o.device == r.device
                    and identical(o, r) for o, r in zip(outs, refs)))


# Arguments whose other values native can compute, beyond the booleans (is_neox_style, per_token, ...).
ARGUMENT_VALUES = {"approximate": ("none", "tanh")}


def other_values(op, args: tuple) -> Iterator[tuple[str, Any, Any, tuple]]:
    """(name, value, other value, args with the other value) for each boolean or enumerated argument."""
    for i, (name, value) in enumerate(zip(op.param_names, args)):
        if isinstance(value, bool):
            others = (not value,)
        elif isinstance(value, str) and value in ARGUMENT_VALUES.get(name, ()):
            others = tuple(v for v in ARGUMENT_VALUES[name] if v != value)
        else:
            continue
        for other in others:
            yield name, value, other, args[:i] + (other,) + args[i + 1:]


def ignored_argument(op, args: tuple, out: Any, dtype: torch.dtype, compare_nan: bool) -> str | None:
    """Advice naming the argument the implementation ignored, when native with another value of it matches
    `out` within tolerance; None otherwise."""
    atol, rtol = op.get_tolerance(dtype)
    for name, value, other, other_args in other_values(op, args):
        try:
            ref = op.native_fn(*clone_args(other_args))
        except Exception:  # noqa: BLE001 - native does not take that value here: nothing to learn
            continue
        if compare_outputs(out, ref, None, atol=atol, rtol=rtol, compare_nan=compare_nan, dtype=dtype,
                           tolerance_hint="").outcome is Outcome.PASS:
            return (f"The output is native's for {name}={other!r}, not for the {name}={value!r} asked: the "
                    f"implementation ignores or mishandles `{name}`, which no tolerance fixes; fix the kernel, or "
                    f"decline {name}={value!r} in `supports_args` so that those calls run elsewhere")
    return None


def assert_matches_native(op, args: tuple, out: Any, dtype: torch.dtype, context: str = "", *,
                          compare_nan: bool = True) -> Comparison:
    """`judge`, raising AssertionError with the harness's own message unless it would PASS (or QUALITY_WARNING)."""
    cmp = judge(op, args, out, dtype, compare_nan=compare_nan)
    if cmp.outcome not in (Outcome.PASS, Outcome.QUALITY_WARNING):
        raise AssertionError(f"{context}: {cmp.message}" if context else cmp.message)
    return cmp


# ----- judging in row chunks --------------------------------------------------------------------------------------
def row_count(op, args: tuple, out: Any) -> int | None:
    """The rows a row-parallel judgement slices: the first dim of the op's first activation, when every output is a
    tensor with that first dim (an output of another shape, a per-tensor scale, is not row by row); else None."""
    if not op.activation_indices:
        return None
    first = args[op.activation_indices[0]]
    if not isinstance(first, torch.Tensor) or first.dim() < 2:
        return None
    rows = first.shape[0]
    outs = as_outputs(out)
    if not all(isinstance(o, torch.Tensor) and o.dim() >= 2 and o.shape[0] == rows for o in outs):
        return None
    return rows


def row_slice(value: Any, rows: int, lo: int, hi: int, *, copy: bool) -> Any:
    """Rows lo..hi-1 of every tensor whose first dim is `rows` (a copy of only those rows where `copy`: the
    oracle's copies of a view would copy its whole storage); other values kept."""
    if isinstance(value, (tuple, list)):
        return type(value)(row_slice(v, rows, lo, hi, copy=copy) for v in value)
    if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == rows:
        part = value[lo:hi]
        return part.clone() if copy else part
    return value


def judge_in_chunks(op, args: tuple, out: Any, dtype: torch.dtype, chunk_elements: int, *,
                    compare_nan: bool = True) -> Comparison | None:
    """`judge` of a row-parallel op, chunk by chunk: native and its float64 run on row slices of the arguments (the
    tensors whose first dim is the row count; the others kept), each chunk of the output compared with them, so the
    judgement holds one chunk's float64 copies, not the whole output's (94 bytes an element). Two passes: the first
    measures every chunk's errors against float64, the second compares each chunk graded by the whole output's errors
    (as `judge` grades the whole), and the chunks' results merge into the whole output's: counts, bad rows ("first bad
    row", the runs) and indices are of the whole tensor. None where the op's outputs are not row by row (then judge in
    one piece)."""
    rows = row_count(op, args, out)
    if rows is None:
        return None
    first = args[op.activation_indices[0]]
    step = max(1, chunk_elements // max(1, first[0].numel()))
    bounds = [(lo, min(lo + step, rows)) for lo in range(0, rows, step)]
    atol, rtol = op.get_tolerance(dtype)
    hint = f"ir.ops.{op.name}.override_tolerance(torch.{dtype_name(dtype)}, atol={{atol:.2g}}, rtol={{rtol:g}})"

    def chunk(lo, hi, with_golden):
        chunk_args = row_slice(args, rows, lo, hi, copy=True)
        ref = op.native_fn(*clone_args(chunk_args))
        golden = None
        if with_golden:
            try:
                golden = op.native_fn(*to_golden(chunk_args, dtype))
            except Exception:  # noqa: BLE001 - an op without a float64 path is graded against native only
                golden = None
        return chunk_args, row_slice(out, rows, lo, hi, copy=False), ref, golden

    # pass 1: is the whole output native's bit for bit, and its errors against float64
    errors, same = [], True
    for lo, hi in bounds:
        _, got, ref, golden = chunk(lo, hi, with_golden=True)
        same = same and _identical(got, ref)
        errors.append(output_golden_errors(got, ref, golden, atol) if golden is not None else None)
    if same:
        return Comparison(Outcome.PASS, f"within atol={atol:g} rtol={rtol:g}", 0.0, 0.0, err_to_tol=0.0)
    whole = None if any(e is None for e in errors) else merge_golden_errors(errors)
    # pass 2: every chunk graded by the whole output's errors
    results = []
    for lo, hi in bounds:
        chunk_args, got, ref, golden = chunk(lo, hi, with_golden=whole is not None)
        cmp = compare_outputs(got, ref, golden, atol=atol, rtol=rtol, compare_nan=compare_nan, dtype=dtype,
                              tolerance_hint=hint, golden_errs=whole)
        results.append((lo, hi, chunk_args, got, cmp))
        if cmp.outcome is Outcome.FAIL and cmp.failure is None:
            return cmp                      # structure, dtype: the same for every chunk
    return _merge_chunks(op, results, out, dtype, atol, rtol, compare_nan, whole)


def _merge_chunks(op, results, out, dtype, atol, rtol, compare_nan, whole_errs) -> Comparison:
    """The whole output's Comparison from its chunks' (lo, hi, chunk args, chunk output, comparison), graded by the
    whole output's errors against float64 `whole_errs`."""
    from conformance.judge.comparison import _cleared_note

    worst = dict(max_abs_err=max(c.max_abs_err or 0.0 for *_, c in results),
                 max_rel_err=max(c.max_rel_err or 0.0 for *_, c in results),
                 err_to_tol=max(c.err_to_tol or 0.0 for *_, c in results))
    failed = [(lo, c) for lo, _, _, _, c in results if c.outcome is Outcome.FAIL]
    if failed:
        outs = as_outputs(out)
        parts = []
        for lo, c in failed:
            o = outs[c.failure.output]
            parts.append((c.failure.shifted(lo, o[0].numel() // o.shape[-1]), c.err_to_tol or 0.0))
        whole = merged(parts)
        o = outs[whole.output]                  # counts of the whole output, not of the chunks that failed
        whole = dataclasses.replace(whole, numel=o.numel(), rows=None if whole.rows is None else dataclasses.replace(
            whole.rows, n_rows=o.numel() // o.shape[-1]))
        if whole.kind == "tolerance":
            cmp = Comparison(Outcome.FAIL, whole.format(), worst["max_abs_err"], worst["max_rel_err"],
                             advice=whole.advice or None, err_to_tol=worst["err_to_tol"], failure=whole)
        else:                                   # a special value missed: no error maxima, as in one piece
            cmp = Comparison(Outcome.FAIL, whole.format(), failure=whole)
        lead = next(r for r in results if r[0] <= whole.index[0] < r[1])      # the chunk of the worst element
        if cmp.advice is not None:
            ignored = ignored_argument(op, lead[2], lead[3], dtype, compare_nan)
            if ignored is not None:
                cmp = cmp.with_advice(ignored)
        return cmp
    quality = [c for *_, c in results if c.outcome is Outcome.QUALITY_WARNING]
    if quality:
        return Comparison(Outcome.QUALITY_WARNING, quality[0].message, **worst)
    counts: dict[str, list[int]] = {}
    for *_, c in results:
        for label, n_out, numel in c.cleared:
            counts.setdefault(label, [0, 0])
            counts[label][0] += n_out
            counts[label][1] += numel
    if counts:
        labels = [f"output {k}" if len(as_outputs(out)) > 1 else "output" for k in range(len(as_outputs(out)))]
        notes = [_cleared_note(label, n, numel, whole_errs[labels.index(label)]) for label, (n, numel) in
                 counts.items()]
        return Comparison(Outcome.PASS, "; ".join(notes), **worst, cleared=tuple((k, *v) for k, v in counts.items()))
    return Comparison(Outcome.PASS, f"within atol={atol:g} rtol={rtol:g}", **worst)
