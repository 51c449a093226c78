"""Outputs against native within tolerance, graded against a float64 run of native (the true value).

One template for every FAIL message, naming the element behind the ratio it reports and the rows the failing
elements are in (how many, the first, the runs of them: a kernel that stops at a row limit reads "rows
4096..65536 are all zero"); an override of the tolerance is offered only where the failure looks like
rounding. Where a float64 result exists, an implementation at least as close to it as native never FAILs:
the difference from native is then native's own rounding (see AS_CLOSE_FACTOR).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from conformance.results.result import Outcome
from conformance.collect.units import dtype_name
from conformance.judge.tolerances import element_ratios, error_to_tolerance, ratio_text

# A tolerance override is offered only when the worst error is at most this many times the allowed
# error (atol + rtol*|native|). A correct kernel differs from native by rounding alone (another
# reduction order, fused multiply-adds, another rsqrt or exp approximation): a few ulps of the output
# dtype, the scale the declared tolerances are set at, so a correct kernel that still misses lands
# within a few times the tolerance; 4x leaves room for two more bits of rounding error. Far beyond
# that the error is structural (a dropped epsilon, a wrong formula, a misread stride), and advice to
# loosen the tolerance would hide a bug (a missing-epsilon rms_norm is 300,000x out in float32).
# Where a float64 result grades both, an implementation clearly further from it than native is not
# rounding either (the same test as QUALITY_WARNING).
OVERRIDE_FACTOR = 4.0

# QUALITY_WARNING: error against float64 more than this many times native's, and above the floor.
QUALITY_FACTOR = 4.0
QUALITY_FLOOR_OF_ATOL = 0.25

# "At least as close to float64 as native": the implementation's max error against the float64 run is
# at most AS_CLOSE_FACTOR times native's plus one ulp of the output dtype at the output's magnitude,
# both in absolute terms and relative to |float64| (there the ulp is the dtype's epsilon). Why these: a
# result rounded once to the output dtype is within half an ulp of the true value, and native's own
# error is at least that wherever it rounds at all; one ulp is the largest error of a faithfully
# rounded result, so a kernel that rounds its last step the other way than native still qualifies
# even where native happens to be exact. The factor 1.25 (a quarter more than native's error, two bits
# below the 4x of QUALITY_FACTOR) covers a different but equally valid order of intermediate roundings;
# anything beyond it is less precise than the reference and is judged against native as usual. The
# relative test keeps a wrong small element from hiding behind native's error at large ones.
AS_CLOSE_FACTOR = 1.25

BUG = "which points to a bug in the implementation rather than a tolerance to loosen"
DECLINE = "fix the kernel, or decline these arguments in `supports_args` so that they run elsewhere"


@dataclasses.dataclass
class Comparison:
    """The outcome of one comparison; for a numeric FAIL, `advice` is the message's last sentence."""

    outcome: Outcome
    message: str
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    advice: str | None = None
    err_to_tol: float | None = None   # the worst element's error / its tolerance (conformance.judge.tolerances)
    # What a FAIL's message is made of, and for a PASS that cleared elements outside the tolerance (as close to float64
    # as native) how many of how many per output label: what merging the comparisons of row chunks needs
    # (conformance.judge.oracle.judge_in_chunks).
    failure: FailureParts | None = None
    cleared: tuple[tuple[str, int, int], ...] = ()

    def with_advice(self, advice: str) -> Comparison:
        """The same result with its advice replaced (the oracle's diagnosis of an ignored argument)."""
        if self.advice is None or not self.message.endswith(self.advice):
            return self
        body = self.message[: len(self.message) - len(self.advice)]
        return dataclasses.replace(self, message=body + advice, advice=advice)


