"""Declarative cases for CustomOp layers, consumed by the conformance suites.

A layer class declares its conformance record once, with `declare_cases(cls, tolerances=...,
cases=[...])` (the layer counterpart of `IrOp.add_cases`): per-dtype tolerances and the cases in one
validated `LayerConformance`, read back with `conformance_of(cls)`. Each case builds constructor
kwargs, optionally randomizes the layer's parameters (seeded), and builds the forward arguments. The
harness compares a vendor's replacement (`forward_oot`) against the in-tree class's `forward_native`
with equal parameters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from reference_impl.ir.cases import LEVELS, OpCase


@dataclasses.dataclass(frozen=True)
class LayerCase:
    name: str
    make_kwargs: Callable[[torch.dtype], dict[str, Any]]
    make_inputs: Callable[[torch.dtype, str, torch.Generator], tuple[Any, ...]]
    init_params: Callable[[torch.nn.Module, torch.Generator], None] | None = None
    level: str = "quick"
    dtypes: tuple[torch.dtype, ...] | None = None
    # Build the layer with torch's default dtype set to the run dtype, as vLLM's model loader does
    # (`set_default_torch_dtype`), for constructors that take no dtype argument (vLLM's do not).
    default_dtype: bool = False
    # Why this case asks for more than vLLM 0.32 does (see OpCase.beyond_vllm); None when it does not.
    beyond_vllm: str | None = None
    # Bytes free on the host and device that running and judging the case needs (OpCase.memory_bytes: a size case
    # past 2^31 elements, reference_impl.ir.size_cases); None for an ordinary case.
    memory_bytes: int | None = None

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"layer case {self.name!r}: level {self.level!r} is not one of {LEVELS}")

    def runs_at(self, level: str) -> bool:
        return LEVELS.index(self.level) <= LEVELS.index(level)

    @contextlib.contextmanager
    def constructing(self, dtype: torch.dtype) -> Iterator[dict[str, Any]]:
        """The constructor kwargs for `dtype`, with the default dtype this case builds its layers under."""
        kwargs = self.make_kwargs(dtype)
        if not self.default_dtype:
            yield kwargs
            return
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            yield kwargs
        finally:
            torch.set_default_dtype(previous)

    def build(self, cls: type, dtype: torch.dtype) -> torch.nn.Module:
        """`cls` constructed for this case in `dtype`."""
        with self.constructing(dtype) as kwargs:
            return cls(**kwargs)


def from_op_cases(op, form: Callable[[tuple], tuple[dict[str, Any], tuple[Any, ...]]], *,
                  name: Callable[[str], str] = lambda n: n, init_params=None,
                  keep: Callable[[OpCase], bool] | None = None) -> list[LayerCase]:
    """The cases `op` declares, as cases of a layer that computes the same thing, in the layer's own call form.

    A layer inherits its op's case kinds (saturation, tiny and large magnitudes, special values, mixed dtypes,
    strided and padded rows, real-model shapes) instead of re-listing them. `form(args)` maps the op's arguments
    to (constructor kwargs, forward arguments); the kwargs may depend on the arguments' shapes, dtypes and flags
    only, since they are read from arguments built once on the CPU with a fixed seed. Level, dtypes and
    beyond_vllm carry over, and so do the size cases (rows past common kernel limits, and at full one case past
    2^31 elements with its memory need judged in one piece: the layer's kernel is row-parallel like the op's, its
    judgement is not chunked); `keep` selects; `name`
    turns the op case's name into the layer case's."""
    out = []
    for case in op.cases:
        if keep is not None and not keep(case):
            continue
        out.append(LayerCase(name(case.name), functools.partial(_op_form_kwargs, case, form),
                             functools.partial(_op_form_inputs, case, form), init_params=init_params,
                             level=case.level, dtypes=case.dtypes, beyond_vllm=case.beyond_vllm,
                             memory_bytes=case.whole_memory_bytes or case.memory_bytes))
    return out


def _op_form_kwargs(case: OpCase, form, dtype: torch.dtype) -> dict[str, Any]:
    """The layer's constructor kwargs for `case`, read from the op case's arguments. A case with a memory need (past
    2^31 elements) builds them as fake tensors, sizes without data: the kwargs read shapes, dtypes and flags only,
    and constructing the layer (or listing its kwargs) must not allocate gigabytes."""
    if case.memory_bytes:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode(allow_non_fake_inputs=True):
            return form(case.make_args(dtype, "cpu", torch.Generator().manual_seed(0)))[0]
    return form(case.make_args(dtype, "cpu", torch.Generator().manual_seed(0)))[0]


def _op_form_inputs(case: OpCase, form, dtype: torch.dtype, device: str, gen: torch.Generator) -> tuple[Any, ...]:
    return form(case.make_args(dtype, device, gen))[1]


def randomize_parameters(layer: torch.nn.Module, gen: torch.Generator, scale: float = 0.1,
                         offset: float = 1.0) -> None:
    """Fill every floating parameter with seeded values around `offset` (buffers are left alone)."""
    with torch.no_grad():
        for p in layer.parameters():
            if p.is_floating_point():
                values = torch.randn(p.shape, generator=gen, dtype=torch.float32) * scale + offset
                p.copy_(values.to(p.dtype))


class LayerCaseError(ValueError):
    """A layer's conformance declaration is malformed (the message names the class and the problem)."""


