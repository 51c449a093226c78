"""Each fixture's record, the single list of the broken fixtures: a module of this package is a fixture when it
declares `EXPECTED = Fault(...)` (what the harness must report) or `EXPECTED = Control(...)` (what it must pass).

Everything that enumerates the fixtures reads them from here: the `register_<fixture>` functions of
`conformance_broken/__init__.py`, the entry points (`entry_points()`: `setup.py` for `pip install`, and the
dist-info `tests/support/harness_runner.py` lays out for a harness subprocess), the in-process tier
(`tests/meta/test_checks_in_process.py`) and the end-to-end runs (`tests/harness/test_harness_fixtures.py`).

Standard library only, and records are read from the modules' source (`ast`), not by importing them: a fixture
module imports torch and may register things at import (`oot_name`), and the tests read the records while
collecting, in a process that must not see the fixtures.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path

PACKAGE = "conformance_broken"
GROUP = "reference_impl.platform_plugins"

# Entry points that are not a fixture module: the plugin's register() returns None, the entry-point module raises.
# tests/harness/test_harness_options.py runs both.
SPECIAL_ENTRY_POINTS = {"broken_absent": f"{PACKAGE}:register_absent",
                        "broken_import": f"{PACKAGE}.import_error:register"}


@dataclasses.dataclass(frozen=True)
class Fault:
    """What the harness must report for a broken fixture: a result of `family` with `outcome` (a results-file
    outcome: FAIL, ERROR, CRASH, TIMEOUT) whose message (end to end: or case) contains one of `fragments`.

    Where it is checked (at least one): `in_process` runs every check of `family` on the fixture's kernels in
    the test process, at `level` and in `dtype` (tests/meta/test_checks_in_process.py); `end_to_end` is the
    pytest selection of a `pytest --platform=broken_<fixture>` run, for what needs a process (a crash, a hang,
    the worker's error path, torch.compile in a fresh interpreter; tests/harness/test_harness_fixtures.py);
    `checked_by` names the tests that check more than this record says.
    """

    family: str
    outcome: str
    fragments: tuple[str, ...]
    also_passes: bool = False      # in process: some result of `family` still passes (the fault is narrow)
    dtype: str = "float32"
    level: str = "quick"
    in_process: bool = True
    end_to_end: tuple[str, ...] | None = None
    clean_too: bool = False        # end to end: some result of the run still passes
    eager_correct: bool = False    # end to end: every numerics result passes (only the checked contract breaks)
    hint: tuple[str, ...] = ()     # in process: the cause hint over the family's results contains each of these
    checked_by: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Control:
    """A fixture that looks suspicious but keeps the contract: every check of `family` must pass it, at `level`
    in each of `dtypes`. `checked_by` names the tests that check it."""

    family: str
    checked_by: tuple[str, ...]
    dtypes: tuple[str, ...] = ("float32",)
    level: str = "quick"


_KINDS = {"Fault": Fault, "Control": Control}


def _record(path: Path) -> Fault | Control | None:
    for node in ast.parse(path.read_text(), str(path)).body:
        if (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["EXPECTED"]
                and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) in _KINDS):
            if node.value.args:
                raise ValueError(f"{path.name}: EXPECTED takes keyword arguments only")
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.value.keywords}
            return _KINDS[node.value.func.id](**kwargs)
    return None


@functools.cache
def fixtures() -> dict[str, Fault | Control]:
    """{fixture name: its record}, from the modules of this package that declare `EXPECTED`."""
    here = Path(__file__).resolve().parent
    found = {}
    for path in sorted(here.glob("*.py")):
        if path.stem not in ("__init__", "records") and (record := _record(path)) is not None:
            found[path.stem] = record
    return found


def faults() -> dict[str, Fault]:
    return {name: r for name, r in fixtures().items() if isinstance(r, Fault)}


def controls() -> dict[str, Control]:
    return {name: r for name, r in fixtures().items() if isinstance(r, Control)}


def entry_points() -> dict[str, dict[str, str]]:
    """The distribution's entry points: `broken_<fixture>` for every fixture, and the special ones."""
    names = {f"broken_{name}": f"{PACKAGE}:register_{name}" for name in fixtures()}
    return {GROUP: {**names, **SPECIAL_ENTRY_POINTS}}