def _as_f64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.dtype.is_floating_point and t.element_size() == 1:
        t = t.to(torch.float32)
    if t.is_complex():
        return torch.view_as_real(t).to(torch.float64)
    return t.to(torch.float64)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def ulp(dtype: torch.dtype, magnitude: float) -> float:
    """The gap between adjacent values of `dtype` at `magnitude` (subnormal spacing below the normals);
    0 for dtypes that are not floating point."""
    if not dtype.is_floating_point:
        return 0.0
    info = torch.finfo(dtype)
    m = max(abs(magnitude), info.smallest_normal) if math.isfinite(magnitude) else info.max
    return 2.0 ** math.floor(math.log2(m)) * info.eps


@dataclasses.dataclass(frozen=True)
class GoldenErrors:
    """Max errors of the implementation and of native against float64, absolute and relative."""

    impl_abs: float
    native_abs: float
    impl_rel: float
    native_rel: float
    ulp_abs: float      # one ulp of the output dtype at the output's largest |float64| value
    ulp_rel: float      # the output dtype's epsilon

    @property
    def as_close_as_native(self) -> bool:
        return (self.impl_abs <= AS_CLOSE_FACTOR * self.native_abs + self.ulp_abs
                and self.impl_rel <= AS_CLOSE_FACTOR * self.native_rel + self.ulp_rel)


def golden_errors(a: torch.Tensor, b: torch.Tensor, gold: torch.Tensor, mask: torch.Tensor, atol: float,
                  out_dtype: torch.dtype) -> GoldenErrors:
    """`a` (implementation) and `b` (native) against `gold` over `mask`; relative errors where |gold| > atol."""
    m = mask & torch.isfinite(gold) & torch.isfinite(b)
    if not bool(m.any()):
        return GoldenErrors(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    # Elements outside `m` are zeroed rather than indexed out (errors are >= 0, so the maxima are the same): a
    # boolean index copies, which made this the costliest step of judging a million-element output.
    zero = torch.zeros((), dtype=gold.dtype, device=gold.device)
    g_abs = torch.where(m, gold.abs(), zero)
    ea = torch.where(m, (a - gold).abs(), zero)
    ea = torch.where(torch.isnan(ea), math.inf, ea)
    eb = torch.where(m, (b - gold).abs(), zero)
    big = g_abs > max(atol, 1e-300)
    ra = float(torch.where(big, ea / g_abs, zero).max())
    rb = float(torch.where(big, eb / g_abs, zero).max())
    eps = torch.finfo(out_dtype).eps if out_dtype.is_floating_point else 0.0
    return GoldenErrors(float(ea.max()), float(eb.max()), ra, rb, ulp(out_dtype, float(g_abs.max())), eps)


def output_golden_errors(out: Any, ref: Any, golden: Any, atol: float) -> tuple[GoldenErrors | None, ...]:
    """Per output, the implementation's and native's errors against float64 as `compare_outputs` measures them (None
    where there is no float64 result of that output's shape), whether or not the output equals native's."""
    outs, refs = as_outputs(out), as_outputs(ref)
    goldens = as_outputs(golden) if golden is not None else (None,) * len(refs)
    errs = []
    for o, r, g in zip(outs, refs, goldens):
        if not (isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor) and isinstance(g, torch.Tensor)
                and tuple(g.shape) == tuple(r.shape) == tuple(o.shape)) or o.numel() == 0:
            errs.append(None)
            continue
        a, b, gold = _as_f64(o).cpu(), _as_f64(r).cpu(), _as_f64(g).cpu()
        b, _ = _specials_by_mathematics("", b, gold, o.dtype)
        errs.append(golden_errors(a, b, gold, ~torch.isnan(b) & ~torch.isinf(b), atol, o.dtype))
    return tuple(errs)


def merge_golden_errors(parts: list[tuple[GoldenErrors | None, ...]]) -> tuple[GoldenErrors | None, ...]:
    """The errors of a whole output from its row chunks' (`output_golden_errors` of each): every field the largest
    (the ulp is at the largest magnitude)."""
    merged = []
    for per_output in zip(*parts):
        present = [e for e in per_output if e is not None]
        merged.append(None if not present else GoldenErrors(*(max(getattr(e, f.name) for e in present)
                                                              for f in dataclasses.fields(GoldenErrors))))
    return tuple(merged)


