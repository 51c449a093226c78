"""The process group runner: WORLD rank processes (ranks.py), started once per world size and kept for every unit
of the family that a kernel worker runs, each given the same job; the runner follows the job call by call with a time
limit per call, so that a collective hung on one rank is a TIMEOUT naming the rank and the call, a rank that dies is
a CRASH naming the call, and the run goes on with a fresh group.

Each rank's collectives carry torch.distributed's timeout of `call_timeout` seconds, and the runner waits
`call_timeout + grace` for every rank's report of a call: a rank whose peer hangs raises (gloo's timeout) and says
so, the hung rank says nothing, and is named. The group is torn down (its processes killed) after a TIMEOUT, a CRASH,
or a call on which some ranks raised and others did not (its ranks no longer agree on what comes next); a call on
which every rank raised alike (an argument check, vLLM 0.32's assert) leaves it usable.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time

from conformance import shm_files
from conformance import scratch_dirs

CALL_TIMEOUT_ENV = "CONFORMANCE_COLLECTIVE_CALL_TIMEOUT"
DEFAULT_CALL_TIMEOUT_S = 10.0
START_TIMEOUT_S = 150.0


def call_timeout() -> float:
    """The per-call time limit: $CONFORMANCE_COLLECTIVE_CALL_TIMEOUT seconds, else 10; a bad value is a clear error."""
    raw = os.environ.get(CALL_TIMEOUT_ENV)
    if raw is None or raw == "":
        return DEFAULT_CALL_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise ValueError(f"{CALL_TIMEOUT_ENV}={raw!r}: give a number of seconds greater than 0 and at most 3600 "
                         "(the collective family's per-call time limit)")
    return value


class GroupFailed(Exception):
    """The group could not start (a rank's setup raised, or it did not connect in time)."""


@dataclasses.dataclass
class JobResult:
    """What the ranks reported of one job: per call index (-1: building the communicator) each rank's finding
    (None: right) or raise; and how the job ended."""

    findings: dict[int, dict[int, str | None]] = dataclasses.field(default_factory=dict)
    raises: dict[int, dict[int, dict]] = dataclasses.field(default_factory=dict)
    ended: str = "done"        # done, timeout, crash, split (some ranks raised, others did not)
    at: int | None = None      # the call index the job stopped at
    silent: list[int] = dataclasses.field(default_factory=list)     # ranks that did not report `at` in time
    died: dict[int, str] = dataclasses.field(default_factory=dict)  # rank -> how it died, and its last output
    others: dict[int, str] = dataclasses.field(default_factory=dict)  # split: what the ranks that did not raise did


def _signal_name(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


class RankGroup:
    """`world` rank processes building the communicator `recipe` names ({"cls", "setup", "device", "backend"})."""

    def __init__(self, world: int, recipe: dict, timeout: float):
        self.world = world
        self.recipe = dict(recipe)
        self.timeout = timeout
        self.grace = max(5.0, timeout / 2)
        self.dir = scratch_dirs.new_directory("collective")
        self.procs: list[subprocess.Popen] = []
        self.conns: list = []
        self.jobs = 0
        self.info: dict = {}
        self._start()

    def _start(self) -> None:
        from multiprocessing.connection import Listener

        key = secrets.token_bytes(16)
        # an abstract socket (Linux): no file, so no path-length limit wherever the temporary directory is
        address = f"conformance-collective-{os.getpid()}-{secrets.token_hex(8)}"
        listener = Listener("\0" + address, family="AF_UNIX", authkey=key)
        env = dict(os.environ, CONFORMANCE_COLLECTIVE_KEY=key.hex())
        env.setdefault("VLLM_DIST_IDENT", shm_files.new_ident())
        self.ident = env["VLLM_DIST_IDENT"]     # vLLM's shared-memory files of the group carry it: removed at close
        init_file = os.path.join(self.dir, "init")
        accepted: list = []

        def accept():
            try:
                for _ in range(self.world):
                    accepted.append(listener.accept())
            except Exception:  # noqa: BLE001 - the listener closed: a rank did not come
                pass

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        for rank in range(self.world):
            log = open(os.path.join(self.dir, f"rank{rank}.log"), "wb")
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "conformance.checks.collective.ranks", address, str(rank), str(self.world),
                 init_file, str(self.timeout)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir))
            log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while thread.is_alive() and time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            thread.join(0.1)
        listener.close()
        thread.join(1.0)
        if len(accepted) < self.world:
            dead = [f"rank {r} ended with {_signal_name(p.returncode)}: {self.log_tail(r)}"
                    for r, p in enumerate(self.procs) if p.poll() is not None]
            self.close()
            raise GroupFailed(f"the process group of world size {self.world} did not start: "
                              + ("; ".join(dead) if dead
                                 else f"its ranks did not connect within {START_TIMEOUT_S:g} s"))
        # the ranks connect in any order: each says its rank first
        by_rank: dict[int, object] = {}
        for conn in accepted:
            conn.send(dict(self.recipe))
        for conn in accepted:
            if not conn.poll(START_TIMEOUT_S):
                self.close()
                raise GroupFailed(f"a rank of world size {self.world} connected but never said it was ready")
            msg = conn.recv()
            if msg[0] == "setup_failed":
                self.conns = accepted
                self.close()
                raise GroupFailed(f"rank {msg[1]} could not join the process group: {msg[2].strip()}")
            by_rank[msg[1]] = conn
            self.info = msg[2]
        self.conns = [by_rank[r] for r in range(self.world)]

    def log_tail(self, rank: int, lines: int = 6) -> str:
        try:
            with open(os.path.join(self.dir, f"rank{rank}.log"), "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        kept = [ln for ln in text.strip().splitlines() if ln.strip()][-lines:]
        return " | ".join(kept)

    def alive(self) -> bool:
        return bool(self.conns) and all(p.poll() is None for p in self.procs)

    def run(self, spec: dict) -> JobResult:
        """Send `spec` to every rank and follow it call by call (see the module docstring)."""
        from multiprocessing.connection import wait

        self.jobs += 1
        job = self.jobs
        result = JobResult()
        for conn in self.conns:
            conn.send(("job", job, spec))
        indices = [-1] + [c["index"] for c in spec["calls"]]
        ended = [False] * self.world
        for at in indices:
            reported: dict[int, tuple] = {}
            # building the communicator imports its module and rendezvouses its groups: a minute at least
            limit = self.timeout + self.grace if at >= 0 else max(60.0, self.timeout + self.grace)
            deadline = time.monotonic() + limit
            while len(reported) < self.world:
                waiting = [self.conns[r] for r in range(self.world) if r not in reported and not ended[r]]
                if not waiting:
                    break
                left = deadline - time.monotonic()
                ready = wait(waiting, timeout=max(0.0, left)) if left > 0 else []
                if not ready:
                    result.ended, result.at = "timeout", at
                    result.silent = [r for r in range(self.world) if r not in reported]
                    result.others = {r: "returned" for r, msg in reported.items() if msg[0] == "call"}
                    self._note_raises(result, at, reported)
                    self.close()
                    return result
                for conn in ready:
                    rank = self.conns.index(conn)
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError):
                        proc = self.procs[rank]
                        try:
                            proc.wait(3.0)
                        except subprocess.TimeoutExpired:
                            pass
                        result.died[rank] = f"{_signal_name(proc.returncode)}; its last output: " \
                                            f"{self.log_tail(rank) or '(none)'}"
                        result.ended, result.at = "crash", at
                        self._note_raises(result, at, reported)
                        self.close()
                        return result
                    if msg[0] == "end":
                        ended[rank] = True
                        continue
                    reported[rank] = msg
            self._note_raises(result, at, reported)
            raised = [r for r, msg in reported.items() if msg[0] == "raised"]
            result.findings[at] = {r: msg[3] for r, msg in reported.items() if msg[0] == "call"}
            if raised:
                kinds = {(reported[r][3]["type"], reported[r][3]["line"]) for r in raised}
                if len(raised) == self.world and len(kinds) == 1:   # every rank raised alike: the group agrees
                    for conn in self.conns:
                        conn.send("continue")
                    if at == -1:
                        break
                else:
                    result.ended, result.at = "split", at
                    result.others = {r: ("returned" if msg[0] == "call" else "") for r, msg in reported.items()
                                     if r not in raised}
                    self._recover(job, spec, set(raised), ended)
                    return result
        # every rank's "end"
        deadline = time.monotonic() + self.timeout + self.grace
        while not all(ended):
            waiting = [self.conns[r] for r in range(self.world) if not ended[r]]
            ready = wait(waiting, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                self.close()
                break
            for conn in ready:
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    ended[self.conns.index(conn)] = True
                    continue
                if msg[0] == "end":
                    ended[self.conns.index(conn)] = True
        return result

    def _recover(self, job: int, spec: dict, waiting: set[int], ended: list[bool]) -> None:
        """After a call on which the ranks disagreed: wait until every rank either waits for the runner's word (it
        raised, its peers' collective timed out at the latest) or ended the job; then stop the job and have every
        rank drop the group's communicator (the next unit builds it afresh). A rank that says nothing within the
        time limit is stuck: the group is torn down."""
        from multiprocessing.connection import wait

        deadline = time.monotonic() + self.timeout + self.grace
        while len(waiting) + sum(ended) < self.world:
            others = [self.conns[r] for r in range(self.world) if r not in waiting and not ended[r]]
            ready = wait(others, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                self.close()
                return
            for conn in ready:
                rank = self.conns.index(conn)
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    self.close()
                    return
                if msg[0] == "raised":
                    waiting.add(rank)
                elif msg[0] == "end":
                    ended[rank] = True
        try:
            for r in waiting:
                self.conns[r].send("stop")
            for r in waiting:
                if not self.conns[r].poll(self.timeout + self.grace) or self.conns[r].recv()[0] != "end":
                    raise OSError("no end")
            for conn in self.conns:
                conn.send(("drop", spec["cls"], spec["group"], spec["use_all2all"]))
            for conn in self.conns:
                if not conn.poll(self.timeout + self.grace) or conn.recv()[0] != "dropped":
                    raise OSError("not dropped")
        except (EOFError, OSError):
            self.close()

    @staticmethod
    def _note_raises(result: JobResult, at: int, reported: dict) -> None:
        raised = {r: msg[3] for r, msg in reported.items() if msg[0] == "raised"}
        if raised:
            result.raises[at] = raised

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("exit",))
            except Exception:  # noqa: BLE001 - a dead rank
                pass
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                pass
        for conn in self.conns:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass
        self.conns = []
        shutil.rmtree(self.dir, ignore_errors=True)
        if getattr(self, "ident", None):    # killed ranks never remove vLLM's shared-memory files: 8 MB each
            shm_files.remove_ident(self.ident)


_GROUPS: dict[tuple, RankGroup] = {}


def group_for(world: int, recipe: dict) -> RankGroup:
    """The kept group of `world` ranks for `recipe`, started on first use and again after it was torn down."""
    timeout = call_timeout()
    key = (world, tuple(sorted((k, v) for k, v in recipe.items() if k != "cls")), timeout)   # a job names the class
    group = _GROUPS.get(key)
    if group is None or not group.alive():
        if group is not None:
            group.close()
        _GROUPS.pop(key, None)
        group = RankGroup(world, recipe, timeout)
        _GROUPS[key] = group
    return group


def close_all() -> None:
    for group in list(_GROUPS.values()):
        group.close()
    _GROUPS.clear()


atexit.register(close_all)
