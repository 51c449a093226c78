"""The pytest plugin behind `pytest --platform=NAME`: all harness policy lives in these hooks.

Inert without `--platform`. With it: activates the platform (one clear line and exit 4 when that
fails), collects the shipped `suites/` when no paths are given, parametrises the suite bodies over
the catalog, runs each check in the kernel worker (a provider that hung or crashed twice is not run
again, see conformance.run.poison), records one result per test, carries results from xdist workers to
the controller, writes the results file incrementally with a `run` block that says what it covers,
and ends with the scorecard and the verdict (non-zero exit when NOT_CONFORMANT). Exit codes:
conformance.exit_codes.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import NoReturn

import pytest

from conformance.collect import environment
from conformance.collect.units import DEFAULT_SEED, LEVELS, Unit, repro_command
from conformance.exit_codes import ExitCode
from conformance.exit_codes import one_line as exit_codes_line
from conformance.results.messages import sanitize
from conformance.results.result import CheckResult, Outcome, ResultsFile, RunInfo, gated, verdict
from conformance import shm_files
from conformance import scratch_dirs
from conformance.run import collection_plan, options
from conformance.run.options import MAX_TIMEOUT_S
from conformance.run.run_dir import WORKERINPUT_KEY, ZYGOTE_KEY, RunDir
from conformance.run.zygote import ZYGOTE_ENV, die_with_parent
from conformance.run.scope import (configuration_notes, gate_description, is_empty_parameter_set, selection_of,
                                   unit_of, unused_baseline_notes, unused_waiver_notes)

RESULT_PROPERTY = "conformance_result"
SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"
_STATE = pytest.StashKey["ConformanceRun"]()
_RESULT = pytest.StashKey[CheckResult]()
DEFAULT_TIMEOUT_S = 120.0
CONTROLLER_KEY = "conformance_controller_pid"   # workerinput: the xdist controller's pid, which its workers die with


class QualityWarning(UserWarning):
    """A check passed within tolerance but graded clearly worse than native (QUALITY_WARNING)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "platform conformance harness")
    group.addoption("--platform", default=None, metavar="NAME",
                    help="run the conformance suites against this platform (built-in name or platform-plugin "
                         "entry-point name). " + exit_codes_line())
    group.addoption("--conformance-json", default=None, metavar="PATH",
                    help="write the machine-readable results file (docs/results-file.md), updated while running")
    # seed, level and timeout are checked by conformance.run.options (one line, exit 4), not by argparse types
    group.addoption("--conformance-seed", default=DEFAULT_SEED, metavar="N",
                    help=f"seed of every generated input and hypothesis draw, an integer (default {DEFAULT_SEED})")
    group.addoption("--conformance-level", default="standard", metavar="|".join(LEVELS),
                    help="how many cases per op: quick, standard (default) or full")
    group.addoption("--conformance-timeout", default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                    help=f"per-check time limit, 0 < SECONDS <= {MAX_TIMEOUT_S:g}; a check over it is TIMEOUT "
                         f"(default {DEFAULT_TIMEOUT_S:g})")
    group.addoption("--conformance-waivers", default=None, metavar="PATH",
                    help="expected-failures manifest (TOML or JSON): covered failures are XFAIL, covered passes XPASS")
    group.addoption("--conformance-baseline", default=None, metavar="PATH",
                    help="earlier results file: a PASS that became anything else fails the run as a regression")
    group.addoption("--conformance-allow-xpass", action="store_true", default=False,
                    help="do not fail the run on XPASS (stale waivers); by default the gate is strict")
    group.addoption("--conformance-gate-upstream", action="store_true", default=False,
                    help="let failures of upstream code (vLLM's own kernels and layers under a vLLM plugin, the "
                         "reference's under a plugin written against it) fail the run too; by default they are "
                         "reported apart and only the code of the distribution under test is gated")
    group.addoption("--conformance-shard", default=None, metavar="I/N",
                    help="run only shard I of N (deterministic, balanced by expected cost; combines with -n); "
                         "join the shards' results files with `python -m conformance merge`")


