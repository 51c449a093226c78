"""The kernel workers' zygote: one process of a distributed run that imports torch, Dynamo and the checks once,
then forks each kernel worker on request.

A kernel worker started from scratch spends about 4.5 s of CPU on imports (torch 2.2 s, Dynamo 1.8 s) before it
activates the platform. Under `-n N` every xdist worker starts one, and starts another after each CRASH or
TIMEOUT. The controller starts this process first (`Zygote.start`), and its import overlaps with the
controller's own. Each xdist worker then asks it for a kernel worker (`fork_worker`). The forked child activates
the platform itself, after the fork, so a vendor runtime that starts threads or opens a device does so in the
child, never in the zygote. The zygote runs nothing but imports: it never opens a thread pool that a fork would
break.

Protocol on the zygote's Unix socket, one connection per kernel worker: the client sends one length-prefixed
JSON request (the worker's argv, environment and working directory) with three descriptors attached (the worker's
stdin, stdout and stderr). The zygote answers `pid N` once it has forked, and `exit RC` when the child ends (RC as
Popen's returncode: negative for a signal), then closes the connection. A client that finds no zygote launches its
worker the usual way (conformance.run.worker). A run without xdist starts no zygote, but forks its kernel workers
from one its caller names (ZYGOTE_ENV), if any.

Lifetime (Linux): the zygote dies with the controller that started it, and each forked worker with the zygote
(PR_SET_PDEATHSIG, `die_with_parent`); a worker whose client closes the connection (the xdist worker that asked
for it ended, however it was killed) is killed with its process group. A killed run leaves no worker behind.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any, NoReturn

SOCKET_NAME = "zygote.sock"
# a single-process run's kernel workers fork from the zygote at this socket, one its caller keeps warm across runs
# (the project's test suite does, tests/support/warm_python.py): it must answer this protocol and give each worker
# the environment and working directory the request asks for, with the sys.path and imports a fresh interpreter
# would have under them
ZYGOTE_ENV = "CONFORMANCE_ZYGOTE"
# the pid of the process that started this one, for `die_with_parent` (set by the starter: the zygote's controller,
# a kernel worker's pytest process)
PARENT_ENV = "CONFORMANCE_PARENT_PID"
_HEADER = struct.Struct("!I")
_REAP_INTERVAL_S = 0.05   # how soon a child's exit reaches its client while children run
_PR_SET_PDEATHSIG = 1


# ----- lifetime: a process of the run never outlives the one that started it -------------------------------------
def die_with_parent(parent: int | None, sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send `sig` to this process when its parent ends (PR_SET_PDEATHSIG), and exit at once when
    `parent` is already gone (it died before the request took effect); whether the request took. The signal
    follows the parent *thread* that started this process: start such a process only from a thread that outlives
    it (a run's main thread; a caller that waits for it). Does nothing off Linux, or when `parent` is None."""
    if parent is None or not sys.platform.startswith("linux"):
        return False
    try:
        if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):   # no prctl in this libc
        return False
    if os.getppid() != parent:   # reparented already: nobody will read what this process would do
        os._exit(1)
    return True


def parent_from_environment() -> int | None:
    """The starter's pid from PARENT_ENV, removed from this process's environment (its own children have another
    parent); None when not set."""
    value = os.environ.pop(PARENT_ENV, "")
    return int(value) if value.isdigit() else None


# ----- the zygote process -------------------------------------------------------------------------
def preload() -> None:
    """What every kernel worker imports before it activates a platform (conformance.run.worker.serve)."""
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401

    from conformance.checks import registry

    registry()


