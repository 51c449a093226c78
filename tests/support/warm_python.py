"""The tests' harness runs and their kernel workers, forked from a warm interpreter instead of started from scratch.

A fresh harness controller spends about 2 CPU-seconds importing torch, pytest and the harness before it reads its
arguments, and its kernel worker about 4.5 more (torch, Dynamo, the checks); the suite starts dozens of runs on a
2-core CI machine. `run` hands a run to a template process that has imported all of that once (started on first use;
one for each environment its imports could have read differently, at most KEEP of them per test process). The
template forks a child per run, which takes the run's working directory, environment, sys.path (built from PYTHONPATH
as a fresh interpreter builds it), argv and output files, runs `python -m <module>` and exits the way that
interpreter would (its atexit handlers run, its threads are joined). The run gets the
template's socket as its zygote (conformance.run.zygote.ZYGOTE_ENV), so its kernel workers fork from the template
the same way, through the harness's own zygote client; what else the run starts (ranks, vLLM's engine, compilers)
it starts itself.

A request is forked warm only when nothing imported ahead could have read its environment differently. Its variables
may differ from the template's only where what reads them reads them when used, or is not imported ahead
(MAY_DIFFER: PYTHONPATH, TMPDIR, TORCH_EXTENSIONS_DIR, pytest's and hypothesis's, the harness's, the reference's and
vLLM's own); it may leave out what the harness adds to a kernel worker's environment (the template imports under a
worker's settings, Inductor's compile threads and OpenMP's; a controller compiles and computes nothing); no root it
adds to sys.path may bring a torch device backend (entry-point group `torch.backends`, which `import torch` loads),
and none may be installed. The template starts any other request from scratch (fork, then exec) and says why in its
log, so every request gets the same answer. WARM_ENV=0 in a run's environment keeps `run` out of it; a test that
needs the process itself (its pid, its signals, its start-up) starts it with subprocess.

Run as a script, this file is the template: `python warm_python.py LISTENING_SOCKET_FD`. It is the harness's own
zygote server (conformance.run.zygote.serve, its protocol, lifetime and clean-up) with other imports and another
`become`, and `run` is that zygote's client (fork_worker): the template ends when the test process that started it
does (its stdin closes, or PR_SET_PDEATHSIG), and each child with the template.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

WARM_ENV = "WARM_ENV"
# variables a warm request may set differently from the template's: nothing imported ahead reads them at import
MAY_DIFFER = {"PYTHONPATH", "TMPDIR", "TORCH_EXTENSIONS_DIR", "PYTHONFAULTHANDLER", WARM_ENV,
              "HYPOTHESIS_STORAGE_DIRECTORY",   # set by the harness (tool_state); hypothesis is not imported ahead
              "PYTEST_VERSION", "PYTEST_CURRENT_TEST",   # set by pytest as it runs (the test's, the controller's)
              # Inductor's: its cache directory, read (and set where unset) when it first needs it, and a pointer it
              # sets in the process that loads a compiled module, just before the module reads it
              "TORCHINDUCTOR_CACHE_DIR", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"}
# AITER_: set by vLLM's import (in a test process that imported it) for AMD's AITER, which nothing here imports
MAY_DIFFER_PREFIXES = ("CONFORMANCE_", "REFERENCE_IMPL_", "REFERENCE_", "VLLM_", "AITER_")


# ----- what may fork warm ----------------------------------------------------------------------------------------
def may_differ(key: str) -> bool:
    """Whether a request's `key` may differ from its template's: nothing imported ahead reads it."""
    return key in MAY_DIFFER or key.startswith(MAY_DIFFER_PREFIXES)


def import_key(env: dict[str, str]) -> tuple:
    """What of `env` a template's imports may have read: templates that imported under the same key are alike."""
    return tuple(sorted((k, v) for k, v in env.items() if not may_differ(k)))


def cold_reason(env: dict[str, str], template_env: dict[str, str]) -> str | None:
    """Why a request with `env` may not fork from a template that imported under `template_env` (module docstring),
    None when it may."""
    worker_settings = _worker_settings()
    for key in sorted(set(env) | set(template_env)):
        ours, theirs = template_env.get(key), env.get(key)
        if ours == theirs or may_differ(key):
            continue
        if theirs is None and key in worker_settings:   # a controller, which compiles and computes nothing
            continue
        return f"{key} is {theirs!r}, {ours!r} in the template"
    template_roots = set(template_env.get("PYTHONPATH", "").split(os.pathsep))
    added = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in template_roots]
    backends = [root for root in added if _torch_backends([root])]
    return f"{backends[0]} brings a torch.backends entry point" if backends else None