class ConformanceRun:
    """Per-process state of one conformance run."""

    def __init__(self, config: pytest.Config):
        from conformance.gate.waivers import WaiverFileError, load_baseline, load_waivers
        from conformance.run.poison import PoisonBook

        self.config = config
        self.name = config.getoption("platform")
        try:
            self.seed = options.seed(config.getoption("conformance_seed"))
            self.level = options.level(config.getoption("conformance_level"))
            self.timeout = options.timeout(config.getoption("conformance_timeout"))
            self.waivers_path = options.input_file("--conformance-waivers", config.getoption("conformance_waivers"))
            self.baseline_path = options.input_file("--conformance-baseline",
                                                    config.getoption("conformance_baseline"))
            json_path = options.output_file("--conformance-json", config.getoption("conformance_json"))
        except options.OptionError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.strict_xpass = not config.getoption("conformance_allow_xpass")
        self.gate_upstream = bool(config.getoption("conformance_gate_upstream"))
        self.attribution = None        # whose code each result graded (conformance.collect.origin), controller only
        self.other_failures = 0        # failed pytest reports other than upstream results the gate leaves out
        workerinput = getattr(config, "workerinput", None)
        self.is_xdist_worker = workerinput is not None
        controller = (workerinput or {}).get(CONTROLLER_KEY)
        if controller is not None and os.getppid() == controller:   # a local xdist worker (not one over ssh)
            die_with_parent(controller)   # a killed controller leaves no xdist worker (nor, so, its kernel worker)
        shared = (workerinput or {}).get(WORKERINPUT_KEY)
        self.run_dir = RunDir(shared) if shared else RunDir.create()
        self.started = time.time()
        if not self.is_xdist_worker:    # what killed runs left in /dev/shm would fail this one's shared memory
            shm_files.remove_orphans()
            shm_files.remove_unused(None)
            scratch_dirs.remove_orphans()    # and their directories in the temporary directory
        # an xdist worker collects from the controller's plan: it never imports torch or the platform
        self.plan = self.run_dir.read_json(collection_plan.PLAN_FILE) if self.is_xdist_worker else None
        self.plan_written = False
        self.worker = None
        self.zygote = None   # the controller's, when xdist workers will start kernel workers (conformance.run.zygote)
        # where this process's kernel workers fork from: an xdist worker's, the controller's zygote; a single
        # process's, a zygote its caller keeps warm across runs (ZYGOTE_ENV), if any; else they start from scratch
        self.zygote_path = (workerinput.get(ZYGOTE_KEY) if workerinput is not None
                            else os.environ.get(ZYGOTE_ENV) or None)
        if not self.is_xdist_worker and not config.option.collectonly:
            self._start_kernel_processes(_xdist_workers(config))
        self.inventory = None
        self.tolerance_changes: list[str] = []
        try:
            if self.plan is None:
                self._activate()
            self.waivers = load_waivers(self.waivers_path) if self.waivers_path else []
            self.baseline = load_baseline(self.baseline_path, self.name) if self.baseline_path else None
        except WaiverFileError as exc:
            self._usage_error(str(exc))
        # the vLLM release under test (None without vLLM): a baseline of another release says so in each regression
        self.vllm_release = (environment.bridged_versions(self.inventory.platform).get("vllm")
                             if self.inventory is not None else None)
        self.defaults = ([tuple(pair) for pair in self.plan["defaults"]] if self.plan is not None
                         else collection_plan.default_pairs(self.inventory))
        self.poison = PoisonBook(self.run_dir)
        self.run_info = RunInfo(self.level, self.seed, selection_of(config, SUITES_DIR),
                                gate_upstream=self.gate_upstream)
        self.complete = False
        self.deselected_units = 0
        from conformance.run.shard import install

        self.shard = install(config, config.getoption("conformance_shard"))
        if self.shard:
            self.run_info.selection.shard = str(self.shard)
            self.run_info.selection.partial = True
        self.results: list[CheckResult] = []
        self.regressions: list[str] = []
        self.results_file = None
        if json_path and not self.is_xdist_worker:
            env = environment.collect(self.seed, self.name, self.inventory.platform)
            try:   # the first write: a path that cannot be written stops the run before any check
                self.results_file = ResultsFile(json_path, self.inventory.platform_info(), env, run=self.run_info)
            except OSError as exc:
                self._usage_error(f"--conformance-json={json_path}: cannot write it ({exc.strerror or exc})")
        if self.plan is not None and any(self.plan["units"].values()) and not config.option.collectonly:
            # an xdist worker starts its kernel worker now: its start-up (about 4.5 s) overlaps with this process's
            # collection and xdist's scheduling; the first check waits for it
            self._kernel_worker().start()

    def _start_kernel_processes(self, xdist_workers: int) -> None:
        """Before this process imports torch and the platform, so that the 4.5 s start-up of what runs the checks
        overlaps with that: under xdist the zygote the workers' kernel workers fork from (conformance.run.zygote),
        in a single process its own kernel worker (the first check waits for it)."""
        if xdist_workers > 1:
            from conformance.run.worker import worker_environment
            from conformance.run.zygote import Zygote

            env = worker_environment(os.environ, xdist_workers)
            try:
                self.zygote = Zygote.start(self.run_dir.path, env) if Zygote.can_fork_workers(env) else None
            except OSError:   # e.g. a TMPDIR too long for a socket path: the kernel workers start from scratch
                self.zygote = None
        elif xdist_workers == 0:
            self._kernel_worker().start()

    def _activate(self) -> None:
        """Import the catalog and activate the platform (torch, the vendor's plugin); a failure is one usage line."""
        from conformance.collect import tolerance_changes
        from conformance.collect.inventory import PlatformSetupError, activate, import_catalog

        try:
            import_catalog()
            declared = tolerance_changes.snapshot()   # the reference's tolerances, before the platform is imported
            self.inventory = activate(self.name)
        except PlatformSetupError as exc:
            self._usage_error(str(exc))
        from conformance.collect.origin import attribution

        self.attribution = attribution(self.inventory)
        self.tolerance_changes = tolerance_changes.changes(declared)

    def _usage_error(self, message: str) -> NoReturn:
        """Stop the run before any check with one usage line (exit 4), leaving no run directory behind."""
        self.close()
        self.run_dir.remove()
        raise pytest.UsageError(message) from None

    # ----- running one unit ------------------------------------------------------------------
    def execute(self, unit: Unit, nodeid: str) -> CheckResult:
        from conformance.gate.waivers import apply_waivers

        poisoned = self.poison.check(unit, self.defaults)
        if poisoned is not None:
            reply = {"outcome": poisoned[0].value, "message": poisoned[1], "duration_s": 0.0}
        else:
            reply = self._run_in_worker(unit)
            self.poison.record(unit, Outcome(reply["outcome"]))
        result = CheckResult(nodeid=nodeid, family=unit.family, op=unit.op, provider=unit.provider, dtype=unit.dtype,
                             case=unit.case, outcome=Outcome(reply["outcome"]), message=sanitize(reply.get("message")),
                             max_abs_err=reply.get("max_abs_err"), max_rel_err=reply.get("max_rel_err"),
                             err_to_tol=reply.get("err_to_tol"), origin=reply.get("origin"),
                             repro=repro_command(self.name, unit, self.seed, self.level, reply.get("draw")),
                             duration_s=round(float(reply.get("duration_s") or 0.0), 6))
        if result.outcome is not Outcome.PASS and not result.message:
            result.message = f"{result.outcome.value} without further detail"
        return apply_waivers(result, self.waivers)

    def _kernel_worker(self):
        if self.worker is None:
            from conformance.run.worker import KernelWorker

            self.worker = KernelWorker(self.name, self.seed, self.level, zygote=self.zygote_path,
                                       directory=self.run_dir.path)   # its files go when the run directory goes
        return self.worker

    def _run_in_worker(self, unit: Unit) -> dict:
        try:
            return self._kernel_worker().run(unit, self.timeout)
        except Exception as exc:  # noqa: BLE001 - the worker could not start: every check is an ERROR
            return {"outcome": Outcome.ERROR.value, "message": str(exc), "duration_s": 0.0}

    # ----- collecting results (controller or single process) ------------------------------------
    def add(self, result: CheckResult) -> None:
        from conformance.gate.waivers import regression

        if result.origin is None and self.attribution is not None:
            origin = self.attribution.of_result(result.op, result.provider, result.family)
            result.origin = origin.to_json() if origin is not None else None
        if self.vllm_release is not None:   # a defect of this vLLM release that a later one fixed says which
            from conformance.vllm.fixed_later import fixed_later_note

            note = fixed_later_note(self.vllm_release, result.family, result.op, result.outcome, result.message)
            result.message = (result.message or "") + note if note else result.message
        self.results.append(result)
        if self.baseline is not None and gated(result, self.gate_upstream):   # upstream code is gated only on request
            msg = regression(result, self.baseline, self.vllm_release)
            if msg:
                self.regressions.append(f"{result.nodeid}: {msg}")
        if self.results_file is not None:
            self.results_file.add(result)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Results arrive here from this process's tests and, under xdist, from every worker."""
        results = []
        if report.when == "call":
            for name, value in getattr(report, "user_properties", ()):
                if name == RESULT_PROPERTY:
                    results.append(CheckResult.from_json(value))
                    self.add(results[-1])
        if report.failed and not (results and all(not gated(r, self.gate_upstream) for r in results)):
            self.other_failures += 1

    # ----- what the run covers ----------------------------------------------------------------------
    def pytest_deselected(self, items) -> None:
        self.deselected_units += sum(1 for item in items if unit_of(item) is not None)

    @pytest.hookimpl(wrapper=True)
    def pytest_pycollect_makeitem(self, collector, name, obj):
        """A suite body with no units on this platform (no supported=False provider, no replaced layer, ...)
        would be pytest's empty-parameter-set skip: it is no check, so it is not collected at all, and
        pytest's `collected N items` counts exactly the checks, one result each."""
        made = yield
        if isinstance(made, list):
            return [item for item in made if not is_empty_parameter_set(item)]
        return made

    @pytest.hookimpl(wrapper=True)
    def pytest_collection_modifyitems(self, session, config, items):
        result = yield
        expected = sum(1 for item in items if unit_of(item) is not None)
        if self.is_xdist_worker:
            from conformance.run.shard import longest_first

            longest_first(items)   # every worker the same order: heavy checks first, spread by the controller
            self.run_dir.write_json(f"collection-{config.workerinput['workerid']}.json",
                                    {"expected": expected, "deselected": self.deselected_units})
        else:
            self.set_collection(expected, self.deselected_units)
        return result

    def set_collection(self, expected: int, deselected: int) -> None:
        self.run_info.expected_results = expected
        self.run_info.selection.partial = self.run_info.selection.partial or deselected > 0
        if self.results_file is not None:
            self.results_file.write(final=False)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """xdist controller, before each worker starts: every worker shares this run's directory and collects from
        the plan written there (conformance.run.collection_plan), once, before the first worker."""
        if not self.plan_written:
            self.run_dir.write_json(collection_plan.PLAN_FILE, collection_plan.build(self.inventory, self.level))
            self.plan_written = True
        node.workerinput[WORKERINPUT_KEY] = self.run_dir.path
        node.workerinput[CONTROLLER_KEY] = os.getpid()
        if self.zygote is not None:
            node.workerinput[ZYGOTE_KEY] = self.zygote.path

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        record = self.run_dir.read_json(f"collection-{node.workerinput['workerid']}.json")
        if record is not None:   # every worker collects the same items: the first one sets the count
            self.set_collection(int(record["expected"]), int(record["deselected"]))

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """pytest's log capture attaches its handler to every non-propagating logger (torch has about 56), three
        times per test: 4 s of a cpu run. The checks run in the kernel worker, whose output goes to its own log, so
        this process has nothing to capture and a conformance run switches the capture off."""
        capture = session.config.pluginmanager.get_plugin("logging-plugin")
        if capture is not None:
            session.config.pluginmanager.unregister(capture)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        """Before the first check (and before xdist hands any out): build the C++ kernels here, on the terminal."""
        from conformance.run.prebuild import prebuild_reference_kernels

        if self.is_xdist_worker or session.config.option.collectonly:
            return
        if not session.items and not session.config.pluginmanager.has_plugin("dsession"):
            return   # nothing selected (and no xdist workers, which collect for themselves)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        say = reporter.write_line if reporter is not None else (lambda line: print(line, file=sys.stderr))
        prebuild_reference_kernels(self.inventory, say)

    def verdict(self) -> str:
        return (verdict(self.results, strict_xpass=self.strict_xpass, gate_upstream=self.gate_upstream)
                if self.complete else "NOT_CONFORMANT")

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None

    def abandon(self) -> None:
        """End the run now (on SIGTERM): kill its kernel worker, remove the run directory (the workers' files are in
        it), then kill the zygote; the zygote's workers and xdist's die with it and with this process. The directory
        goes first: an xdist worker that saw its kernel worker die would write a crash record and a new worker's files
        into it while it is being removed, not into a directory that is gone."""
        if self.worker is not None:
            self.worker.kill()
            self.worker = None
        for _ in range(3):   # a file written while it was removed leaves it behind: once more
            self.run_dir.remove()
            if not (self.run_dir.owner and os.path.isdir(self.run_dir.path)):
                break
        if self.zygote is not None:
            self.zygote.kill()
            self.zygote = None