def compare_outputs(out: Any, ref: Any, golden: Any | None, *, atol: float, rtol: float,
                    compare_nan: bool, dtype: torch.dtype, tolerance_hint: str,
                    golden_errs: tuple[GoldenErrors | None, ...] | None = None) -> Comparison:
    """Structure, dtype and shape exactly; values within atol + rtol*|native|, or at least as close to the
    float64 result as native; golden grading of the rest.

    `tolerance_hint` is a format string taking atol and rtol, naming the override that would accept
    (offered only when plausible, see OVERRIDE_FACTOR); a hint without `{atol}` is a requirement.
    `golden_errs` (one per output) replaces the errors against float64 measured here: a judgement in row chunks
    grades each chunk by the whole output's (`output_golden_errors` of every chunk, `merge_golden_errors`).
    """
    outs, refs = as_outputs(out), as_outputs(ref)
    goldens = as_outputs(golden) if golden is not None else (None,) * len(refs)
    if isinstance(out, (tuple, list)) != isinstance(ref, (tuple, list)) or len(outs) != len(refs):
        return Comparison(Outcome.FAIL, f"returned {_structure(out)}, native returns {_structure(ref)}")
    worst_abs = worst_rel = worst_ratio = 0.0
    quality_notes, cleared_notes, cleared = [], [], []
    for k, (o, r, g) in enumerate(zip(outs, refs, goldens)):
        label = f"output {k}" if len(outs) > 1 else "output"
        if o is None and r is None:
            continue  # e.g. a rotary layer's key output when called with key=None
        problem = _structure_problem(label, o, r)
        if problem:
            return Comparison(Outcome.FAIL, problem)
        if o.numel() == 0 or identical(o, r):
            continue     # equal to native bit for bit: no error, and no further from float64 than native
        a, b = _as_f64(o).cpu(), _as_f64(r).cpu()
        gold = _as_f64(g).cpu() if isinstance(g, torch.Tensor) and tuple(g.shape) == tuple(r.shape) else None
        b, native_note = _specials_by_mathematics(label, b, gold, o.dtype)
        if native_note:
            cleared_notes.append(native_note)
        parts = _special_value_problem(label, a, b, compare_nan)
        if parts:
            parts = dataclasses.replace(parts, output=k, note=native_note)
            return Comparison(Outcome.FAIL, parts.format(), failure=parts)
        finite = ~torch.isnan(b) & ~torch.isinf(b)
        diff = torch.where(finite, (a - b).abs(), torch.zeros_like(a))
        diff = torch.where(finite & torch.isnan(a), torch.full_like(a, math.inf), diff)
        allowed = atol + rtol * b.abs()
        max_abs = float(diff.max())
        rel = torch.where(finite & (b.abs() > atol), diff / b.abs().clamp_min(1e-300), torch.zeros_like(a))
        max_rel = float(rel.max())
        worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, max_rel)
        worst_ratio = max(worst_ratio, error_to_tolerance(diff, b, atol, rtol, finite))
        outside = finite & (diff > allowed)
        if golden_errs is not None:
            errs = golden_errs[k]
        else:
            errs = golden_errors(a, b, gold, finite, atol, o.dtype) if gold is not None else None
        if bool(outside.any()):
            if errs is not None and errs.as_close_as_native:
                cleared_notes.append(_cleared_note(label, int(outside.sum()), a.numel(), errs))
                cleared.append((label, int(outside.sum()), a.numel()))
                continue
            return _failure(k, label, a, b, gold, diff, allowed, outside, max_abs, max_rel, errs, atol=atol,
                            rtol=rtol, dtype=dtype, tolerance_hint=tolerance_hint)
        if errs is not None:
            floor = QUALITY_FLOOR_OF_ATOL * atol
            if errs.impl_abs > QUALITY_FACTOR * errs.native_abs and errs.impl_abs > floor:
                quality_notes.append(
                    f"{label}: within tolerance of native, but max error against the float64 golden run is "
                    f"{_fmt(errs.impl_abs)}, native's is {_fmt(errs.native_abs)} (clearly worse: > "
                    f"{QUALITY_FACTOR:g}x native's and > {QUALITY_FLOOR_OF_ATOL:g}*atol = {_fmt(floor)})")
    if quality_notes:
        return Comparison(Outcome.QUALITY_WARNING, "; ".join(quality_notes), worst_abs, worst_rel,
                          err_to_tol=worst_ratio)
    if cleared_notes:
        return Comparison(Outcome.PASS, "; ".join(cleared_notes), worst_abs, worst_rel, err_to_tol=worst_ratio,
                          cleared=tuple(cleared))
    return Comparison(Outcome.PASS, f"within atol={atol:g} rtol={rtol:g}", worst_abs, worst_rel,
                      err_to_tol=worst_ratio)