def _worker_settings() -> set[str]:
    """The variables the harness gives a kernel worker beyond its controller's environment, which the template
    imports under (conformance.run.worker.worker_environment: Inductor's compile threads, the OpenMP threads)."""
    from conformance.run.worker import worker_environment

    return set(worker_environment({}, 2))


def _torch_backends(path: list[str] | None = None) -> bool:
    """Whether a distribution on `path` (sys.path when None) has a `torch.backends` entry point."""
    import importlib.metadata

    return any(ep.group == "torch.backends" for dist in importlib.metadata.distributions(path=path or sys.path)
               for ep in dist.entry_points)


def fresh_sys_path(current: list[str], old_pythonpath: str, new_pythonpath: str, cwd: str) -> list[str]:
    """sys.path of `python -m` started in `cwd` with PYTHONPATH=`new_pythonpath`, from this interpreter's `current`
    (its script's directory first, then its PYTHONPATH=`old_pythonpath` entries, then the installation's)."""
    old = {os.path.abspath(p) for p in old_pythonpath.split(os.pathsep) if p}
    installation = [p for p in current[1:] if os.path.abspath(p) not in old]
    return [cwd, *[os.path.abspath(p) for p in new_pythonpath.split(os.pathsep) if p], *installation]


# ----- the template ----------------------------------------------------------------------------------------------
_template_env: dict[str, str] = {}
_warm_allowed = False


def _imports() -> None:
    """What a harness controller and a kernel worker import before they act: the zygote's (torch, Dynamo, the
    checks), pytest and the harness's plugin; nothing that starts a thread or opens a device. Not pytest's plugins
    (xdist, hypothesis, ...): pytest rewrites their asserts as it loads them, and warns about one imported before.
    Nothing where an installed distribution brings a torch device backend."""
    global _template_env, _warm_allowed
    _template_env = dict(os.environ)
    _warm_allowed = not _torch_backends()
    if _warm_allowed:
        import pytest  # noqa: F401

        import conformance.pytest_plugin  # noqa: F401
        from conformance.collect import inventory  # noqa: F401
        from conformance.run import zygote

        zygote.preload()


def _become(request: dict, fds: list[int]) -> int:
    """In the forked child, never returning: the request taken (conformance.run.zygote.take_request); warm, its
    sys.path and argv, then `python -m` its module, ending as that interpreter would; else that command exec'd."""
    from conformance.run.zygote import take_request

    reason = cold_reason(request["env"], _template_env) if _warm_allowed else "torch.backends installed"
    if reason is not None:
        print(f"from scratch: {' '.join(request['argv'])[:200]}: {reason}", file=sys.stderr, flush=True)
    template_path = os.environ.get("PYTHONPATH", "")
    take_request(request, fds)
    module, *args = request["argv"]
    if reason is not None:
        os.execve(sys.executable, [sys.executable, "-m", module, *args], dict(os.environ))
    import runpy

    sys.path[:] = fresh_sys_path(sys.path, template_path, os.environ.get("PYTHONPATH", ""), os.getcwd())
    tempfile.tempdir = None   # gettempdir() reads TMPDIR again, as it would the first time
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_status(exc.code)
    except BaseException:  # noqa: BLE001 - printed and exit status 1, as the interpreter does
        import traceback

        traceback.print_exc()
        code = 1
    _exit_like_the_interpreter(code)


