"""Cause hints: what the pattern of failing and passing cases of one provider and op points to.

Drawn only from the results (case names and dtypes): the op modules name their cases after what
makes them special (`tiny`, `near_eps`, `large`, `zeros`, `nan_row`, `strided`, `row_strided`,
`no_weight`, `variance_size=N`, sizes as `hidden=769`, `d=100`, `head=80`, `tokens=1`), so a trait shared by
every failing case and by few passing ones is a fact a vendor can act on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from conformance.results.result import CheckResult, Outcome

FAILED = frozenset({Outcome.FAIL, Outcome.ERROR})
PASSED = frozenset({Outcome.PASS, Outcome.QUALITY_WARNING})
SIZE_KEYS = ("hidden", "d", "head", "rot", "group", "dim")
EPSILON_FLAGS = ("tiny", "near_eps")   # magnitudes where an epsilon term dominates
VECTOR_WIDTH = 8   # a size that is no multiple of this leaves a tail for a vectorized loop


def case_traits(case: str | None) -> frozenset[str]:
    """The traits a case name declares: flags such as 'tiny', and 'odd'/'tail'/'one_row' from its sizes."""
    traits: set[str] = set()
    for token in (case or "").split(","):
        key, _, value = token.partition("=")
        if not value:
            traits.add(key)
            continue
        if key in ("variance_size", "var_hidden_size"):
            traits.add("variance_size")
        if key == "tokens" and value == "1":
            traits.add("one_row")
        if key in SIZE_KEYS and value.isdigit():
            size = int(value)
            if size % 2:
                traits.add("odd")
            if size % VECTOR_WIDTH:
                traits.add("tail")
    return frozenset(traits)


@dataclasses.dataclass(frozen=True)
class Trait:
    label: str                                  # "only <label> fail"
    cause: str                                  # what that usually means
    test: Callable[[frozenset[str]], bool]


# Most specific first: on equal evidence the earlier trait is named.
TRAITS = (
    Trait("tiny magnitudes", "epsilon dominates there, so check the epsilon term (left out, or added after "
          "the square root)", lambda t: any(f in t for f in EPSILON_FLAGS)),
    Trait("tiny magnitudes and all-zero inputs", "epsilon dominates there, so check the epsilon term",
          lambda t: "zeros" in t or any(f in t for f in EPSILON_FLAGS)),
    Trait("large magnitudes", "overflow or lost precision: accumulate in float32 and scale before squaring",
          lambda t: "large" in t),
    Trait("NaN/Inf positions (nan_row cases)", "special values are not propagated as native does",
          lambda t: "nan_row" in t),
    Trait("NaN/Inf and all-zero inputs", "special values are not propagated as native does",
          lambda t: "nan_row" in t or "zeros" in t),
    Trait("non-contiguous last dimension (strided cases)", "the kernel reads the input as if contiguous: "
          "honour x.stride()", lambda t: "strided" in t),
    Trait("padded rows (row_strided cases)", "the kernel assumes the row stride equals the row length",
          lambda t: "row_strided" in t),
    Trait("strided layouts", "the kernel assumes a contiguous layout: honour the strides",
          lambda t: "strided" in t or "row_strided" in t),
    Trait("odd sizes", "a vector loop's tail is dropped or mishandled", lambda t: "odd" in t),
    Trait(f"sizes that are no multiple of {VECTOR_WIDTH} (a vector tail)", "a vector loop's tail is dropped or "
          "mishandled", lambda t: "tail" in t),
    Trait("single-row inputs", "the one-row path (or a batch-size branch) differs", lambda t: "one_row" in t),
    Trait("weight=None cases", "the path without a weight differs", lambda t: "no_weight" in t),
    Trait("variance_size cases", "the statistics must cover only the first variance_size features",
          lambda t: "variance_size" in t),
)


def _items(results: Sequence[CheckResult], outcomes) -> list[tuple[str, str, frozenset[str]]]:
    return [(r.case or "", r.dtype or "", case_traits(r.case)) for r in results
            if r.outcome in outcomes and r.case and r.case != "property"]


def _cases(items) -> str:
    names = sorted({case for case, _, _ in items})
    shown = "; ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return shown


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _dtype_note(failing, passing) -> str | None:
    dtypes = {dtype for _, dtype, _ in failing}
    if len(dtypes) == 1 and any(dtype not in dtypes for _, dtype, _ in passing):
        return f"only in {next(iter(dtypes))}"
    return None


def numerics_hint(results: Sequence[CheckResult]) -> str | None:
    """A hint from one provider-and-op's numerics results, or None when no trait explains the failures."""
    failing, passing = _items(results, FAILED), _items(results, PASSED)
    if not failing:
        return None
    if not passing:
        if len({case for case, _, _ in failing}) < 2:
            return None
        return (f"every case fails ({_n(len(failing), 'result')}, {len({c for c, _, _ in failing})} cases): a wrong "
                "formula, wrong argument order or swapped outputs, not an edge case")
    best = None
    for rank, trait in enumerate(TRAITS):
        if not all(trait.test(t) for _, _, t in failing):
            continue
        with_trait = sum(1 for _, _, t in failing + passing if trait.test(t))
        if with_trait == len(failing) + len(passing):
            continue   # every case has it: it explains nothing
        purity = len(failing) / with_trait
        if best is None or purity > best[0]:
            best = (purity, rank, trait)
    dtype = _dtype_note(failing, passing)
    ok = len(passing)
    if best is not None:
        trait = best[2]
        where = f"only {trait.label} fail" + (f", {dtype}" if dtype else "")
        return (f"{where} ({_cases(failing)}: {_n(len(failing), 'result')}; {_n(ok, 'other result')} pass): "
                f"{trait.cause}")
    if dtype:
        return (f"only {dtype.removeprefix('only in ')} fails ({_cases(failing)}: {_n(len(failing), 'result')}; "
                f"{_n(ok, 'result')} of other dtypes pass): look at that dtype's own path (conversion, accumulation "
                "type)")
    return None


def cause_hint(results: Sequence[CheckResult]) -> str | None:
    """The hint for one provider and op from all its results (numerics first, then compile-only failures)."""
    numerics = [r for r in results if r.check == "numerics"]
    hint = numerics_hint(numerics)
    if hint:
        return hint
    compiled = [r for r in results if r.check == "compile" and r.outcome in FAILED]
    if compiled and numerics and all(r.outcome in PASSED for r in numerics if r.outcome is not Outcome.NOT_SUPPORTED):
        return (f"only the compiled program fails ({_n(len(compiled), 'result')}) while every eager numerics result "
                "passes: the implementation behaves differently when traced (data-dependent Python branches, "
                "a fake/meta implementation that disagrees, or reads of tensor data)")
    return None
