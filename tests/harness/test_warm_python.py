"""tests/support/warm_python.py, the warm interpreter the tests' harness runs and their kernel workers fork from: a
run through it ends as a fresh interpreter's would (exit status, output, atexit handlers, directory, sys.path), a run
past its limit is killed, a request whose environment something imported ahead could have read otherwise starts from
scratch, and a harness run's kernel worker is forked from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import warm_python
from harness_runner import harness_env, kernel_worker_probe, run_harness

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and PR_SET_PDEATHSIG: Linux"),
              pytest.mark.skipif(os.environ.get(warm_python.WARM_ENV) == "0", reason="WARM_ENV=0: the template is off")]

_MODULE = """
import sys
warm = "torch" in sys.modules   # imported ahead: forked from the template
import atexit, json, os, tempfile
atexit.register(lambda: open(os.environ["CONFORMANCE_TEST_DONE_FILE"], "w").write("atexit ran"))
print("to stdout")
print("to stderr", file=sys.stderr)
json.dump({"cwd": os.getcwd(), "path": sys.path[:2], "argv": sys.argv[1:], "tmp": tempfile.gettempdir(),
           "warm": warm}, open(os.environ["CONFORMANCE_TEST_SEEN_FILE"], "w"))
sys.exit(int(sys.argv[1]))
"""


def _module(tmp_path: Path, source: str = _MODULE) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    (root / "warm_probe.py").write_text(textwrap.dedent(source))
    return root


def test_fresh_sys_path_swaps_the_pythonpath_entries_and_puts_the_directory_first():
    current = ["/script/dir", "/old/a", "/old/b", "/usr/lib/python311.zip", "/venv/site-packages"]
    assert warm_python.fresh_sys_path(current, "/old/a:/old/b", "/new/x", "/work") == [
        "/work", "/new/x", "/usr/lib/python311.zip", "/venv/site-packages"]
    assert warm_python.fresh_sys_path(current[:1] + current[3:], "", "", "/work") == [
        "/work", "/usr/lib/python311.zip", "/venv/site-packages"]


def test_only_what_nothing_imported_ahead_reads_may_differ(tmp_path):
    template = {"PATH": "/bin", "TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONPATH": ""}
    assert warm_python.cold_reason(dict(template), template) is None
    same_but = {**template, "CONFORMANCE_X": "1", "REFERENCE_IMPL_PLUGINS": "a", "VLLM_PLUGINS": "b", "TMPDIR": "/t"}
    assert warm_python.cold_reason(same_but, template) is None
    controller = {k: v for k, v in template.items() if k != "TORCHINDUCTOR_COMPILE_THREADS"}
    assert warm_python.cold_reason(controller, template) is None   # a controller lacks the worker's settings
    assert warm_python.cold_reason({**template, "TORCH_LOGS": "+dynamo"}, template) == \
        "TORCH_LOGS is '+dynamo', None in the template"
    assert warm_python.cold_reason({**template, "TORCHINDUCTOR_COMPILE_THREADS": "4"}, template) == \
        "TORCHINDUCTOR_COMPILE_THREADS is '4', '1' in the template"
    backend = tmp_path / "backend"
    info = backend / "acme_backend-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nacme = acme_backend:load\n")
    assert warm_python.cold_reason({**template, "PYTHONPATH": str(backend)}, template) == \
        f"{backend} brings a torch.backends entry point"


@pytest.fixture
def own_template(monkeypatch):
    """Templates of this test's own, importing under this process's environment of the moment (the process's
    templates started under earlier tests' environments)."""
    monkeypatch.setattr(warm_python, "_templates", {})
    yield
    for template in warm_python._templates.values():
        template.stop()


@pytest.mark.parametrize("extra, warm", [({}, True), ({"WARM_PROBE_ELSEWHERE": "1"}, False)], ids=["warm", "cold"])
def test_a_run_ends_as_a_fresh_interpreter_would(tmp_path, own_template, extra, warm):
    """Forked warm, or (a variable the template cannot vouch for) exec'd from scratch: the same ending either way."""
    root = _module(tmp_path)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = harness_env(root, CONFORMANCE_TEST_SEEN_FILE=str(tmp_path / "seen.json"),
                      CONFORMANCE_TEST_DONE_FILE=str(tmp_path / "done"), TMPDIR=str(scratch), **extra)
    proc = warm_python.run(["warm_probe", "3"], cwd, env, 120, template_env=harness_env())
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "to stdout\n", "to stderr\n")
    assert (tmp_path / "done").read_text() == "atexit ran"
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {"cwd": str(cwd), "path": [str(cwd), str(root)], "argv": ["3"], "tmp": str(scratch), "warm": warm}
    assert warm_python.run(["warm_probe", "0"], cwd, env, 120, template_env=harness_env()).returncode == 0


