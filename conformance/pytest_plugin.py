"""The pytest plugin behind `pytest --platform=NAME`: all harness policy lives in these hooks.

Inert without `--platform`. With it: activates the platform (one clear line and a non-zero exit
when that fails), collects the shipped `suites/` when no paths are given, parametrises the suite
bodies over the catalog, runs each check in the kernel worker, records one result per test,
carries results from xdist workers to the controller, writes the results file incrementally, and
ends with the scorecard and the verdict (non-zero exit when NOT_CONFORMANT).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from conformance.results import CheckResult, Outcome, ResultsFile, environment, verdict
from conformance.units import DEFAULT_SEED, LEVELS, Unit, repro_command

RESULT_PROPERTY = "conformance_result"
SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"
_STATE = pytest.StashKey["ConformanceRun"]()
_RESULT = pytest.StashKey[CheckResult]()


class QualityWarning(UserWarning):
    """A check passed within tolerance but graded clearly worse than native (QUALITY_WARNING)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "platform conformance harness")
    group.addoption("--platform", default=None, metavar="NAME",
                    help="run the conformance suites against this platform (built-in name or platform-plugin "
                         "entry-point name)")
    group.addoption("--conformance-json", default=None, metavar="PATH",
                    help="write the machine-readable results file (docs/results-file.md), updated while running")
    group.addoption("--conformance-seed", type=int, default=DEFAULT_SEED, metavar="N",
                    help=f"seed of every generated input and hypothesis draw (default {DEFAULT_SEED})")
    group.addoption("--conformance-level", choices=LEVELS, default="standard",
                    help="how many cases per op: quick, standard (default) or full")
    group.addoption("--conformance-timeout", type=float, default=120.0, metavar="SECONDS",
                    help="per-check time limit; a check over it is TIMEOUT (default 120)")
    group.addoption("--conformance-waivers", default=None, metavar="PATH",
                    help="expected-failures manifest (TOML or JSON): covered failures are XFAIL, covered passes XPASS")
    group.addoption("--conformance-baseline", default=None, metavar="PATH",
                    help="earlier results file: a PASS that became anything else fails the run as a regression")
    group.addoption("--conformance-allow-xpass", action="store_true", default=False,
                    help="do not fail the run on XPASS (stale waivers); by default the gate is strict")


class ConformanceRun:
    """Per-process state of one conformance run."""

    def __init__(self, config: pytest.Config):
        from conformance.inventory import PlatformSetupError, activate
        from conformance.waivers import WaiverFileError, load_baseline, load_waivers

        self.config = config
        self.name = config.getoption("platform")
        self.seed = config.getoption("conformance_seed")
        self.level = config.getoption("conformance_level")
        self.timeout = config.getoption("conformance_timeout")
        self.strict_xpass = not config.getoption("conformance_allow_xpass")
        try:
            self.inventory = activate(self.name)
            waivers_path = config.getoption("conformance_waivers")
            self.waivers = load_waivers(waivers_path) if waivers_path else []
            baseline_path = config.getoption("conformance_baseline")
            self.baseline = load_baseline(baseline_path) if baseline_path else None
        except (PlatformSetupError, WaiverFileError) as exc:
            raise pytest.UsageError(str(exc)) from None
        self.is_xdist_worker = hasattr(config, "workerinput")
        self.results: list[CheckResult] = []
        self.regressions: list[str] = []
        self.worker = None
        self.results_file = None
        json_path = config.getoption("conformance_json")
        if json_path and not self.is_xdist_worker:
            self.results_file = ResultsFile(json_path, self.inventory.platform_info(), environment(self.seed))

    # ----- running one unit ------------------------------------------------------------------
    def execute(self, unit: Unit, nodeid: str) -> CheckResult:
        from conformance.waivers import apply_waivers

        if self.worker is None:
            from conformance.worker import KernelWorker

            self.worker = KernelWorker(self.name, self.seed, self.level)
        try:
            reply = self.worker.run(unit, self.timeout)
        except Exception as exc:  # noqa: BLE001 - the worker could not start: every check is an ERROR
            reply = {"outcome": Outcome.ERROR.value, "message": str(exc), "duration_s": 0.0}
        result = CheckResult(nodeid=nodeid, check=unit.family, op=unit.op, provider=unit.provider, dtype=unit.dtype,
                             case=unit.case, outcome=Outcome(reply["outcome"]), message=reply.get("message"),
                             max_abs_err=reply.get("max_abs_err"), max_rel_err=reply.get("max_rel_err"),
                             repro=repro_command(self.name, unit, self.seed, self.level),
                             duration_s=round(float(reply.get("duration_s") or 0.0), 6))
        if result.outcome is not Outcome.PASS and not result.message:
            result.message = f"{result.outcome.value} without further detail"
        return apply_waivers(result, self.waivers)

    # ----- collecting results (controller or single process) ------------------------------------
    def add(self, result: CheckResult) -> None:
        from conformance.waivers import regression

        self.results.append(result)
        if self.baseline is not None:
            msg = regression(result, self.baseline)
            if msg:
                self.regressions.append(f"{result.nodeid}: {msg}")
        if self.results_file is not None:
            self.results_file.add(result)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Results arrive here from this process's tests and, under xdist, from every worker."""
        if report.when != "call":
            return
        for name, value in getattr(report, "user_properties", ()):
            if name == RESULT_PROPERTY:
                self.add(CheckResult.from_json(value))

    def verdict(self) -> str:
        return verdict(self.results, strict_xpass=self.strict_xpass)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


