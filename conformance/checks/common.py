"""Shared machinery of the checks: context, verdicts, input handling. The comparison itself and the argument copies
a judgement runs on are the judge's (`conformance.judge.comparison`, `conformance.judge.golden`), re-exported here."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import re
import traceback
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch

from conformance.judge.comparison import (  # noqa: F401 - re-exported: the checks compare through here
    OVERRIDE_FACTOR,
    QUALITY_FACTOR,
    QUALITY_FLOOR_OF_ATOL,
    Comparison,
    as_outputs,
    compare_outputs,
)
from conformance.judge.golden import clone_args, clone_layout, to_golden, widens  # noqa: F401 - re-exported
from conformance.results import running_note
from conformance.results.messages import sanitize
from conformance.results.result import Outcome
from conformance.collect.releases import release_lacks
from conformance.collect.units import LEVELS, Unit, dtype_from_name, dtype_name, generator, unit_seed

@dataclasses.dataclass
class CheckContext:
    """What every check body needs: the active platform, seed, level and device."""

    platform_name: str
    platform: Any
    seed: int = 1234
    level: str = "standard"
    draw: str | None = None     # a property check replays this one recorded draw instead of drawing (repro --draw)

    @property
    def device(self) -> str:
        return self.platform.device_type

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"level {self.level!r} is not one of {LEVELS}")


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
    draw: str | None = None     # the hypothesis draw the message is about, for the repro command's --draw
    err_to_tol: float | None = None   # the worst element's error / its tolerance (conformance.judge.tolerances)
    # whose code the outcome is about, where the check observed it (conformance.collect.origin.Origin.to_json()): the
    # engine family's ERROR raised in vLLM's own code, say; None leaves it to the unit's identity (Attribution.of_result)
    origin: dict | None = None

    def __post_init__(self):
        self.message = sanitize(self.message)


def passed(message: str | None = None, **errs) -> Verdict:
    return Verdict(Outcome.PASS, message, **errs)


def failed(message: str, **errs) -> Verdict:
    return Verdict(Outcome.FAIL, message, **errs)


def not_supported(message: str) -> Verdict:
    return Verdict(Outcome.NOT_SUPPORTED, message)


# Exceptions by which an implementation says it does not take these arguments (a refusal, not a failure).
REFUSALS = (NotImplementedError, ValueError)


def error_from(exc: BaseException, where: str, accepted: bool = False, layer: bool = False) -> Verdict:
    """ERROR naming where the exception came from, with the innermost frames of its traceback. `accepted`: the
    platform's code raised on arguments it took (its supports_args accepted them; a `layer` has none), so the
    advice is how to decline them."""
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = "".join(frames[-4:]).strip()
    first, sep, rest = f"{where} raised {type(exc).__name__}: {exc}".partition("\n")
    if accepted:
        first = f"{first.rstrip('. ')}. {decline_advice(exc, layer)}"
    return Verdict(Outcome.ERROR, sanitize(f"{first}{sep}{rest}\n{tail}"))


def decline_advice(exc: BaseException, layer: bool = False) -> str:
    """What to do about code that raised on arguments it took: an IR implementation declines them in its
    supports_args, a layer hands them to forward_native (conformance.judge.hints.decline)."""
    from conformance.judge.hints import decline

    if layer:
        if isinstance(exc, REFUSALS):
            return f"The layer refuses these inputs: {decline('them', True)}"
        return f"If the layer cannot take these inputs, {decline('them', True)}; otherwise this is a bug in it"
    if isinstance(exc, REFUSALS):
        return ("The implementation refuses arguments that its supports_args accepted (or it registered none): "
                f"{decline('these arguments', False)}")
    return ("If the implementation cannot take these arguments, decline them in `supports_args` (they then run on "
            "the next provider or native); otherwise this is a bug in it")


def raised_on_accepted_arguments(where: str) -> bool:
    """Whether a KernelRaised's `where` is a call of the implementation (not of its supports_args or a constructor)."""
    return not where.startswith(("supports_args", "constructing"))


class KernelRaised(Exception):
    """Wraps an exception raised by the implementation under test (so the check reports ERROR)."""

    def __init__(self, where: str, exc: BaseException):
        super().__init__(f"{where}: {exc}")
        self.where = where
        self.exc = exc


def call_impl(where: str, fn, *args):
    """`fn(*args)` (the platform's code); its raise becomes KernelRaised. What is called, and with which
    arguments, is noted first where a crash of this process would be reported (conformance.results.running_note)."""
    running_note.before_call(where, fn, args)
    generators = _generator_states()
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - any raise of the kernel is the result
        raise KernelRaised(where, exc) from exc
    finally:
        running_note.after_call()
        _note_generator_use(where, generators)


