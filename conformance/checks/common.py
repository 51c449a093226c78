"""Shared machinery of the checks: context, verdicts, input handling, comparison with golden grading."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from conformance.collect.units import LEVELS, Unit, dtype_from_name, dtype_name, generator, unit_seed
from conformance.results.result import Outcome

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


@dataclasses.dataclass
class CheckContext:
    """What every check body needs: the active platform, seed, level and device."""

    platform_name: str
    platform: Any
    seed: int = 1234
    level: str = "standard"

    @property
    def device(self) -> str:
        return self.platform.device_type

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"level {self.level!r} is not one of {LEVELS}")


# `<pkg.Cls object at 0x7f..>` -> `<Cls object>`; `<function f at 0x7f..>` -> `<function f>`; other addresses.
_OBJECT_REPR = re.compile(r"<(?:[\w.<>]+\.)?(\w+) object at 0x[0-9a-fA-F]+>")
_AT_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{8,}\b")


def sanitize(text: str | None) -> str | None:
    """`text` without memory addresses or object reprs, so the same run gives the same messages."""
    if text is None:
        return None
    text = _OBJECT_REPR.sub(r"<\1 object>", text)
    text = _AT_ADDRESS.sub("", text)
    return _ADDRESS.sub("0x...", text)


def exception_line(exc: BaseException) -> str:
    """`Type: first line of the message`, cut after torch's first sentence when that line is long."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    if len(first) > 120:
        ends = [m.start() for m in re.finditer(r"\. ", first) if not first[: m.start()].endswith(("e.g", "i.e"))]
        first = first[: ends[0]] if ends else first
    return sanitize(f"{type(exc).__name__}: {first}".rstrip(": "))


@dataclasses.dataclass
class Verdict:
    """A check's answer before the harness adds nodeid, repro and timing; the message is sanitized."""

    outcome: Outcome
    message: str | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None

    def __post_init__(self):
        self.message = sanitize(self.message)


class CheckFailed(Exception):
    """Raised inside a check body to end it with FAIL and this message."""


def passed(message: str | None = None, **errs) -> Verdict:
    return Verdict(Outcome.PASS, message, **errs)


def failed(message: str, **errs) -> Verdict:
    return Verdict(Outcome.FAIL, message, **errs)


def not_supported(message: str) -> Verdict:
    return Verdict(Outcome.NOT_SUPPORTED, message)


def error_from(exc: BaseException, where: str) -> Verdict:
    """ERROR naming where the exception came from, with the innermost frames of its traceback."""
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = "".join(frames[-4:]).strip()
    return Verdict(Outcome.ERROR, sanitize(f"{where} raised {type(exc).__name__}: {exc}\n{tail}"))


class KernelRaised(Exception):
    """Wraps an exception raised by the implementation under test (so the check reports ERROR)."""

    def __init__(self, where: str, exc: BaseException):
        super().__init__(f"{where}: {exc}")
        self.where = where
        self.exc = exc