def test_a_run_under_another_environment_forks_from_a_template_of_its_own(tmp_path, own_template, monkeypatch):
    """A test process's environment changes as it runs (vLLM's import adds its LD_PRELOAD): a run under an environment
    no live template imported under gets a template of its own and forks warm from it; past KEEP templates the least
    recently used one ends."""
    monkeypatch.setattr(warm_python, "KEEP", 1)
    root = _module(tmp_path)
    seen = tmp_path / "seen.json"

    def run_under(value: str) -> warm_python._Template:
        extra = {"WARM_PROBE_ELSEWHERE": value}
        env = harness_env(root, CONFORMANCE_TEST_SEEN_FILE=str(seen), CONFORMANCE_TEST_DONE_FILE=str(tmp_path / "done"),
                          **extra)
        proc = warm_python.run(["warm_probe", "0"], tmp_path, env, 120, template_env=harness_env(**extra))
        assert proc.returncode == 0
        assert json.loads(seen.read_text())["warm"] is True
        return warm_python.template(harness_env(**extra))

    first = run_under("1")
    assert run_under("1") is first
    second = run_under("2")
    assert second is not first and second.proc.poll() is None
    assert first.proc.poll() is not None   # KEEP is 1: the other one ended
    assert list(warm_python._templates.values()) == [second]


def test_a_template_keeps_its_socket_and_log_in_the_sessions_temporary_directory(tmp_path_factory, monkeypatch):
    """Under the test session's base temporary directory (which pytest removes after a few later sessions), not in
    the system's for good; in the system's where a socket path under the session's would pass AF_UNIX's limit."""
    base = tmp_path_factory.getbasetemp()
    assert warm_python._base_dir == str(base)   # set for the session by tests/conftest.py
    made = Path(warm_python._template_directory())
    assert made.parent == base and made.name.startswith(warm_python.DIRECTORY_PREFIX)
    made.rmdir()
    deep = base / ("d" * (warm_python.SOCKET_PATH_LIMIT - len(str(base))))
    monkeypatch.setattr(warm_python, "_base_dir", str(deep))
    made = Path(warm_python._template_directory())
    assert made.parent == Path(tempfile.gettempdir())
    made.rmdir()


def test_a_run_past_its_limit_is_killed_and_raises_as_subprocess_does(tmp_path):
    """The limit counts from the request, and a template started for a request imports before it forks: under load
    that took longer than the 3 s limit (the run was killed before it printed), so a short run brings it up first."""
    root = _module(tmp_path, "import sys, time\nprint('started', flush=True)\ntime.sleep(float(sys.argv[1]))\n")
    assert warm_python.run(["warm_probe", "0"], tmp_path, harness_env(root), 120,
                           template_env=harness_env()).stdout == "started\n"
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        warm_python.run(["warm_probe", "120"], tmp_path, harness_env(root), 3, template_env=harness_env())
    assert caught.value.output == "started\n"


def test_a_harness_runs_kernel_worker_forks_from_the_template(tmp_path):
    """The run gets the template as its zygote (CONFORMANCE_ZYGOTE): its kernel worker is a ForkedProcess, a child
    of the template, in the run's directory."""
    probe, seen = kernel_worker_probe(tmp_path)
    run = run_harness(tmp_path, "demo", "-p", probe, "-k", "numerics and rms_norm and float32", dist="demo")
    assert run.returncode == 0, run.output[-2000:]
    parent = warm_python.template(harness_env()).proc.pid
    assert json.loads(seen.read_text()) == {"kind": "ForkedProcess", "parent": parent, "cwd": str(tmp_path)}
