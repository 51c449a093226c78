"""One rank of the collective family's process group: `python -m conformance.checks.collective.ranks ADDRESS RANK
WORLD INIT_FILE CALL_TIMEOUT`, started by the group runner (group.py), never by hand.

It joins torch.distributed (gloo, every collective's timeout CALL_TIMEOUT seconds, so a rank left waiting on a hung
peer raises instead of waiting for ever), builds the platform's communicator per group name as vLLM's
`GroupCoordinator` builds it (a device group on the platform's backend, a gloo cpu group, `unique_name`, the device,
`use_all2all`; the class a job names, so one group serves several classes), and runs the jobs the runner sends:
each call on its own inputs, compared on this rank against the float64 reference of every rank's inputs
(reference.py). Per call it reports `("call", job, i, finding)` (None: right)
or `("raised", job, i, text)` and then waits to be told whether the group goes on (every rank raised alike) or stops.
It dies with its parent (PR_SET_PDEATHSIG) and when the runner's connection closes.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback


def _die_with_parent() -> None:
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the closed connection still ends the rank
        pass


def resolve(qualname: str):
    """The object a `module.attr` (or `module:attr`) qualname names."""
    module, sep, attr = qualname.partition(":")
    if not sep:
        module, _, attr = qualname.rpartition(".")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Rank:
    def __init__(self, conn, rank: int, world: int, recipe: dict, call_timeout: float):
        import torch

        self.conn = conn
        self.rank = rank
        self.world = world
        self.recipe = recipe
        self.call_timeout = call_timeout
        self.comms: dict[tuple, object] = {}
        self.fresh = 0
        self.generation = 0
        self.ident = os.environ.get("VLLM_DIST_IDENT", "conformance")
        device = recipe["device"]
        self.device = torch.device(device if device == "cpu" or ":" in device else f"{device}:{rank}")

    # ----- communicators ----------------------------------------------------------------------
    def build(self, cls_name: str, unique_name: str, use_all2all: bool):
        import datetime

        import torch.distributed as dist

        cls = resolve(cls_name)
        ranks = list(range(self.world))
        timeout = datetime.timedelta(seconds=self.call_timeout)
        device_group = dist.new_group(ranks, backend=self.recipe["backend"], timeout=timeout)
        cpu_group = dist.new_group(ranks, backend="gloo", timeout=timeout)
        return cls(cpu_group=cpu_group, device=self.device, device_group=device_group, unique_name=unique_name,
                   use_all2all=use_all2all)

    def communicator(self, cls_name: str, group: str, use_all2all: bool):
        key = (cls_name, group, use_all2all)
        if key not in self.comms:
            self.comms[key] = self.build(cls_name, group, use_all2all)
        return self.comms[key]

    def drop(self, cls_name: str, group: str, use_all2all: bool) -> None:
        """Forget the communicator of `group`; the next one gets a new shared-memory group name (VLLM_DIST_IDENT),
        the same on every rank, since the old one's may still be held."""
        self.comms.pop((cls_name, group, use_all2all), None)
        self.generation += 1
        os.environ["VLLM_DIST_IDENT"] = f"{self.ident}-g{self.generation}"

    # ----- jobs --------------------------------------------------------------------------------
    def report_raise(self, job: int, index: int, exc: BaseException) -> bool:
        """Tell the runner; True when it says the group goes on."""
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno} {frames[-1].name}" if frames else "?"
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        line = line.split("  (Could this error message be improved?")[0]    # torch's own postscript
        self.conn.send(("raised", job, index, {"type": type(exc).__name__, "line": line[:300], "where": where,
                                               "traceback": "".join(traceback.format_exception(exc))[-3000:]}))
        answer = self.conn.recv()
        return answer == "continue"

    def run_job(self, job: int, spec: dict) -> None:
        from conformance.checks.collective import run_call

        mode = spec["mode"]
        try:
            if spec["calls"] and spec["calls"][0]["method"] == "destroy":
                self.fresh += 1
                prefix = spec["group"].split(":")[0]
                comm = self.build(spec["cls"], f"{prefix}:{self.fresh}", spec["use_all2all"])
            else:
                comm = self.communicator(spec["cls"], spec["group"], spec["use_all2all"])
        except Exception as exc:  # noqa: BLE001 - the constructor's raise is the result
            self.report_raise(job, -1, exc)
            self.conn.send(("end", job))
            return
        self.conn.send(("call", job, -1, None))
        held: dict = {}
        for call in spec["calls"]:
            try:
                finding = run_call.run(comm, call, self.rank, self.world, spec, self.device, held)
            except run_call.CallRaised as raised:
                if not self.report_raise(job, call["index"], raised.exc):
                    self.conn.send(("end", job))
                    return
                continue
            self.conn.send(("call", job, call["index"], finding))
        self.conn.send(("end", job))


def main(argv: list[str]) -> int:
    from multiprocessing.connection import Client

    address, rank, world, init_file, call_timeout = argv[0], int(argv[1]), int(argv[2]), argv[3], float(argv[4])
    _die_with_parent()
    conn = Client("\0" + address, family="AF_UNIX", authkey=bytes.fromhex(os.environ["CONFORMANCE_COLLECTIVE_KEY"]))
    try:
        recipe = conn.recv()
        if recipe.get("setup"):
            recipe.update(resolve(recipe["setup"])(rank, world, recipe) or {})
        import datetime

        import torch.distributed as dist

        # the world only rendezvouses (its ranks start at different speeds); the communicators' groups carry the
        # per-call timeout
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=300))
        me = Rank(conn, rank, world, recipe, float(call_timeout))
    except Exception:  # noqa: BLE001 - the runner reports it
        conn.send(("setup_failed", rank, traceback.format_exc()[-3000:]))
        return 1
    conn.send(("ready", rank, {"cls": recipe.get("cls"), "device": str(me.device)}))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return 0
        if msg[0] == "exit":
            return 0
        if msg[0] == "job":
            me.run_job(msg[1], msg[2])
        elif msg[0] == "drop":   # the group's ranks disagreed on a call: its communicator is built afresh next time
            me.drop(msg[1], msg[2], msg[3])
            conn.send(("dropped",))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