def identical(o: torch.Tensor, r: torch.Tensor) -> bool:
    """Whether `o` holds exactly native's `r` (same dtype and shape, equal values, no nan): judged without the
    float64 comparison, which would find no error and nothing to grade (a million-element output costs ~60
    passes over float64 copies otherwise)."""
    return o.dtype == r.dtype and o.shape == r.shape and bool(torch.equal(o, r))


def _structure_problem(label: str, o: Any, r: Any) -> str | None:
    if not isinstance(o, torch.Tensor) or not isinstance(r, torch.Tensor):
        if not isinstance(r, torch.Tensor):
            return f"{label} is {type(o).__name__}, native returns {type(r).__name__}"
        return f"{label} is {type(o).__name__}, native returns a Tensor"
    if o.dtype != r.dtype:
        return (f"{label} dtype is {dtype_name(o.dtype)}, native gives {dtype_name(r.dtype)}: the output dtype "
                "must equal native's exactly")
    if tuple(o.shape) != tuple(r.shape):
        return f"{label} shape is {tuple(o.shape)}, native gives {tuple(r.shape)}"
    if o.device.type != r.device.type:
        return f"{label} is on {o.device}, native's on {r.device}"
    return None


# output dtypes with infinities, whose float64 values round to the dtype's own special values
_IEEE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _specials_by_mathematics(label: str, b: torch.Tensor, gold: torch.Tensor | None,
                             out_dtype: torch.dtype) -> tuple[torch.Tensor, str | None]:
    """Native's result with its special values (NaN, infinities) replaced by the float64 run's (rounded to the
    output dtype) where the two disagree: torch's own results differ by ISA there (fp32 gelu(+inf) is NaN on
    AVX-512 builds of its vector path, +inf elsewhere), so the mathematics decides, and the note says so."""
    if gold is None or out_dtype not in _IEEE_DTYPES:
        return b, None
    exact = gold.to(out_dtype).double()          # float64 values past the dtype's range round to its infinities
    special = torch.isnan(b) | torch.isinf(b) | torch.isnan(exact) | torch.isinf(exact)
    differ = special & ~((b == exact) | (torch.isnan(b) & torch.isnan(exact)))
    if not bool(differ.any()):
        return b, None
    idx = _unravel(int(differ.flatten().nonzero()[0]), b.shape)
    note = (f"{label}: native differs from its float64 run in {int(differ.sum())} special values (first at index "
            f"{idx}: native {_fmt(float(b[idx]))}, float64 {_fmt(float(exact[idx]))}): judged there against the "
            "float64 value, since native's special values depend on the machine")
    return torch.where(differ, exact, b), note


def _special_value_problem(label: str, a: torch.Tensor, b: torch.Tensor, compare_nan: bool) -> FailureParts | None:
    """NaN positions (when compared) and infinities must be native's exactly."""
    if compare_nan:
        nan_mismatch = torch.isnan(a) != torch.isnan(b)
        if bool(nan_mismatch.any()):
            idx = _unravel(int(nan_mismatch.flatten().nonzero()[0]), a.shape)
            return FailureParts("nan", label, int(nan_mismatch.sum()), a.numel(), row_detail(nan_mismatch, a, b),
                                idx, f"got {_fmt(float(a[idx]))}, native {_fmt(float(b[idx]))}")
    inf_mismatch = ~torch.isnan(b) & torch.isinf(b) & (a != b)
    if bool(inf_mismatch.any()):
        idx = _unravel(int(inf_mismatch.flatten().nonzero()[0]), a.shape)
        return FailureParts("inf", label, int(inf_mismatch.sum()), a.numel(), None, idx,
                            f"native gives {_fmt(float(b[idx]))} at index {{index}}, got {_fmt(float(a[idx]))}")
    return None