_PREVIOUS_SIGTERM = []   # the disposition `_end_on_sigterm` replaced, restored at unconfigure


def _end_on_sigterm(state: ConformanceRun) -> None:
    """On SIGTERM (what `timeout` and a cancelled CI job send), kill the run's processes and remove its files, then
    end by SIGTERM as before. Only in the main thread, and only where nobody else has set a handler. (SIGKILL needs
    nothing here: every process of the run dies with its parent, conformance.run.zygote.die_with_parent.)"""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return

    def handler(signum, frame) -> None:
        try:
            state.abandon()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    _PREVIOUS_SIGTERM.append(signal.signal(signal.SIGTERM, handler))


def _restore_sigterm() -> None:
    while _PREVIOUS_SIGTERM:
        signal.signal(signal.SIGTERM, _PREVIOUS_SIGTERM.pop())


def _xdist_workers(config: pytest.Config) -> int:
    """How many xdist workers this run starts (0 without xdist); xdist has resolved `-n auto` by configure."""
    if getattr(config.option, "dist", "no") == "no":
        return 0
    return len(getattr(config.option, "tx", None) or [])


def _state(config: pytest.Config) -> ConformanceRun | None:
    return config.stash.get(_STATE, None)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance(family, check): a conformance suite body (set by suites/)")
    if not config.getoption("platform", None):
        return
    from conformance.run.tool_state import redirect_tool_state

    redirect_tool_state(config.option)  # no .hypothesis/ or .benchmarks/ in the vendor's directory
    # hypothesis's pytest plugin serves @given tests, which a conformance run has none of (its property draws
    # run in the kernel worker); its terminal summary imports hypothesis: 1.3 s at the end of every process
    config.pluginmanager.unregister(name="hypothesispytest")
    if getattr(config.option, "maxschedchunk", False) is None:   # xdist's controller, not set by the user
        from conformance.run.shard import SCHED_CHUNK

        config.option.maxschedchunk = SCHED_CHUNK
    state = ConformanceRun(config)
    config.stash[_STATE] = state
    if not state.is_xdist_worker:
        _end_on_sigterm(state)
    config.pluginmanager.register(state, "conformance-run")
    if not config.option.file_or_dir:
        config.args = [str(SUITES_DIR)]


