"""What a check runs on: the `Unit` (family, check, op, provider, dtype, case) and per-unit seeds.

A unit is small and plain so it crosses the pipe to the kernel worker as a dict; the worker
rebuilds every input deterministically from (op, case, dtype, seed). This module does not import torch at load:
an xdist worker handles units without ever importing it (conformance.run.collection_plan).
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

LEVELS = ("quick", "standard", "full")
DEFAULT_SEED = 1234
PROPERTY_EXAMPLES = {"quick": 8, "standard": 20, "full": 100}
PROPERTY_CASE = "property"


@dataclasses.dataclass(frozen=True)
class Unit:
    """One check of one thing: `family` is the docs/checks.md word, `check` the generic body that runs it."""

    family: str
    check: str
    op: str | None = None
    provider: str | None = None
    dtype: str | None = None
    case: str | None = None

    @property
    def id(self) -> str:
        """The pytest parameter id: the non-empty fields after the check, joined by '-'."""
        parts = [p for p in (self.op, self.provider, self.dtype, self.case) if p is not None]
        return "-".join(parts) or self.check

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Unit:
        return cls(**data)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r}")
    return dtype


def unit_seed(seed: int, *parts: object) -> int:
    """A stable per-input seed: the same (op, case, dtype) gets the same inputs for every provider."""
    key = "|".join(str(p) for p in parts).encode()
    return (seed * 1_000_003 + zlib.crc32(key)) % (2**31 - 1)


def generator(seed: int) -> torch.Generator:
    import torch

    return torch.Generator().manual_seed(seed)


def repro_command(platform: str, unit: Unit, seed: int, level: str, draw: str | None = None) -> str:
    """The shell command that reruns exactly this unit with the same seed; `draw` (a property check's failing or
    crashing hypothesis draw) makes it rerun that one draw."""
    import shlex

    words = ["python", "-m", "conformance", "repro", "--platform", platform, "--check",
             f"{unit.family}.{unit.check}"]
    for flag, value in (("--op", unit.op), ("--provider", unit.provider), ("--dtype", unit.dtype),
                        ("--case", unit.case), ("--draw", draw)):
        if value is not None:
            words += [flag, value]
    words += ["--seed", str(seed), "--level", level]
    return " ".join(shlex.quote(w) for w in words)