def _cleared_note(label: str, n_out: int, numel: int, errs: GoldenErrors) -> str:
    return (f"{label}: {n_out} of {numel} elements differ from native by more than the tolerance, but the "
            f"implementation is at least as close to the float64 result as native (max err {_fmt(errs.impl_abs)}, "
            f"native's {_fmt(errs.native_abs)}; max rel err {_fmt(errs.impl_rel)}, native's "
            f"{_fmt(errs.native_rel)}; allowed: {AS_CLOSE_FACTOR:g}x native's plus one ulp): native itself is the "
            "less precise one")


def _failure(k, label, a, b, gold, diff, allowed, outside, max_abs, max_rel, errs, *, atol, rtol, dtype,
             tolerance_hint) -> Comparison:
    """The one FAIL template: count, the element with the largest error-to-tolerance ratio (its index, values
    and ratio), the maxima, the float64 grade, and the advice."""
    ratios = torch.where(outside, element_ratios(diff, b, atol, rtol), torch.zeros_like(diff))
    flat = int(ratios.flatten().argmax())
    idx = _unravel(flat, a.shape)
    ratio = float(ratios.flatten()[flat])
    finite = ~torch.isnan(b) & ~torch.isinf(b)
    need_atol = float((diff - rtol * b.abs())[finite].max())
    need_atol = float(f"{need_atol * 1.1:.2g}") if math.isfinite(need_atol) else math.inf
    at_gold = f", float64 {_fmt(float(gold[idx]))}" if gold is not None else ""
    graded = (f"; against float64: implementation max err {_fmt(errs.impl_abs)}, native's {_fmt(errs.native_abs)}"
              if errs is not None else "")
    advice = _advice(ratio, errs, atol, tolerance_hint, need_atol, rtol)
    err = (f"abs err {_fmt(float(diff[idx]))} = {ratio_text(ratio)}x the tolerance atol + rtol*|native| = "
           f"{_fmt(float(allowed[idx]))} there" if math.isfinite(ratio)
           else "a non-finite value where native's is finite")
    parts = FailureParts("tolerance", label, int(outside.sum()), a.numel(), row_detail(outside, a, b), idx,
                         f"got {_fmt(float(a[idx]))}, native {_fmt(float(b[idx]))}{at_gold}, {err}", output=k,
                         criterion=f"outside atol={atol:g} rtol={rtol:g} ({dtype_name(dtype)})", max_abs=max_abs,
                         max_rel=max_rel, graded=graded, advice=advice)
    return Comparison(Outcome.FAIL, parts.format(), max_abs, max_rel, advice=advice, err_to_tol=ratio, failure=parts)


