"""Shared by every folder of tests/: the helper modules' place on sys.path, and the fixtures more than one
test module uses.

The helpers (`tests/support/`: `harness_runner`, `_hf_checkpoints`, `_compile_support`, ...) are imported
by bare name (`from harness_runner import run_harness`) from whichever folder a test module sits in;
putting their folder on sys.path here, before pytest imports any test module, is what makes that work.
A process spawned by `multiprocessing` inherits this sys.path, so the gloo ranks can import them too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))


# Folders of the slowest tests (engines, vLLM bridge runs, harness runs and rank worlds: 10 to 45 s each), run first.
# pytest-xdist hands tests out in collection order, and in alphabetical order vLLM's bridge came last: its tests
# then ran on one worker while the other had nothing left. Longest first leaves the short ones to even out the end
# (with work stealing, below: a worker steals from the end of another's queue).
SLOW_FOLDERS_FIRST = ("vllm_bridge", "engine", "harness", "collective")


@pytest.fixture(scope="session", autouse=True)
def _warm_templates_in_the_session_tmp(tmp_path_factory):
    """The warm-python templates' sockets and logs go under this session's base temporary directory, which pytest
    removes after a few later sessions, not into the system's temporary directory for good."""
    import warm_python

    warm_python.keep_templates_under(tmp_path_factory.getbasetemp())


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """`-n N` without `--dist`: work stealing, not xdist's default `load`. `load` gives each worker a quarter of its
    share of the tests, in collection order, up front, and one worker's first chunk was then every slow folder
    (614 tests, 850 s on a 2-core machine) while the other ran the remaining 4,303 in 550 s and then sat idle for
    five minutes. `worksteal` splits the tests in halves and lets a worker that runs out take half of what another
    has left. An explicit `--dist` is left as it is."""
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", "no") == "no":
        config.option.dist = "worksteal"


def pytest_collection_modifyitems(config, items):
    """Run the slow folders' tests first (SLOW_FOLDERS_FIRST), each folder's tests in their collected order."""
    def rank(item) -> int:
        try:
            folder = Path(item.path).relative_to(TESTS).parts[0]
        except ValueError:   # a test outside tests/ (a path given on the command line)
            return len(SLOW_FOLDERS_FIRST)
        return SLOW_FOLDERS_FIRST.index(folder) if folder in SLOW_FOLDERS_FIRST else len(SLOW_FOLDERS_FIRST)

    items.sort(key=rank)   # stable: modules stay together, so module fixtures are built once per worker


@pytest.fixture
def inductor_env(monkeypatch, tmp_path):
    """The compile-pipeline tests' platform (no kernel defaults), their test providers registered, no grad,
    Dynamo reset, and a private, empty inductor cache: those tests read what the post-grad passes decided,
    which a graph served from the cache (an earlier run's) does not record (post_grad_cached)."""
    import torch
    from _compile_support import CompileTestPlatform, providers
    from reference_impl.platforms import activate_platform

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    with activate_platform(CompileTestPlatform()), providers(), torch.no_grad():
        yield


def pytest_terminal_summary(terminalreporter):
    """Say it loudly when tests were skipped for want of vLLM: without `bash scripts/setup.sh --vllm` the bridge and
    engine tests (a large part of what CI runs) are skipped, and a short 'N skipped' would hide that."""
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if "vLLM is not installed" in str(getattr(r, "longrepr", ""))]
    if skipped:
        terminalreporter.write_line(
            f"{len(skipped)} tests skipped because vLLM is not installed here: the full test run needs "
            "`bash scripts/setup.sh --vllm` (README, Set-up)", yellow=True, bold=True)
