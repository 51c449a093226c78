"""A hypothesis draw as text and back, so a repro command can rerun exactly one drawn example.

A property check's draw is a list of (label, value): the records of reference_impl.ir.strategies
(`Rows(...)`, `RopeHeads(...)`) and plain values (bools, ints, floats, strings, None). `format_draw`
writes `label=repr(value), ...`, the text results name the draw by; `parse_draw` reads it back
without evaluating code (Python's parser, literals and the known record classes only).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Sequence
from typing import Any


class DrawSyntaxError(ValueError):
    """The text is not a draw this module wrote; the message says which part."""


def format_draw(draws: Sequence[tuple[str | None, Any]]) -> str:
    return ", ".join(f"{label or f'draw{i}'}={value!r}" for i, (label, value) in enumerate(draws))


def _records() -> dict[str, type]:
    from reference_impl.ir import strategies

    return {name: cls for name, cls in vars(strategies).items()
            if isinstance(cls, type) and dataclasses.is_dataclass(cls)}


def _value(node: ast.AST, records: dict[str, type]) -> Any:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
        cls = records.get(node.func.id)
        if cls is None:
            raise DrawSyntaxError(f"unknown record {node.func.id!r} (known: {', '.join(sorted(records))})")
        return cls(**{kw.arg: _value(kw.value, records) for kw in node.keywords})
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise DrawSyntaxError(f"not a literal: {ast.unparse(node)!r}") from None


def parse_draw(text: str) -> list[tuple[str, Any]]:
    """[(label, value)] from `format_draw`'s text; DrawSyntaxError naming the part that is not one."""
    try:
        call = ast.parse(f"_({text})", mode="eval").body
    except SyntaxError as exc:
        raise DrawSyntaxError(f"cannot read {text!r} as label=value pairs: {exc.msg}") from None
    if not isinstance(call, ast.Call) or call.args or any(kw.arg is None for kw in call.keywords):
        raise DrawSyntaxError(f"cannot read {text!r} as label=value pairs")
    records = _records()
    try:
        return [(kw.arg, _value(kw.value, records)) for kw in call.keywords]
    except TypeError as exc:
        raise DrawSyntaxError(f"{text!r}: {exc}") from None


def replayer(draws: Sequence[tuple[str, Any]]):
    """A `draw(strategy, label)` function handing out the recorded values in order (labels must match)."""
    pending = list(draws)

    def draw(strategy, label=None):
        if not pending:
            raise DrawSyntaxError(f"the draw has no value for {label!r}: this op draws more than was recorded")
        got, value = pending.pop(0)
        if label is not None and got != label:
            raise DrawSyntaxError(f"the draw names {got!r} where this op draws {label!r}")
        return value

    return draw
