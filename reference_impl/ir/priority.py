"""Where an IR op's provider order comes from: one hook that the runtime installs.

The IR knows nothing of configs or platforms. A `PrioritySource` answers, for an op, which
providers to try in order, and keeps a generation number that moves whenever an answer may
change, so that ops drop the selections they cached. The runtime installs its source at import
(`reference_impl/__init__.py`: user priorities of the current config, then the current platform's
defaults). Until a source is installed every op runs `native`, unless `IrOp.set_priority` says
otherwise. docs/ir-dispatch.md describes the hook.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol


class PriorityError(ValueError):
    """A priority list names providers the op does not have; the message names them."""


class PrioritySource(Protocol):
    """What the IR asks the runtime: an op's providers in order, and when that may have changed."""

    def priority(self, op_name: str, registered: Collection[str]) -> list[str]:
        """Providers to try for `op_name`, best first (`native` may be left out: it always comes
        last). `registered` is a live view of the op's provider names (answering may register
        more, as a platform resolved on first use does); naming another one is an error."""

    def generation(self) -> int:
        """A number that moves (never back) whenever an answer of `priority` may have changed."""


class NoPriorities:
    """The source before the runtime installs one: every op runs `native`."""

    def priority(self, op_name: str, registered: Collection[str]) -> list[str]:
        return []

    def generation(self) -> int:
        return 0


# The installed source. Selection reads it on every call (reference_impl/ir/dispatch.py);
# install one with `set_priority_source`.
installed: PrioritySource = NoPriorities()


def set_priority_source(source: PrioritySource) -> PrioritySource:
    """Install `source` for every op; returns the previous one (to restore it). Ops select again
    on their next call, since each remembers the source its selections were made for."""
    global installed
    if not (callable(getattr(source, "priority", None)) and callable(getattr(source, "generation", None))):
        raise TypeError(f"a priority source needs priority(op_name, registered) and generation() methods, "
                        f"got {type(source).__name__}")
    previous, installed = installed, source
    return previous


def get_priority_source() -> PrioritySource:
    """The installed source."""
    return installed