@dataclasses.dataclass(frozen=True)
class FailureParts:
    """What a FAIL message says, kept apart so that the comparisons of an output's row chunks merge into the message
    of the whole output (`merged`): `kind` is "tolerance" (elements outside atol + rtol*|native|), "nan" (NaN
    positions differ) or "inf" (an infinity of native's missed)."""

    kind: str
    label: str
    elements: int                       # bad elements
    numel: int
    rows: RowDetail | None
    index: tuple[int, ...]              # the worst (tolerance) or first (nan, inf) bad element
    at_index: str                       # what is there ("got 0, native 0.5, ...")
    output: int = 0                     # which output of the op
    note: str | None = None             # native's special values judged by float64 (nan, inf)
    criterion: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0
    graded: str = ""
    advice: str = ""

    def format(self) -> str:
        rows = describe_rows(self.rows) if self.rows is not None else ""
        if self.kind == "nan":
            text = (f"{self.label}: nan positions differ from native ({self.elements} elements{rows}); first at index "
                    f"{self.index}: {self.at_index}")
        elif self.kind == "inf":
            text = f"{self.label}: {self.at_index.format(index=self.index)}"
        else:
            return (f"{self.label}: {self.elements} of {self.numel} elements {self.criterion}{rows}; worst at index "
                    f"{self.index}: {self.at_index}; max abs err {_fmt(self.max_abs)}, max rel err "
                    f"{_fmt(self.max_rel)}{self.graded}. " + self.advice)
        return f"{text} ({self.note})" if self.note else text

    def shifted(self, rows: int, row_elements: int) -> FailureParts:
        """The same failure in a tensor whose first `rows` leading-dim rows come before this one's: indices and bad
        rows rebased (`row_elements`: how many flattened rows one index of the first dim is)."""
        return dataclasses.replace(self, index=(self.index[0] + rows, *self.index[1:]),
                                   rows=None if self.rows is None else self.rows.shifted(rows * row_elements))


def merged(parts: list[tuple[FailureParts, float]]) -> FailureParts:
    """One failure of the whole output from its chunks' failures (already shifted, in row order, each with its
    error-to-tolerance ratio): the kind the whole output's comparison reports first (nan, then inf, then tolerance,
    of the first output that has one), the counts and bad rows summed, the worst element the one of the largest
    ratio (nan, inf: the first), the maxima the largest."""
    for kind in ("nan", "inf", "tolerance"):
        same = [(p, r) for p, r in parts if p.kind == kind]
        if same:
            break
    first_output = min(p.output for p, _ in same)
    same = [(p, r) for p, r in same if p.output == first_output]
    lead = max(same, key=lambda pr: pr[1])[0] if kind == "tolerance" else same[0][0]
    rows = [p.rows for p, _ in same if p.rows is not None]
    return dataclasses.replace(
        lead, elements=sum(p.elements for p, _ in same), rows=RowDetail.joined(rows) if rows else None,
        max_abs=max(p.max_abs for p, _ in same), max_rel=max(p.max_rel for p, _ in same))


def _advice(ratio: float, errs: GoldenErrors | None, atol: float, tolerance_hint: str, need_atol: float,
            rtol: float) -> str:
    """The override `tolerance_hint` names, only when the failure looks like rounding: the worst error within
    OVERRIDE_FACTOR of the tolerance and, where graded, the implementation not clearly further from
    float64 than native (QUALITY_FACTOR, above atol). Otherwise say why it points to a bug."""
    if not math.isfinite(ratio):
        return f"A non-finite result is far beyond rounding differences, {BUG}: {DECLINE}"
    if ratio > OVERRIDE_FACTOR:
        return (f"The worst error is {ratio_text(ratio)}x the tolerance: far beyond rounding differences (an "
                f"override is offered up to {OVERRIDE_FACTOR:g}x), {BUG}: {DECLINE}")
    if errs is not None and errs.impl_abs > QUALITY_FACTOR * errs.native_abs and errs.impl_abs > atol:
        return (f"Against float64 the implementation is off by {_fmt(errs.impl_abs)}, native by "
                f"{_fmt(errs.native_abs)}: not a rounding difference (> {QUALITY_FACTOR:g}x native's and > atol), "
                f"{BUG}: {DECLINE}")
    if "{atol" not in tolerance_hint:      # a requirement, not an override (e.g. compiled and eager must agree)
        return f"The worst error is {ratio_text(ratio)}x the tolerance {tolerance_hint}"
    return f"To accept: {tolerance_hint.format(atol=need_atol, rtol=rtol)} or a waiver"


# At most this many runs of consecutive bad rows are spelled out; the rest are counted.
SHOWN_ROW_RUNS = 3


