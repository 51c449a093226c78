"""Cause hints: what the pattern of failing and passing cases of one provider and op points to.

Drawn only from the results (op names, case names and dtypes): the op modules name their cases after
what makes them special (`tiny`, `near_eps`, `large`, `zeros`, `nan_row`, `strided`, `row_strided`,
`no_weight`, `saturated`, `variance_size=N`, `rows_past_limit`, sizes as `hidden=769`, `d=100`, `head=80`, `rot=20`,
`tokens=1`, argument values as `neox`/`gptj`, `per_token`, `approximate=none`, `cache=float32`), so a
trait shared by every failing case and by few passing ones is a fact a vendor can act on. What a
trait means depends on what the op does (a norm, a rotation, a quantization, a gated activation):
large magnitudes overflow a norm's sum of squares but cost a rotation precision. Failures that are
refusals (the implementation raised NotImplementedError or ValueError on arguments its supports_args
accepted) get the advice to decline those arguments there, not a guess at a numerical cause. A layer has
no supports_args: its advice is vLLM's convention, to hand the inputs its kernel does not take to
`forward_native`; a constructor that raised gets a constructor hint. `annotate` puts each failure's hint in
its result (the results file's `hint`) and, where the hint names an argument value, in its message.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

from conformance.results.result import CheckResult, Outcome, is_layer_result

FAILED = frozenset({Outcome.FAIL, Outcome.ERROR})
PASSED = frozenset({Outcome.PASS, Outcome.QUALITY_WARNING})
SIZE_KEYS = ("hidden", "d", "head", "rot", "group", "dim")
EPSILON_FLAGS = ("tiny", "near_eps")   # magnitudes where an epsilon term dominates
VECTOR_WIDTH = 8   # a size that is no multiple of this leaves a tail for a vectorized loop
ARGUMENT_KEYS = ("approximate", "threshold", "alpha", "cache", "group")   # `key=value` case tokens naming an argument
# Case flags naming an argument value: the value as a vendor reads it in the op's signature.
ARGUMENT_FLAGS = {"neox": "is_neox_style=True", "gptj": "is_neox_style=False", "per_token": "per_token=True",
                  "per_tensor": "per_token=False", "per_group": "per-group scales", "scale_ub": "scale_ub given"}
STATIC_SCALE_FLAGS = {"per_token": "per-token scales", "per_tensor": "a per-tensor scale"}   # static quant ops
REFUSAL = re.compile(r" raised (NotImplementedError|ValueError)\b")
CONSTRUCTOR = "constructing "   # the start of the message of an ERROR raised while the layer was built
# What to do with arguments the code cannot take: an IR implementation declines them in supports_args; a layer
# (which has none) hands them to forward_native, as vLLM's own layers do (SiluAndMul.forward_cpu,
# GemmaRMSNorm.forward_xpu), or refuses a constructor argument it never supports in its constructor.
DECLINE_IR = "decline {what} in `supports_args`, so that they run on the next provider or native"
DECLINE_LAYER = ("hand {what} to `self.forward_native(...)` from your forward_oot, as vLLM's own layers do "
                 "(or raise NotImplementedError in the constructor for a constructor argument you never support)")


def op_kinds(op: str | None) -> frozenset[str]:
    """What the op does, from its name: 'norm', 'rotation', 'quantization', 'gated' (activation) or 'activation'."""
    name = op or ""
    kinds = set()
    if "norm" in name:
        kinds.add("norm")
    if "rotary" in name or "rope" in name:
        kinds.add("rotation")
    if "quant" in name:
        kinds.add("quantization")
    if name.endswith("_and_mul"):
        kinds.add("gated")
    elif not kinds and any(word in name for word in ("gelu", "silu", "relu", "act")):
        kinds.add("activation")
    return frozenset(kinds)


# Large magnitudes: what goes wrong depends on what the op computes.
LARGE_CAUSES = {
    "norm": "overflow or lost precision in the sum of squares: accumulate in float32 and scale before squaring",
    "rotation": "x*cos - y*sin loses precision when rounded at large magnitudes: rotate in float32 and round once",
    "quantization": "the absmax or x/scale is computed imprecisely at large magnitudes: compute both in float32",
    "gated": "exp or tanh overflows at large |gate|: use a form that saturates (sigmoid of a large argument is 1, "
             "not inf/inf)",
    "activation": "exp or tanh overflows at large |x|: use a form that saturates instead of producing inf or NaN",
}
TINY_CAUSES = {
    "norm": "epsilon dominates there, so check the epsilon term (left out, or added after the square root)",
    "quantization": "the scale must be clamped below at 1/(448*512) and tiny values must not flush to zero "
                    "before scaling",
}

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
        if key == "rot":
            traits.add("partial_rotary")
        if key in ARGUMENT_KEYS:
            traits.add(f"{key}={value}")
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
    cause: str | dict[str, str]                 # what that usually means; by op kind (with a "" default)
    test: Callable[[frozenset[str]], bool]
    argument: str | None = None                 # the argument value it names ('is_neox_style=True'), if any

    def cause_for(self, kinds: frozenset[str]) -> str:
        if isinstance(self.cause, str):
            return self.cause
        for kind in sorted(kinds):
            if kind in self.cause:
                return self.cause[kind]
        return self.cause[""]


def decline(what: str, layer: bool) -> str:
    """The advice for arguments the code cannot take, in the form that fits the kind of code."""
    return (DECLINE_LAYER if layer else DECLINE_IR).format(what=what)


def argument_trait(token: str, op: str | None, layer: bool = False) -> Trait:
    """The trait of one argument value (a case flag or `key=value`), labelled as the op's signature reads it."""
    if token in ARGUMENT_FLAGS:
        static = "quantization" in op_kinds(op) and "dynamic" not in (op or "")
        label = STATIC_SCALE_FLAGS.get(token) if static and token in STATIC_SCALE_FLAGS else ARGUMENT_FLAGS[token]
    elif token.startswith("cache="):
        label = f"a {token.partition('=')[2]} cos_sin_cache"
    else:
        key, _, value = token.partition("=")
        label = f"{key}={value!r}" if not value.replace(".", "", 1).isdigit() else token
    if token.startswith("cache="):
        cause = ("a cache of another dtype than the queries: read it in its own dtype (convert it, do not reinterpret "
                 "its bytes), or decline it in `supports_args`")
    else:
        cause = ("the implementation ignores or mishandles this argument value (the other values pass): fix that path, "
                 f"or {decline('calls with that value', layer)}; no tolerance override fits an argument that is "
                 "ignored")
    return Trait(f"cases with {label}", cause, lambda t, token=token: token in t, argument=label)