def release_lacks_verdict(exc: KernelRaised, case_name: str | None) -> Verdict | None:
    """NOT_SUPPORTED naming the release when what the implementation raised is (or was raised from) a bridge's
    `ReleaseLacks` (an older vLLM cannot build what the case asks: not the platform's fault); None otherwise."""
    lacks = release_lacks(exc.exc)
    if lacks is None:
        return None
    return not_supported(f"case {case_name} cannot be built with this release: {exc.where} raised {lacks}")


def within_vllm(case, body) -> Verdict:
    """`body()` for a case; for a case beyond vLLM 0.32 (its `beyond_vllm` reason set), an implementation
    that declines it, raises on it or computes otherwise behaves like vLLM there: NOT_SUPPORTED naming
    the reason, never FAIL or ERROR (a pass is still a PASS).

    For any case, a raise that is a bridge's `ReleaseLacks` (conformance.collect.releases: the installed release of
    vLLM, older than 0.32, cannot build what the case asks, e.g. a constructor argument it never took) is
    NOT_SUPPORTED naming that release: the release lacks the feature, the platform under test did nothing wrong."""
    reason = getattr(case, "beyond_vllm", None)
    if not reason:
        try:
            return body()
        except KernelRaised as exc:
            verdict = release_lacks_verdict(exc, case.name)
            if verdict is None:
                raise
            return verdict
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
def memory_skip(case, device: str) -> Verdict | None:
    """SKIP naming what is missing, for a case that needs more memory than the host or `device` has free now (a
    case past 2^31 elements, reference_impl.ir.size_cases); None for a case that fits or declares no need."""
    from reference_impl.ir.size_cases import memory_shortfall

    short = memory_shortfall(getattr(case, "memory_bytes", None), device)
    return None if short is None else Verdict(Outcome.SKIP, f"case {case.name} {short}")


def unit_dtype(unit: Unit) -> torch.dtype:
    assert unit.dtype is not None, unit
    return dtype_from_name(unit.dtype)


def case_generator(ctx: CheckContext, unit: Unit, case_name: str | None = None) -> torch.Generator:
    return generator(unit_seed(ctx.seed, unit.op, case_name or unit.case, unit.dtype))


def golden_layer(layer: torch.nn.Module, run_dtype: torch.dtype) -> torch.nn.Module:
    """A float64 copy of `layer` for the golden run: parameters and buffers of the run's dtype widened,
    those a case pinned to another dtype kept (see `to_golden`)."""
    copy_ = copy.deepcopy(layer)
    return copy_._apply(lambda t: t.to(torch.float64) if widens(t, run_dtype) else t)


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


# ----- global state a unit must leave as it found it ----------------------------------------------------------------
# A kernel that reseeds or draws from the default random generator breaks every seeded request after it; one that
# changes the default dtype, grad mode or torch's thread count changes every computation after it. `run_unit`
# (conformance.checks) snapshots these around every unit of every family and makes a change a FAIL naming it. The
# checks draw random inputs themselves (and build models whose initialisation draws), so a draw from the default
# generator counts only inside the platform's code, `call_impl`; a reseed counts wherever it happens.
_NOTED: list[str] = []     # what call_impl and drawing_default_generator saw inside a unit, for run_unit
_DRAWS_ALLOWED = [0]       # > 0 inside drawing_default_generator: the code called may draw (not reseed)


@dataclasses.dataclass
class GlobalState:
    generators: list[tuple[str, int, torch.Tensor]]     # (name, initial seed, state) of each default generator
    default_dtype: torch.dtype
    grad_enabled: bool
    threads: int


def _default_generators() -> list[tuple[str, torch.Generator]]:
    gens = [("the default (CPU) generator", torch.default_generator)]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gens += [(f"the default generator of cuda:{i}", g) for i, g in enumerate(torch.cuda.default_generators)]
    return gens


def _generator_states() -> list[tuple[str, int, torch.Tensor]]:
    return [(name, g.initial_seed(), g.get_state()) for name, g in _default_generators()]


# Calls of the platform's code that may draw: a constructor initialises its parameters from the default generator
# (torch.nn's layers do), as building a model does; a reseed there still counts.
_DRAWING_CALLS = ("constructing ", "building ")


def _note_generator_use(where: str, before: list[tuple[str, int, torch.Tensor]]) -> None:
    """After the platform's code ran (`where`): a reseed of a default generator is noted; so is a draw, unless the
    caller allowed draws (drawing_default_generator) or the call constructs something (_DRAWING_CALLS)."""
    gens = dict(_default_generators())
    draws_allowed = _DRAWS_ALLOWED[0] or where.startswith(_DRAWING_CALLS)
    for name, seed, rng in before:
        gen = gens.get(name)
        if gen is None:
            continue
        change = _generator_change(name, seed, rng, gen)
        if change and (change.reseeded or not draws_allowed):
            _NOTED.append(f"{where}: {change.phrase}")


def global_state() -> GlobalState:
    return GlobalState(_generator_states(), torch.get_default_dtype(), torch.is_grad_enabled(),
                       torch.get_num_threads())


