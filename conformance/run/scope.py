"""What one conformance run covers and applies: its selection, its result-producing items, its gates.

Helpers of the pytest plugin: `selection_of` reads -k/-m/paths into the results file's selection,
`unit_of` tells the items that produce a result, and the header lines name the waivers, the
baseline and any allowlist surprise, so no misconfiguration passes silently.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.collect.units import Unit
from conformance.results.result import Outcome, Selection


def selection_of(config: pytest.Config, suites_dir: Path) -> Selection:
    """The narrowing options of this pytest run (deselection is added once collection is done)."""
    keyword = config.getoption("keyword", "") or None
    markexpr = config.getoption("markexpr", "") or None
    paths = [str(a) for a in (config.option.file_or_dir or [])]
    invocation = Path(config.invocation_params.dir)
    narrowing = [p for p in paths if (invocation / p.split("::")[0]).resolve() != suites_dir or "::" in p]
    return Selection(partial=bool(keyword or markexpr or narrowing), keyword=keyword, markexpr=markexpr,
                     paths=paths)


def unit_of(item) -> Unit | None:
    """The unit a suite item checks (it then writes exactly one result), else None."""
    callspec = getattr(item, "callspec", None)
    unit = callspec.params.get("conformance_unit") if callspec is not None else None
    return unit if isinstance(unit, Unit) else None


def is_empty_parameter_set(item) -> bool:
    """A suite body's placeholder item for an empty unit list (pytest would count it as a skip)."""
    callspec = getattr(item, "callspec", None)
    return (callspec is not None and "conformance_unit" in callspec.params and unit_of(item) is None
            and item.get_closest_marker("conformance") is not None and item.get_closest_marker("skip") is not None)


def configuration_notes(state) -> list[str]:
    """Warnings about the configuration that must never pass silently (allowlist misses and bypasses, tolerances
    the platform changed for its own run)."""
    from reference_impl.platforms.builtin import BUILTIN_PLATFORM_CLASSES
    from reference_impl.plugins import allowlist_bypass_message, unknown_allowlist_message

    notes = [m for m in (unknown_allowlist_message(), allowlist_bypass_message(state.name, BUILTIN_PLATFORM_CLASSES))
             if m]
    return notes + [f"platform {state.name} changed a declared tolerance, and is judged against its own: {line}"
                    for line in getattr(state, "tolerance_changes", ())]


def gate_description(state) -> str:
    """The header line naming the waivers and the baseline this run applies."""
    from conformance.gate.comparable import release_change

    waivers = (f"{state.waivers_path} ({len(state.waivers)} waivers)" if state.waivers_path else "none")
    baseline = "none"
    if state.baseline is not None:
        passes = sum(1 for outcome in state.baseline.values() if outcome == Outcome.PASS.value)
        baseline = f"{state.baseline_path} ({len(state.baseline)} results, {passes} PASS guarded)"
        changed = release_change(getattr(state.baseline, "vllm", None), getattr(state, "vllm_release", None))
        if changed:
            baseline += (f"; made on another vLLM release ({changed}): a regression may be vLLM's change, "
                         "not the plugin's")
    return f"conformance: waivers {waivers}; baseline {baseline}"


def unused_waiver_notes(state) -> list[str]:
    """One line per waiver that did nothing in this run: it matched no result (stale, or outside the selection),
    or it covered only results that did not fail (conformance.gate.waivers.stale_waivers)."""
    from conformance.gate.waivers import stale_waivers

    return [f"waiver [{w.describe()}] ({w.reason}) in {state.waivers_path} {why}"
            for w, why in stale_waivers(state.waivers, state.results)]


def unused_baseline_notes(state) -> list[str]:
    """One line when a baseline was given yet none of this run's results has a counterpart in it: the gate
    guarded nothing (another level or selection, or providers renamed since)."""
    from conformance.gate.waivers import result_key

    if state.baseline is None or not state.results or any(result_key(r) in state.baseline for r in state.results):
        return []
    return [f"baseline {state.baseline_path} matched none of the {len(state.results)} results of this run: "
            "it guarded nothing"]