# Most specific first: on equal evidence the earlier trait is named.
TRAITS = (
    Trait("row counts past a kernel's limit (rows_past_limit cases)", "rows past a fixed count are dropped or "
          "corrupted: a launch grid or scratch buffer that covers a fixed number of rows (a grid dimension capped "
          "at 65,535 blocks, a maximum batch), or a row index computed in 16 or 32 bits; size the launch from the "
          "row count and index in int64", lambda t: "rows_past_limit" in t),
    Trait("inputs past 2^31 elements (elements_past_int32 cases)", "an element offset computed in int32 overflows "
          "past 2^31: index in int64", lambda t: "elements_past_int32" in t),
    Trait("tiny magnitudes", {**TINY_CAUSES, "": "values near zero are handled differently from native (flushed to "
                              "zero, or a division by a tiny value)"}, lambda t: any(f in t for f in EPSILON_FLAGS)),
    Trait("tiny magnitudes and all-zero inputs", {"norm": "epsilon dominates there, so check the epsilon term",
                                                  "": "values near zero and zeros are handled differently from native"},
          lambda t: "zeros" in t or any(f in t for f in EPSILON_FLAGS)),
    Trait("saturated inputs (beyond the static scale's range)", "codes beyond +-448 must saturate: clamp x/scale to "
          "+-448 before the fp8 conversion (e4m3fn has no infinity, an unclamped conversion gives NaN)",
          lambda t: "saturated" in t),
    Trait("large magnitudes", {**LARGE_CAUSES, "": "overflow or lost precision at large magnitudes: compute in float32"},
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
    Trait("partial rotary (rot < head size)", "only the first rotary_dim features of each head rotate, the rest pass "
          "through, and rotary_dim / 2 need not be a multiple of the vector width", lambda t: "partial_rotary" in t),
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


def is_refusal(result: CheckResult) -> bool:
    """An ERROR by which the implementation refused arguments (NotImplementedError, ValueError) it had accepted."""
    return result.outcome is Outcome.ERROR and bool(REFUSAL.search((result.message or "").split("\n")[0]))


def _traits_of(failing, passing, op: str | None, layer: bool = False) -> list[Trait]:
    """The fixed traits, then one per argument value any failing case has."""
    tokens = sorted({t for _, _, traits in failing for t in traits if "=" in t and t.split("=")[0] in ARGUMENT_KEYS}
                    | {t for _, _, traits in failing for t in traits if t in ARGUMENT_FLAGS})
    return list(TRAITS) + [argument_trait(t, op, layer) for t in tokens]


def _best_trait(failing, passing, op: str | None, layer: bool = False) -> Trait | None:
    """The trait every failing case has and the fewest passing ones (on equal evidence, the earlier one)."""
    best = None
    for rank, trait in enumerate(_traits_of(failing, passing, op, layer)):
        if not all(trait.test(t) for _, _, t in failing):
            continue
        with_trait = sum(1 for _, _, t in failing + passing if trait.test(t))
        if with_trait == len(failing) + len(passing):
            continue   # every case has it: it explains nothing
        purity = len(failing) / with_trait
        if best is None or purity > best[0]:
            best = (purity, rank, trait)
    return best[2] if best else None


def _pattern_hint(failing, passing, op: str | None, refusals: bool, layer: bool = False) -> str | None:
    """The hint for one group of failures: wrong results (refusals=False) or refusals of accepted arguments."""
    if not failing:
        return None
    kinds = op_kinds(op)
    advice = (f"the layer raises NotImplementedError or ValueError on these inputs: {decline('them', True)}"
               if layer else
               "the implementation raises NotImplementedError or ValueError on arguments its supports_args "
               f"accepted (or it registered none): {decline('these arguments', False)}")
    if not passing:
        if len({case for case, _, _ in failing}) < 2:
            return None
        if refusals:
            return f"every case raises ({_n(len(failing), 'result')}): {advice}"
        return (f"every case fails ({_n(len(failing), 'result')}, {len({c for c, _, _ in failing})} cases): a wrong "
                "formula, wrong argument order or swapped outputs, not an edge case")
    trait = _best_trait(failing, passing, op, layer)
    dtype = _dtype_note(failing, passing)
    ok = len(passing)
    verb = "raise" if refusals else "fail"
    if trait is not None:
        where = f"only {trait.label} {verb}" + (f", {dtype}" if dtype else "")
        cause = advice if refusals else trait.cause_for(kinds)
        return f"{where} ({_cases(failing)}: {_n(len(failing), 'result')}; {_n(ok, 'other result')} pass): {cause}"
    if dtype:
        only = dtype.removeprefix("only in ")
        cause = advice if refusals else "look at that dtype's own path (conversion, accumulation type)"
        return (f"only {only} {verb}s ({_cases(failing)}: {_n(len(failing), 'result')}; {_n(ok, 'result')} of other "
                f"dtypes pass): {cause}")
    if refusals:
        return f"{_n(len(failing), 'result')} raise ({_cases(failing)}): {advice}"
    return None


def is_constructor_error(result: CheckResult) -> bool:
    """An ERROR raised while the layer was being built: no case reached its forward."""
    return result.outcome is Outcome.ERROR and (result.message or "").startswith(CONSTRUCTOR)


def constructor_hint(results: Sequence[CheckResult]) -> str | None:
    """The hint for a layer whose constructor raised: what it raised, not a guess at the formula."""
    raised = [r for r in results if is_constructor_error(r)]
    if not raised:
        return None
    first = (raised[0].message or "").split("\n")[0]
    what = first.partition(" raised ")[2] or first
    every = len(raised) == sum(1 for r in results if r.outcome is not Outcome.NOT_SUPPORTED)
    scope = "in every check" if every else f"in {_n(len(raised), 'result')}"
    return (f"the constructor raises {scope} ({what}): the layer could not be built here, so nothing of its forward "
            "was graded; make the constructor work on this platform (for a constructor argument you never support, "
            "raise NotImplementedError naming it)")


def numerics_hint(results: Sequence[CheckResult], layer: bool = False) -> str | None:
    """A hint from one provider-and-op's numerics results, or None when no trait explains the failures."""
    op = next((r.op for r in results if r.op), None)
    results = [r for r in results if not is_constructor_error(r)]
    refused = [r for r in results if is_refusal(r)]
    wrong = [r for r in results if r.outcome in FAILED and not is_refusal(r)]
    passing = _items(results, PASSED)
    hints = [_pattern_hint(_items(wrong, FAILED), passing, op, refusals=False, layer=layer),
             _pattern_hint(_items(refused, FAILED), passing, op, refusals=True, layer=layer)]
    hints = [h for h in hints if h]
    return "; ".join(hints) if hints else None


def argument_behind(results: Sequence[CheckResult]) -> str | None:
    """The argument value every wrong result of one provider and op shares and few passing ones do
    ('is_neox_style=True'), when that is what the cause hint names; else None."""
    numerics = [r for r in results if r.family == "numerics" and not is_constructor_error(r)]
    wrong = _items([r for r in numerics if r.outcome in FAILED and not is_refusal(r)], FAILED)
    passing = _items(numerics, PASSED)
    if not wrong or not passing:
        return None
    trait = _best_trait(wrong, passing, next((r.op for r in numerics if r.op), None))
    return trait.argument if trait is not None else None


def cause_hint(results: Sequence[CheckResult]) -> str | None:
    """The hint for one provider and op from all its results (a constructor that raised first, then numerics,
    then compile-only failures)."""
    hint = constructor_hint(results)
    if hint:
        return hint
    numerics = [r for r in results if r.family == "numerics"]
    hint = numerics_hint(numerics, layer=any(is_layer_result(r) for r in results))
    if hint:
        return hint
    compiled = [r for r in results if r.family == "compile" and r.outcome in FAILED]
    if compiled and numerics and all(r.outcome in PASSED for r in numerics if r.outcome is not Outcome.NOT_SUPPORTED):
        return (f"only the compiled program fails ({_n(len(compiled), 'result')}) while every eager numerics result "
                "passes: the implementation behaves differently when traced (data-dependent Python branches, "
                "a fake/meta implementation that disagrees, or reads of tensor data)")
    return None


def annotate(results: Sequence[CheckResult]) -> None:
    """At the end of a run: every FAIL and ERROR gets its provider and op's cause hint (`hint`), and a FAIL whose
    case has the argument value the hint names says so at the end of its message's first line."""
    groups: dict[tuple, list[CheckResult]] = {}
    for r in results:
        groups.setdefault((r.op, r.provider, is_layer_result(r), r.family == "model"), []).append(r)
    for members in groups.values():
        bad = [r for r in members if r.outcome in FAILED]
        if not bad:
            continue
        hint = cause_hint(members)
        argument = argument_behind(members)
        for r in bad:
            r.hint = hint
            if argument and r.outcome is Outcome.FAIL and r.family == "numerics" and r.message \
                    and "cause hint:" not in r.message:
                first, sep, rest = r.message.partition("\n")
                r.message = (f"{first} [cause hint: every failing case of this provider and op has {argument}, "
                             f"the other values pass]{sep}{rest}")