def call_impl(where: str, fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - any raise of the kernel is the result
        raise KernelRaised(where, exc) from exc


def within_vllm(case, body) -> Verdict:
    """`body()` for a case; for a case beyond vLLM 0.32 (its `beyond_vllm` reason set), an implementation
    that declines it, raises on it or computes otherwise behaves like vLLM there: NOT_SUPPORTED naming
    the reason, never FAIL or ERROR (a pass is still a PASS)."""
    reason = getattr(case, "beyond_vllm", None)
    if not reason:
        return body()
    note = f"case {case.name} asks for more than vLLM 0.32 does ({reason})"
    try:
        verdict = body()
    except KernelRaised as exc:
        return not_supported(f"{note}; {exc.where} raised {exception_line(exc.exc)}")
    if verdict.outcome in (Outcome.FAIL, Outcome.ERROR):
        return not_supported(f"{note}; the implementation differs from the reference there: {verdict.message}")
    if verdict.outcome is Outcome.NOT_SUPPORTED:
        return not_supported(f"{verdict.message}; {note}")
    return verdict


# ----- inputs --------------------------------------------------------------------------------------
def unit_dtype(unit: Unit) -> torch.dtype:
    assert unit.dtype is not None, unit
    return dtype_from_name(unit.dtype)


def case_generator(ctx: CheckContext, unit: Unit, case_name: str | None = None) -> torch.Generator:
    return generator(unit_seed(ctx.seed, unit.op, case_name or unit.case, unit.dtype))


def clone_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes, strides, offset and storage bytes (padding included)."""
    storage = t.untyped_storage().clone()
    out = torch.empty((0,), dtype=t.dtype, device=t.device)
    out.set_(storage, t.storage_offset(), t.size(), t.stride())
    return out


def clone_args(args: Sequence[Any]) -> tuple:
    return tuple(clone_layout(a) if isinstance(a, torch.Tensor) else a for a in args)


def to_golden(args: Sequence[Any]) -> tuple:
    """Floating-point tensors (not fp8) promoted to float64; everything else copied as is."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.element_size() > 1:
            out.append(a.detach().to(torch.float64))
        elif isinstance(a, torch.Tensor):
            out.append(a.clone())
        else:
            out.append(a)
    return tuple(out)


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A copy of every byte of `t`'s storage (so writes outside the view are seen too)."""
    view = torch.empty((0,), dtype=torch.uint8, device=t.device)
    view.set_(t.untyped_storage())
    return view.clone()


def snapshot(args: Sequence[Any]) -> dict[int, torch.Tensor]:
    return {i: storage_bytes(a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)}


def changed_args(args: Sequence[Any], before: dict[int, torch.Tensor]) -> list[int]:
    """Indices of tensor arguments whose storage bytes differ from the snapshot."""
    changed = []
    for i, old in before.items():
        now = storage_bytes(args[i])
        if now.shape != old.shape or not torch.equal(now, old):
            changed.append(i)
    return changed


def first_changed_byte(arg: torch.Tensor, old: torch.Tensor) -> str:
    now = storage_bytes(arg)
    n = min(now.numel(), old.numel())
    diff = (now[:n] != old[:n]).nonzero()
    if diff.numel() == 0:
        return f"storage size changed from {old.numel()} to {now.numel()} bytes"
    byte = int(diff[0])
    return (f"{int((now[:n] != old[:n]).sum())} of {n} storage bytes differ, first at byte {byte} "
            f"(element {byte // arg.element_size()} of the storage)")


def storage_span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors share storage bytes (their storages' address ranges intersect)."""
    sa, ea = storage_span(a)
    sb, eb = storage_span(b)
    if ea == sa or eb == sb:
        return False
    return sa < eb and sb < ea


def as_outputs(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def describe_args(param_names: Sequence[str], args: Sequence[Any]) -> str:
    parts = []
    for name, a in zip(param_names, args):
        if isinstance(a, torch.Tensor):
            contiguous = "" if a.is_contiguous() else f", stride={tuple(a.stride())}"
            parts.append(f"{name}=Tensor{tuple(a.shape)}:{dtype_name(a.dtype)}{contiguous}")
        else:
            parts.append(f"{name}={a!r}")
    return ", ".join(parts)


@contextlib.contextmanager
def native_only() -> Iterator[None]:
    """Every IR op dispatches to native inside the block (for reference layers' forward_native)."""
    from reference_impl.ir.op import IrOp

    with contextlib.ExitStack() as stack:
        for op in list(IrOp.registry.values()):
            stack.enter_context(op.set_priority(["native"]))
        yield


# ----- comparison ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Comparison:
    outcome: Outcome
    message: str
    max_abs_err: float | None = None
    max_rel_err: float | None = None


def _as_f64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) or t.dtype.is_floating_point and t.element_size() == 1:
        t = t.to(torch.float32)
    if t.is_complex():
        return torch.view_as_real(t).to(torch.float64)
    return t.to(torch.float64)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def compare_outputs(out: Any, ref: Any, golden: Any | None, *, atol: float, rtol: float,
                    compare_nan: bool, dtype: torch.dtype, tolerance_hint: str) -> Comparison:
    """Structure, dtype and shape exactly; values within atol + rtol*|native|; golden grading.

    `tolerance_hint` is a format string taking atol and rtol, naming the override that would accept
    (offered only when plausible, see OVERRIDE_FACTOR); a hint without `{atol}` is a requirement.
    """
    outs, refs = as_outputs(out), as_outputs(ref)
    goldens = as_outputs(golden) if golden is not None else (None,) * len(refs)
    if isinstance(out, (tuple, list)) != isinstance(ref, (tuple, list)) or len(outs) != len(refs):
        return Comparison(Outcome.FAIL, f"returned {_structure(out)}, native returns {_structure(ref)}")
    worst_abs = worst_rel = 0.0
    quality_notes = []
    for k, (o, r, g) in enumerate(zip(outs, refs, goldens)):
        label = f"output {k}" if len(outs) > 1 else "output"
        if o is None and r is None:
            continue  # e.g. a rotary layer's key output when called with key=None
        if not isinstance(o, torch.Tensor) or not isinstance(r, torch.Tensor):
            if not isinstance(r, torch.Tensor):
                return Comparison(Outcome.FAIL, f"{label} is {type(o).__name__}, native returns "
                                  f"{type(r).__name__}")
            return Comparison(Outcome.FAIL, f"{label} is {type(o).__name__}, native returns a Tensor")
        if o.dtype != r.dtype:
            return Comparison(Outcome.FAIL, f"{label} dtype is {dtype_name(o.dtype)}, native gives "
                              f"{dtype_name(r.dtype)}: the output dtype must equal native's exactly")
        if tuple(o.shape) != tuple(r.shape):
            return Comparison(Outcome.FAIL, f"{label} shape is {tuple(o.shape)}, native gives {tuple(r.shape)}")
        if o.device.type != r.device.type:
            return Comparison(Outcome.FAIL, f"{label} is on {o.device}, native's on {r.device}")
        if o.numel() == 0:
            continue
        a, b = _as_f64(o).cpu(), _as_f64(r).cpu()
        gold = _as_f64(g).cpu() if isinstance(g, torch.Tensor) and tuple(g.shape) == tuple(r.shape) else None
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        if compare_nan:
            nan_mismatch = nan_a != nan_b
            if bool(nan_mismatch.any()):
                idx = _unravel(int(nan_mismatch.flatten().nonzero()[0]), a.shape)
                return Comparison(Outcome.FAIL, f"{label}: nan positions differ from native "
                                  f"({int(nan_mismatch.sum())} elements); first at index {idx}: "
                                  f"got {_fmt(float(a[idx]))}, native {_fmt(float(b[idx]))}")
        considered = ~nan_b
        inf_b = torch.isinf(b)
        inf_mismatch = considered & inf_b & (a != b)
        if bool(inf_mismatch.any()):
            idx = _unravel(int(inf_mismatch.flatten().nonzero()[0]), a.shape)
            return Comparison(Outcome.FAIL, f"{label}: native gives {_fmt(float(b[idx]))} at index {idx}, "
                              f"got {_fmt(float(a[idx]))}")
        finite = considered & ~inf_b
        diff = torch.where(finite, (a - b).abs(), torch.zeros_like(a))
        diff = torch.where(finite & torch.isnan(a), torch.full_like(a, math.inf), diff)
        allowed = atol + rtol * b.abs()
        excess = torch.where(finite, diff - allowed, torch.full_like(a, -math.inf))
        max_abs = float(diff.max())
        rel = torch.where(finite & (b.abs() > atol), diff / b.abs().clamp_min(1e-300), torch.zeros_like(a))
        max_rel = float(rel.max())
        worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, max_rel)
        flat = int(excess.flatten().argmax())
        idx = _unravel(flat, a.shape)
        if float(excess.flatten()[flat]) > 0:
            n_bad = int((excess > 0).sum())
            need_atol = float((diff - rtol * b.abs())[finite].max())
            need_atol = float(f"{need_atol * 1.1:.2g}") if math.isfinite(need_atol) else math.inf
            gold_note, golden_errs = "", None
            if gold is not None:
                golden_errs = gi, gn = _golden_err(a, gold, finite), _golden_err(b, gold, finite)
                gold_note = (f"; against float64: impl max err {_fmt(gi)}, native {_fmt(gn)}; float64 "
                             f"golden value there {_fmt(float(gold[idx]))}")
            ratio = float((diff / allowed.clamp_min(1e-300))[finite].max())
            msg = (f"{label}: {n_bad} of {a.numel()} elements outside atol={atol:g} rtol={rtol:g} "
                   f"({dtype_name(dtype)}); worst at index {idx}: got {_fmt(float(a[idx]))}, native "
                   f"{_fmt(float(b[idx]))} (abs err {_fmt(float(diff[idx]))}); max abs err {_fmt(max_abs)}, "
                   f"max rel err {_fmt(max_rel)}{gold_note}. "
                   + _advice(ratio, golden_errs, atol, tolerance_hint, need_atol, rtol))
            return Comparison(Outcome.FAIL, msg, max_abs, max_rel)
        if gold is not None:
            gi, gn = _golden_err(a, gold, finite), _golden_err(b, gold, finite)
            floor = QUALITY_FLOOR_OF_ATOL * atol
            if gi > QUALITY_FACTOR * gn and gi > floor:
                quality_notes.append(
                    f"{label}: within tolerance of native, but max error against the float64 golden run is "
                    f"{_fmt(gi)}, native's is {_fmt(gn)} (clearly worse: > {QUALITY_FACTOR:g}x native's and "
                    f"> {QUALITY_FLOOR_OF_ATOL:g}*atol = {_fmt(floor)})")
    if quality_notes:
        return Comparison(Outcome.QUALITY_WARNING, "; ".join(quality_notes), worst_abs, worst_rel)
    return Comparison(Outcome.PASS, f"within atol={atol:g} rtol={rtol:g}", worst_abs, worst_rel)


def _advice(ratio: float, golden_errs: tuple[float, float] | None, atol: float, tolerance_hint: str,
            need_atol: float, rtol: float) -> str:
    """The override `tolerance_hint` names, only when the failure looks like rounding: the worst error within
    OVERRIDE_FACTOR of the tolerance and, where graded, the implementation not clearly further from
    float64 than native (QUALITY_FACTOR, above atol). Otherwise say why it points to a bug."""
    bug = "which points to a bug in the implementation rather than a tolerance to loosen"
    if ratio > OVERRIDE_FACTOR:
        return (f"The worst error is {_fmt(ratio)}x the tolerance (atol + rtol*|native|): far beyond rounding "
                f"differences (an override is offered up to {OVERRIDE_FACTOR:g}x), {bug}")
    if golden_errs is not None:
        gi, gn = golden_errs
        if gi > QUALITY_FACTOR * gn and gi > atol:
            return (f"Against float64 the implementation is off by {_fmt(gi)}, native by {_fmt(gn)}: not a "
                    f"rounding difference (> {QUALITY_FACTOR:g}x native's and > atol), {bug}")
    if "{atol" not in tolerance_hint:      # a requirement, not an override (e.g. compiled and eager must agree)
        return f"The worst error is {_fmt(ratio)}x the tolerance {tolerance_hint}"
    return f"To accept: {tolerance_hint.format(atol=need_atol, rtol=rtol)} or a waiver"


def _golden_err(x: torch.Tensor, gold: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask & torch.isfinite(gold) & torch.isfinite(x)
    if not bool(m.any()):
        return 0.0
    return float((x[m] - gold[m]).abs().max())


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