def _state(config: pytest.Config) -> ConformanceRun | None:
    return config.stash.get(_STATE, None)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance(family, check): a conformance suite body (set by suites/)")
    if not config.getoption("platform", None):
        return
    from conformance.tool_state import redirect_tool_state

    redirect_tool_state(config.option)  # no .hypothesis/ or .benchmarks/ in the vendor's directory
    state = ConformanceRun(config)
    config.stash[_STATE] = state
    config.pluginmanager.register(state, "conformance-run")
    if not config.option.file_or_dir:
        config.args = [str(SUITES_DIR)]


def pytest_unconfigure(config: pytest.Config) -> None:
    state = _state(config)
    if state is not None:
        state.close()


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    state = _state(config)
    if state is None:
        return None
    inv = state.inventory
    providers = "; ".join(f"{op}: {', '.join(p)}" for op, p in inv.ir_providers.items()) or "none"
    oot = ", ".join(f"{k} -> {v.__module__}.{v.__qualname__}" for k, v in inv.oot.items()) or "none"
    fallback = inv.native_fallback_ops()
    return [
        f"conformance: platform {inv.name} = {inv.platform_class} (device type {inv.platform.device_type}, "
        f"dtypes {', '.join(str(d).removeprefix('torch.') for d in inv.platform.supported_dtypes)})",
        f"conformance: IR providers brought: {providers}",
        f"conformance: CustomOp replacements (register_oot): {oot}",
        f"conformance: native fallback ({len(fallback)} ops): {', '.join(fallback) or 'none'}",
        f"conformance: default priorities: {inv.defaults or '{}'}",
        f"conformance: seed {state.seed}, level {state.level}, per-check timeout {state.timeout:g} s",
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_unit" not in metafunc.fixturenames:
        return
    state = _state(metafunc.config)
    marker = metafunc.definition.get_closest_marker("conformance")
    if state is None or marker is None:
        metafunc.parametrize("conformance_unit", [pytest.param(None, marks=pytest.mark.skip(
            reason="conformance suites run only with --platform=NAME"))])
        return
    family, check = marker.args
    units = state.inventory.units(family, check, state.level)
    metafunc.parametrize("conformance_unit", units, ids=[u.id for u in units])


@pytest.fixture
def conformance_check(request: pytest.FixtureRequest):
    """Run one unit through the worker, record its result and end the test with the matching pytest outcome."""
    state = _state(request.config)

    def run(unit: Unit) -> CheckResult:
        result = state.execute(unit, request.node.nodeid)
        request.node.stash[_RESULT] = result
        _conclude(result)
        return result

    return run


def _conclude(result: CheckResult) -> None:
    outcome, message = result.outcome, result.message or ""
    if outcome is Outcome.PASS:
        return
    if outcome is Outcome.QUALITY_WARNING:
        warnings.warn(QualityWarning(message))
        return
    if outcome in (Outcome.NOT_IMPLEMENTED, Outcome.NOT_SUPPORTED, Outcome.SKIP):
        pytest.skip(f"{outcome.value}: {message}")
    if outcome is Outcome.XFAIL:
        pytest.xfail(message)
    pytest.fail(f"{outcome.value}: {message}\nrepro: {result.repro}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    result = item.stash.get(_RESULT, None)
    if result is not None and call.when == "call":
        report.user_properties.append((RESULT_PROPERTY, result.to_json()))
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = _state(session.config)
    if state is None or state.is_xdist_worker:
        return
    state.close()
    if state.results_file is not None:
        state.results_file.write(final=True, strict_xpass=state.strict_xpass)
    failing = state.verdict() != "CONFORMANT" or state.regressions
    if failing and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    from conformance.report import render_scorecard

    state = _state(config)
    if state is None or state.is_xdist_worker:
        return
    inv = state.inventory
    replaced = inv.replaced_layers()
    layers = inv.in_tree_layers()
    layer_note = (f"CustomOp layers replaced: {len(replaced)} / {len(layers)}"
                  + (f" ({', '.join(sorted(replaced))})" if replaced else ""))
    terminalreporter.write_sep("=", "conformance scorecard")
    terminalreporter.write_line(render_scorecard(
        state.results, platform=f"{inv.name} ({inv.platform_class})", ir_ops=[op.name for op in inv.ir_ops()],
        layer_note=layer_note, strict_xpass=state.strict_xpass, regressions=state.regressions))
    if state.results_file is not None:
        terminalreporter.write_line(f"results file: {os.path.relpath(state.results_file.path)}")