def serve(listener: socket.socket, imports=preload, become=None) -> NoReturn:
    """Fork on requests to `listener` (bound by the controller, so clients can connect before these imports are
    done, and wait), report exits; end when stdin (a pipe from the controller) closes. `imports` and `become` (what
    a forked child does with its request, returning its exit status: `_become_worker`) let another process of the
    caller's speak this protocol (tests/support/warm_python.py, which ZYGOTE_ENV hands to runs)."""
    try:
        imports()
    except Exception:  # noqa: BLE001 - each forked worker imports what is missing and reports the failure itself
        import traceback

        traceback.print_exc()
    # the imports live as long as every worker: the collector skips them, and does not write to (and so copy)
    # the pages the forked workers share with this process
    gc.freeze()
    children: dict[int, socket.socket] = {}
    abandoned: set[int] = set()   # children killed because their client went away, not reaped yet
    stdin = sys.stdin.fileno()
    while True:
        clients = {conn: pid for pid, conn in children.items() if pid not in abandoned}
        readable, _, _ = select.select([listener, stdin, *clients], [], [], _REAP_INTERVAL_S if children else None)
        _reap(children, abandoned)
        if stdin in readable and not os.read(stdin, 4096):
            break   # the controller is done (or gone)
        for conn in readable:
            if conn in clients and clients[conn] in children:
                _check_client(conn, clients[conn], abandoned)
        if listener in readable:
            conn, _ = listener.accept()
            _fork_child(listener, conn, children, become or _become_worker)
    listener.close()
    deadline = time.monotonic() + 5.0   # the clients close their workers before the controller ends
    while children and time.monotonic() < deadline:
        time.sleep(_REAP_INTERVAL_S)
        _reap(children)
    sys.stderr.flush()
    os._exit(0)   # skips tearing torch down (about 1 s, and libraries' leak reports about frozen objects)


def _check_client(conn: socket.socket, pid: int, abandoned: set[int]) -> None:
    """A client connection turned readable: the client never sends after its request, so this is its end (it closed
    the connection or died, SIGKILL included). Its worker has nobody to answer to: kill its process group."""
    try:
        data = conn.recv(4096)
    except OSError:
        data = b""
    if data:
        return
    abandoned.add(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):   # not its own group yet (before its setsid), or already gone
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _reap(children: dict[int, socket.socket], abandoned: set[int] | None = None) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if abandoned is not None:
            abandoned.discard(pid)
        conn = children.pop(pid, None)
        if conn is not None:
            rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            try:
                conn.sendall(f"exit {rc}\n".encode())
            except OSError:
                pass
            conn.close()


def _receive_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack(data[:_HEADER.size])[0]:
        more = conn.recv(1 << 16)
        if not more:
            raise EOFError("the client closed the connection mid-request")
        data += more
    (n,) = _HEADER.unpack(data[:_HEADER.size])
    return json.loads(data[_HEADER.size:_HEADER.size + n]), list(fds)


def _fork_child(listener: socket.socket, conn: socket.socket, children: dict[int, socket.socket], become) -> None:
    try:
        request, fds = _receive_request(conn)
    except (OSError, EOFError, ValueError):
        conn.close()
        return
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    zygote = os.getpid()
    pid = os.fork()
    if pid == 0:   # the kernel worker: never returns into the zygote's loop
        code = 1
        try:
            die_with_parent(zygote)
            listener.close()
            for other in children.values():
                other.close()
            conn.close()
            code = become(request, fds)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - printed to the worker's log, which its client reads
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(f"pid {pid}\n".encode())
    except OSError:   # the client gave up before the fork: nobody will read this worker
        os.kill(pid, signal.SIGKILL)
    children[pid] = conn