@dataclasses.dataclass
class LayerConformance:
    """What the suites need of one layer class: per-dtype (atol, rtol) and its input cases."""

    layer: str
    tolerances: dict[torch.dtype, tuple[float, float]]
    cases: tuple[LayerCase, ...]
    # Puts an output in the form results are compared in, where the semantics leave something
    # unspecified (GroupedTopk: the order of a row's top-k); None compares outputs as returned.
    canonical: Callable[[Any], Any] | None = None
    # The entry of reference_impl/ir/tolerances.py the declaration named, as given (`tolerances` is the
    # record's own copy, which override_tolerance edits); None for a record built by hand.
    declared: Mapping[torch.dtype, tuple[float, float]] | None = dataclasses.field(default=None, repr=False,
                                                                                    compare=False)

    def comparable(self, output: Any) -> Any:
        """`output` in the form it is compared in (see `canonical`)."""
        return output if self.canonical is None or output is None else self.canonical(output)

    def case(self, name: str) -> LayerCase:
        for case in self.cases:
            if case.name == name:
                return case
        raise LookupError(f"{self.layer} declares no conformance case {name!r}")

    def get_tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        if dtype not in self.tolerances:
            raise KeyError(f"{self.layer} declares no tolerance for {dtype}")
        return self.tolerances[dtype]

    def override_tolerance(self, dtype: torch.dtype, atol: float, rtol: float) -> None:
        self.tolerances[dtype] = (float(atol), float(rtol))


_ATTR = "_conformance"


def declare_cases(cls: type, *, tolerances: Mapping[torch.dtype, tuple[float, float]],
                  cases: Iterable[LayerCase], canonical: Callable[[Any], Any] | None = None) -> LayerConformance:
    """Attach `cls`'s conformance record; a second declaration, a repeated case name, no quick case, or a
    case dtype without a tolerance raises `LayerCaseError`. `canonical` (see LayerConformance) maps an
    output to the form results are compared in."""
    where = cls.__name__
    if _ATTR in vars(cls):
        raise LayerCaseError(f"{where}: conformance cases declared twice")
    cases = tuple(cases)
    declared, tolerances = tolerances, {d: (float(a), float(r)) for d, (a, r) in dict(tolerances).items()}
    if not cases:
        raise LayerCaseError(f"{where}: no conformance cases")
    if not tolerances:
        raise LayerCaseError(f"{where}: no tolerances")
    for dtype, (atol, rtol) in tolerances.items():
        if not isinstance(dtype, torch.dtype) or atol < 0 or rtol < 0:
            raise LayerCaseError(f"{where}: tolerance {dtype}: ({atol}, {rtol}) is not a dtype with atol, rtol >= 0")
    seen: set[str] = set()
    for case in cases:
        if not isinstance(case, LayerCase):
            raise LayerCaseError(f"{where}: {type(case).__name__} is not a LayerCase")
        if case.name in seen:
            raise LayerCaseError(f"{where}: case {case.name!r} declared twice")
        seen.add(case.name)
        missing = [d for d in case.dtypes or () if d not in tolerances]
        if missing:
            raise LayerCaseError(f"{where}: case {case.name!r} runs in {missing} but no tolerance is declared for it")
    if not any(c.runs_at("quick") for c in cases):
        raise LayerCaseError(f"{where}: no case runs at the quick level")
    if canonical is not None and not callable(canonical):
        raise LayerCaseError(f"{where}: canonical must be callable, got {type(canonical).__name__}")
    record = LayerConformance(where, tolerances, cases, canonical, declared)
    setattr(cls, _ATTR, record)
    return record


def conformance_of(cls: type) -> LayerConformance | None:
    """The record `cls` itself declared (not one inherited from a base class), or None."""
    return vars(cls).get(_ATTR)