def pytest_unconfigure(config: pytest.Config) -> None:
    state = _state(config)
    if state is not None:
        state.close()
        state.run_dir.remove()
        if not state.is_xdist_worker:   # what this run's killed rank groups and engines left in /dev/shm
            shm_files.remove_orphans()
            shm_files.remove_unused(state.started)
        _restore_sigterm()


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    state = _state(config)
    if state is None or state.inventory is None:   # an xdist worker: its header is never shown, the controller's is
        return None
    from conformance.run.attributed import header_lines

    inv = state.inventory
    fallback = inv.native_fallback_ops()
    return [
        f"conformance: platform {inv.name} = {inv.platform_class} (device type {inv.platform.device_type}, "
        f"dtypes {', '.join(str(d).removeprefix('torch.') for d in inv.platform.supported_dtypes)})",
        *header_lines(inv, state.attribution),
        f"conformance: native fallback ({len(fallback)} ops): {', '.join(fallback) or 'none'}",
        f"conformance: default priorities: {inv.defaults or '{}'}",
        f"conformance: seed {state.seed}, level {state.level}, per-check timeout {state.timeout:g} s",
        *getattr(inv.platform, "conformance_header", list)(),   # what a bridged platform translates
        gate_description(state),
        *(f"conformance: WARNING: {note}" for note in configuration_notes(state)),
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
    if state.plan is not None:
        units = collection_plan.units_of(state.plan, family, check)
    else:
        from conformance.checks import units as catalog_units

        units = catalog_units(state.inventory, family, check, state.level)
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
    if state is None:
        return
    state.close()   # in an xdist worker too: before it reports back and may be torn down
    if state.is_xdist_worker:
        return
    finished = session.exitstatus in (ExitCode.OK, ExitCode.FAILED) and not session.shouldstop
    state.complete = finished and len(state.results) == state.run_info.expected_results
    from conformance.judge.hints import annotate

    annotate(state.results)   # each failure's cause hint, in the results file and the FAIL message
    if state.results_file is not None:
        state.results_file.run.unmatched_waivers = unused_waiver_notes(state)
        state.results_file.reencode()
        state.results_file.write(final=True, strict_xpass=state.strict_xpass, finished=finished)
    failing = state.verdict() != "CONFORMANT" or state.regressions
    if failing and session.exitstatus == ExitCode.OK:
        session.exitstatus = ExitCode.FAILED
    elif not failing and session.exitstatus == ExitCode.FAILED and state.complete and state.other_failures == 0:
        session.exitstatus = ExitCode.OK   # every failed test graded upstream code the gate leaves out


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    state = _state(config)
    if state is None or state.is_xdist_worker:
        return
    from conformance.report.scorecard import render_scorecard
    from conformance.run.attributed import layer_note

    inv = state.inventory
    terminalreporter.write_sep("=", "conformance scorecard")
    run = state.run_info.to_json(len(state.results), state.complete)
    terminalreporter.write_line(render_scorecard(
        state.results, platform=f"{inv.name} ({inv.platform_class}" + (f", vLLM {state.vllm_release})"
                                                                      if state.vllm_release else ")"), ir_ops=[op.name for op in inv.ir_ops()],
        layer_note=layer_note(inv, state.attribution), strict_xpass=state.strict_xpass,
        regressions=state.regressions, run=run,
        notes=configuration_notes(state) + unused_waiver_notes(state) + unused_baseline_notes(state),
        gate_upstream=state.gate_upstream))
    if state.results_file is not None:
        terminalreporter.write_line(f"results file: {os.path.relpath(state.results_file.path)}")