def take_request(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: its own session (the client kills it by process group), the client's descriptors as
    fds 0-2, the signal dispositions a fresh interpreter has, the client's environment and working directory."""
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.pop(PARENT_ENV, None)   # its client's pid: this process follows the zygote, its parent, since the fork
    os.chdir(request.get("cwd", os.getcwd()))   # the client's, as a worker started from scratch would have


def _become_worker(request: dict[str, Any], fds: list[int]) -> int:
    """In the forked child: the request taken (`take_request`), its `python -m` command run."""
    take_request(request, fds)
    import runpy

    module, *args = request["argv"]   # run as `python -m module args` runs it
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m conformance.run.zygote LISTENING_SOCKET_FD", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the controller ends it by closing stdin
    die_with_parent(parent_from_environment())     # or by dying, however it is killed
    return serve(socket.socket(fileno=int(args[0])))


# ----- the controller: owning the zygote ----------------------------------------------------------
class Zygote:
    """The zygote process of one run; `path` is its socket, which the xdist workers receive."""

    def __init__(self, proc: subprocess.Popen, path: str):
        self.proc, self.path = proc, path

    @staticmethod
    def can_fork_workers(env: dict[str, str]) -> bool:
        """False when `import torch` would load an installed device-backend extension (entry-point group
        `torch.backends`, unless TORCH_DEVICE_BACKEND_AUTOLOAD=0): such an extension may open its device as it is
        imported, in the zygote, and a device runtime does not survive a fork. Its workers start from scratch."""
        import importlib.metadata

        if env.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "1":
            return True
        return not importlib.metadata.entry_points(group="torch.backends")

    @classmethod
    def start(cls, run_dir: str, env: dict[str, str]) -> Zygote:
        """Launch it without waiting: clients that connect before its imports are done wait in the listen queue.
        The socket is `run_dir/zygote.sock`; its path must fit AF_UNIX's limit (about 100 bytes)."""
        path = os.path.join(run_dir, SOCKET_NAME)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener, \
                open(os.path.join(run_dir, "zygote.log"), "wb") as log:   # what it printed, should it fail
            listener.bind(path)   # here: a client that connects at once finds it listening
            listener.listen(64)
            fd = listener.fileno()
            proc = subprocess.Popen([sys.executable, "-m", "conformance.run.zygote", str(fd)], stdin=subprocess.PIPE,
                                    stdout=log, stderr=log, env={**env, PARENT_ENV: str(os.getpid())},
                                    start_new_session=True, pass_fds=[fd])
        return cls(proc, path)

    def close(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """End it now; the workers it forked die with it (die_with_parent)."""
        self.proc.kill()
        self.proc.wait()


# ----- the client: a kernel worker forked by the zygote --------------------------------------------
class ForkedProcess:
    """A kernel worker forked by the zygote, with the part of subprocess.Popen's interface KernelWorker uses.
    Its pid and exit status come over the zygote connection, and nothing here waits for the pid: the zygote forks
    only once its imports are done (or never, if it hangs), and launching or killing must not wait on that."""

    def __init__(self, conn: socket.socket, stdin, stdout):
        self._conn = conn
        self._buffer = b""
        self._pid: int | None = None
        self.returncode: int | None = None
        self._lost = False   # the zygote went away without saying how the worker ended
        self.stdin, self.stdout = stdin, stdout

    @property
    def pid(self) -> int | None:
        """The worker's pid, None while the zygote has not forked it (or went away before it did)."""
        self._read(0)
        return self._pid

    def _read(self, timeout: float | None) -> None:
        """Read what the zygote sent within `timeout` s (None: until one more line or the end)."""
        if self._lost or self.returncode is not None:
            return
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return
        try:
            chunk = self._conn.recv(4096)
        except OSError:
            chunk = b""
        if not chunk:
            self._lost = True
            self._conn.close()
            return
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            word, _, value = line.decode().partition(" ")
            if word == "pid":
                self._pid = int(value)
            elif word == "exit":
                self.returncode = int(value)
                self._conn.close()

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None and not self._lost:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired("kernel worker", timeout)
            self._read(remaining)
        return self.returncode

    def kill(self) -> None:
        """Kill the worker's process group; one not forked yet is abandoned instead: the connection closes, and the
        zygote kills the child whose pid it then cannot hand over (which would also read EOF on its stdin)."""
        if self.returncode is not None or self._lost:
            return
        pid = self.pid
        if pid is None:
            self._lost = True
            self._conn.close()
            return
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def fork_worker(path: str, argv: list[str], env: dict[str, str], stderr_fd: int,
                cwd: str | None = None) -> ForkedProcess:
    """Ask the zygote at `path` for a process running `python -m <argv>` (argv[0] the module) with this environment,
    stderr and working directory (this process's when None); OSError when there is no zygote."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        child_stdin, parent_stdin = os.pipe()
        parent_stdout, child_stdout = os.pipe()
        try:
            data = json.dumps({"argv": argv, "env": env, "cwd": cwd or os.getcwd()}).encode()
            message = _HEADER.pack(len(data)) + data
            sent = socket.send_fds(conn, [message], [child_stdin, child_stdout, stderr_fd])
            conn.sendall(message[sent:])
        except OSError:
            for fd in (parent_stdin, parent_stdout):
                os.close(fd)
            raise
        finally:
            os.close(child_stdin)
            os.close(child_stdout)
    except OSError:
        conn.close()
        raise
    return ForkedProcess(conn, os.fdopen(parent_stdin, "wb"), os.fdopen(parent_stdout, "rb"))


if __name__ == "__main__":
    sys.exit(main())