@dataclasses.dataclass(frozen=True)
class RowDetail:
    """The rows a set of bad elements is in (a row: one index of the leading dims, flattened; the last dim is a row's
    elements): the bad rows' indices, and per bad row whether the implementation's output and native's are all zero
    and all nan there, of `n_rows` rows."""

    n_rows: int
    index: torch.Tensor                 # int64 [k], ascending
    got_zero: torch.Tensor              # bool [k]
    want_zero: torch.Tensor
    got_nan: torch.Tensor
    want_nan: torch.Tensor

    def shifted(self, rows: int) -> RowDetail:
        return dataclasses.replace(self, index=self.index + rows)

    @staticmethod
    def joined(details: list[RowDetail]) -> RowDetail:
        """The rows of consecutive chunks (shifted to their place) as one output's: bad rows and row counts added."""
        return RowDetail(sum(d.n_rows for d in details), *(torch.cat([getattr(d, f) for d in details]) for f in
                                                          ("index", "got_zero", "want_zero", "got_nan", "want_nan")))


def row_detail(bad: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> RowDetail | None:
    """The RowDetail of the elements `bad` marks, `a` the implementation's output and `b` native's; None for outputs
    of fewer than two dims or without elements."""
    if a.ndim < 2 or a.numel() == 0:
        return None
    width = a.shape[-1]
    index = bad.reshape(-1, width).any(dim=-1).nonzero().flatten()
    got, want = a.reshape(-1, width)[index], b.reshape(-1, width)[index]
    return RowDetail(bad.numel() // width, index, (got == 0).all(dim=-1), (want == 0).all(dim=-1),
                     torch.isnan(got).all(dim=-1), torch.isnan(want).all(dim=-1))


def bad_rows(bad: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> str:
    """Which rows hold the elements `bad` marks (`describe_rows` of their `row_detail`). Empty for outputs of fewer
    than two dims."""
    detail = row_detail(bad, a, b)
    return "" if detail is None else describe_rows(detail)


def describe_rows(detail: RowDetail) -> str:
    """How many of how many rows are bad, the first, and the runs of consecutive bad rows, each said to be all zero
    or all nan where the implementation's output is that on the whole run and native's is not. A kernel that stops
    at a row limit shows as one run from the limit to the last row ("rows 4096..65536 are all zero")."""
    bad_idx = detail.index
    if bad_idx.numel() == 0:
        return ""
    first = int(bad_idx[0])
    breaks = (bad_idx[1:] != bad_idx[:-1] + 1).nonzero().flatten()
    starts = [0] + [int(i) + 1 for i in breaks]
    ends = [int(i) for i in breaks] + [bad_idx.numel() - 1]
    runs = [_row_run(detail, lo, hi) for lo, hi in zip(starts[:SHOWN_ROW_RUNS], ends[:SHOWN_ROW_RUNS])]
    more = len(starts) - len(runs)
    shown = ", ".join(runs) + (f" and {more} more run{'s' if more > 1 else ''} of bad rows" if more else "")
    return f" in {bad_idx.numel()} of {detail.n_rows} rows, first bad row {first} ({shown})"


def _row_run(detail: RowDetail, lo: int, hi: int) -> str:
    """`row 7`, `rows 4096..65536` (bad rows lo..hi of `detail`, consecutive), with ` are all zero` / ` are all nan`
    (` is` for one row) where the implementation's output is that there and native's is not."""
    first, last = int(detail.index[lo]), int(detail.index[hi])
    text = f"row {first}" if first == last else f"rows {first}..{last}"
    verb = "is" if first == last else "are"
    if bool(detail.got_zero[lo:hi + 1].all()) and not bool(detail.want_zero[lo:hi + 1].all()):
        return f"{text} {verb} all zero"
    if bool(detail.got_nan[lo:hi + 1].all()) and not bool(detail.want_nan[lo:hi + 1].all()):
        return f"{text} {verb} all nan"
    return text


def as_outputs(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _unravel(flat: int, shape) -> tuple[int, ...]:
    idx = []
    for size in reversed(tuple(shape)):
        idx.append(flat % size)
        flat //= size
    return tuple(reversed(idx))


def _structure(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__