def _exit_status(code) -> int:
    """The exit status `raise SystemExit(code)` gives an interpreter (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _exit_like_the_interpreter(code: int) -> None:
    """What an interpreter does as it exits, but tearing the modules down: join the threads, run the atexit handlers,
    flush. Skipped: the teardown, whose garbage the template froze (gc.freeze) and which libraries then report as leaks
    (nanobind prints them)."""
    import atexit

    threading._shutdown()  # noqa: SLF001 - what the interpreter calls at exit: waits for non-daemon threads
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main(argv: list[str]) -> None:
    from conformance.run import zygote

    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a Ctrl-C is for the test process, which ends this one
    zygote.die_with_parent(zygote.parent_from_environment())
    zygote.serve(socket.socket(fileno=int(argv[0])), imports=_imports, become=_become)


# ----- the client ------------------------------------------------------------------------------------------------
# a template's directory: DIRECTORY_PREFIX and mkdtemp's 8 characters, holding its socket and its log
DIRECTORY_PREFIX, SOCKET_NAME, LOG_NAME = "warm-python-", "warm.sock", "template.log"


class _Template:
    """One template: its socket path, log and process."""

    def __init__(self, directory: str, env: dict[str, str]):
        from conformance.run.worker import worker_environment
        from conformance.run.zygote import PARENT_ENV

        self.path = os.path.join(directory, SOCKET_NAME)
        self.log = os.path.join(directory, LOG_NAME)
        # the environment a kernel worker of these runs gets (they inherit this test process's xdist worker count)
        env = worker_environment(env, int(env.get("PYTEST_XDIST_WORKER_COUNT") or 1))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener, \
                open(self.log, "wb") as log:
            listener.bind(self.path)
            listener.listen(16)
            fd = listener.fileno()
            self.proc = subprocess.Popen([sys.executable, __file__, str(fd)], env={**env, PARENT_ENV: str(os.getpid())},
                                         stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=[fd],
                                         start_new_session=True)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


# This test process's templates by import_key, the most recently used last. A test process's environment changes as it
# runs: importing vLLM adds its LD_PRELOAD and loader path for good, and a test may set a variable for its own runs.
# A run whose environment no live template imported under gets a template of its own rather than a start from scratch
# (a template's imports cost what one run's controller and worker do); the least recently used one beyond KEEP ends.
_templates: dict[tuple, _Template] = {}
KEEP = 2
# Where a template's directory (its socket and log) goes: the test session's base temporary directory
# (tests/conftest.py sets it), which pytest removes after a few later sessions as it does every test's tmp_path; the
# system's temporary directory where none is set or a socket path there would pass AF_UNIX's limit.
_base_dir: str | None = None
SOCKET_PATH_LIMIT = 100   # bytes; AF_UNIX's sun_path holds 108 on Linux


def keep_templates_under(directory: str | os.PathLike) -> None:
    """Templates started from now on keep their socket and log in a directory under `directory`."""
    global _base_dir
    _base_dir = os.fspath(directory)


def _template_directory() -> str:
    base = _base_dir
    socket_path = os.path.join(base or "", DIRECTORY_PREFIX + "12345678", SOCKET_NAME)
    if base is None or len(os.fsencode(socket_path)) > SOCKET_PATH_LIMIT:
        base = None
    return tempfile.mkdtemp(prefix=DIRECTORY_PREFIX, dir=base)


def template(template_env: dict[str, str]) -> _Template:
    """The live template that imported under `template_env` (by import_key), started now if there is none."""
    key = import_key(template_env)
    found = _templates.pop(key, None)
    if found is None or found.proc.poll() is not None:
        while len(_templates) >= KEEP:
            _templates.pop(next(iter(_templates))).stop()
        found = _Template(_template_directory(), template_env)
    _templates[key] = found
    return found


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float,
        template_env: dict[str, str]) -> subprocess.CompletedProcess | None:
    """`python -m argv...` in `cwd` with `env`, through this process's template that imported under `template_env`
    (started on first use), its kernel workers through it too: the completed process (stdout and stderr as text),
    subprocess.TimeoutExpired past `timeout` s (the run's process group killed), or None where WARM_ENV=0 or the
    template could not be reached (the caller starts the run itself)."""
    from conformance.run.zygote import ZYGOTE_ENV, fork_worker

    if env.get(WARM_ENV, "1") == "0" or not sys.platform.startswith("linux"):
        return None
    warm = template(template_env)
    with tempfile.TemporaryFile() as err:
        try:
            proc = fork_worker(warm.path, argv, {**env, ZYGOTE_ENV: warm.path}, err.fileno(), str(cwd))
        except OSError:
            return None
        proc.stdin.close()
        out: list[bytes] = []
        reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
        reader.start()
        timed_out = False
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            rc = proc.wait()
        reader.join()
        proc.stdout.close()
        err.seek(0)
        stdout, stderr = out[0].decode(errors="replace"), err.read().decode(errors="replace")
    cmd = [sys.executable, "-m", *argv]
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, output=stdout, stderr=stderr)
    if rc is None:
        raise RuntimeError(f"the warm-python template went away during a run (its log: {warm.log})")
    return subprocess.CompletedProcess(cmd, rc, stdout, stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