def restore_global_state(state: GlobalState) -> None:
    gens = dict(_default_generators())
    for name, _, rng in state.generators:
        if name in gens:
            gens[name].set_state(rng)
    torch.set_default_dtype(state.default_dtype)
    torch.set_grad_enabled(state.grad_enabled)
    if torch.get_num_threads() != state.threads:
        torch.set_num_threads(state.threads)


def _reseeded(seed: int, rng: torch.Tensor, gen: torch.Generator) -> bool:
    """Whether `gen` (initial seed `seed`, state `rng` before) was reseeded since: its seed moved, or its state moved
    back to the start of its seed's stream (torch.manual_seed of the seed it already had: otherwise a reseed read as
    a draw or as nothing, by what the process had seeded before, and the same fault got another message)."""
    if gen.initial_seed() != seed:
        return True
    state = gen.get_state()
    if torch.equal(state, rng):
        return False
    try:
        fresh = torch.Generator(device=gen.device).manual_seed(seed).get_state()
    except RuntimeError:   # a device whose generators torch cannot make here: a seed that moved is all we see
        return False
    return torch.equal(state, fresh)


class GeneratorChange(NamedTuple):
    phrase: str        # what happened to the generator, for the FAIL's message
    reseeded: bool     # a reseed (always a finding), else a draw (a finding unless draws are allowed)


def _generator_change(name: str, seed: int, rng: torch.Tensor, gen: torch.Generator) -> GeneratorChange | None:
    if _reseeded(seed, rng, gen):
        return GeneratorChange(f"{name} was reseeded (torch.manual_seed({gen.initial_seed()}))", True)
    if not torch.equal(gen.get_state(), rng):
        return GeneratorChange(f"{name} was drawn from (or its state set): its state changed", False)
    return None


def global_state_changes(before: GlobalState) -> list[str]:
    """What changed since `before`, one phrase each (empty: nothing): a default generator reseeded (a draw alone is
    the checks' own unless call_impl noted it), the default dtype, grad mode, the thread count."""
    changes = []
    gens = dict(_default_generators())
    for name, seed, rng in before.generators:
        change = _generator_change(name, seed, rng, gens[name]) if name in gens else None
        if change and change.reseeded:
            changes.append(change.phrase)
    if torch.get_default_dtype() != before.default_dtype:
        changes.append(f"the default dtype went from {dtype_name(before.default_dtype)} to "
                       f"{dtype_name(torch.get_default_dtype())} (torch.set_default_dtype)")
    if torch.is_grad_enabled() != before.grad_enabled:
        changes.append(f"grad mode went from {'on' if before.grad_enabled else 'off'} to "
                       f"{'on' if torch.is_grad_enabled() else 'off'} (torch.set_grad_enabled)")
    if torch.get_num_threads() != before.threads:
        changes.append(f"torch's thread count went from {before.threads} to {torch.get_num_threads()} "
                       "(torch.set_num_threads)")
    return changes


@contextlib.contextmanager
def drawing_default_generator(where: str) -> Iterator[None]:
    """Code inside may draw from the default generators (a sampler does for requests without a seed, as vLLM's);
    their states are put back afterwards and call_impl does not note those draws. A reseed inside is still noted,
    for `run_unit` to report."""
    before = _generator_states()
    _DRAWS_ALLOWED[0] += 1
    try:
        yield
    finally:
        _DRAWS_ALLOWED[0] -= 1
        gens = dict(_default_generators())
        for name, seed, rng in before:
            gen = gens.get(name)
            if gen is None:
                continue
            change = _generator_change(name, seed, rng, gen)
            if change and change.reseeded:
                _NOTED.append(f"{where}: {change.phrase}")
            gen.set_state(rng)


def side_effect_verdict(verdict: Verdict, before: GlobalState) -> Verdict:
    """`verdict` unless the unit changed global state it does not own: then a FAIL naming each change (a FAIL or an
    ERROR keeps its outcome and gains the note), and the state is put back for the next unit."""
    noted = list(dict.fromkeys(_NOTED))
    _NOTED.clear()
    changes = noted + [c for c in global_state_changes(before) if not any(n.endswith(c) for n in noted)]
    restore_global_state(before)      # the checks' own draws too: the next unit starts where this one did
    if not changes:
        return verdict
    note = ("the unit changed global state it does not own: " + "; ".join(changes)
            + " (every later computation, and every seeded request, sees the change)")
    if verdict.outcome in (Outcome.FAIL, Outcome.ERROR, Outcome.CRASH, Outcome.TIMEOUT):
        return dataclasses.replace(verdict, message=f"{verdict.message}; also, {note}")
    was = f" (the check itself: {verdict.outcome.value}: {verdict.message})" if verdict.message else ""
    return dataclasses.replace(verdict, outcome=Outcome.FAIL, message=f"{note}{was}")
