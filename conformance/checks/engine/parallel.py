"""The engine family with tensor parallelism on a platform written against our own API: the reference runtime on
WORLD spawned ranks over gloo (`python -m conformance.checks.engine.parallel RANK WORLD INIT PLATFORM CHECKPOINT
DTYPE DEVICE OUT [ep]`), each rank activating the platform under test, building the unit's checkpoint with only its
shard of every tensor-parallel layer (reference_impl.distributed: the collectives go through the platform's device
communicator contract) and generating the family's requests; every rank writes its outputs, which the unit grades
(rank 0's against the float64 oracle; any rank that disagrees with rank 0 is named). With `ep` (expert parallelism,
as vLLM's enable_expert_parallel) the ranks also form the expert-parallel group (its communicator built as "ep:0")
and each MoE layer holds only its rank's experts; every rank says which.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


class RanksFailed(Exception):
    """A rank raised, died or did not finish; the message names it."""

    def __init__(self, message: str, crashed: bool | None = None):
        super().__init__(message)
        self.crashed = crashed


def run_ranks(platform_name: str, checkpoint: Path, dtype: str, device: str, world: int,
              timeout: float, expert_parallel: bool = False) -> list[dict]:
    """Every rank's {"block": its KV block size, "communicator": the class its TP group used, "outputs": {request
    id: output}} (rank order); with `expert_parallel` also "experts": the global ids of the experts its MoE layers
    hold."""
    from conformance import scratch_dirs

    with scratch_dirs.directory("engine-tp") as tmp:
        init = os.path.join(tmp, "init")
        procs = []
        for rank in range(world):
            log = open(os.path.join(tmp, f"rank{rank}.log"), "wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "conformance.checks.engine.parallel", str(rank), str(world), init,
                 platform_name, str(checkpoint), dtype, device, os.path.join(tmp, f"out{rank}.json")]
                + (["ep"] if expert_parallel else []),
                stdout=log, stderr=subprocess.STDOUT, cwd=tmp))
            log.close()
        deadline = time.monotonic() + timeout
        try:
            for rank, proc in enumerate(procs):
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    silent = [r for r, p in enumerate(procs) if p.poll() is None]
                    raise RanksFailed(f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))} of "
                                      f"{world} did not finish within {timeout:g} s", crashed=False) from None
            for rank, proc in enumerate(procs):
                if proc.returncode != 0:
                    tail = _tail(os.path.join(tmp, f"rank{rank}.log"))
                    code = proc.returncode
                    how = f"signal {-code}" if code < 0 else f"exit status {code}"
                    raise RanksFailed(f"rank {rank} of {world} ended with {how}: {tail}", crashed=code < 0)
            outs = []
            for rank in range(world):
                with open(os.path.join(tmp, f"out{rank}.json")) as f:
                    doc = json.load(f)
                doc["outputs"] = {int(k): v for k, v in doc["outputs"].items()}
                outs.append(doc)
            return outs
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def _tail(path: str, lines: int = 8) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join([ln for ln in text.strip().splitlines() if ln.strip()][-lines:])


def main(argv: list[str]) -> int:
    rank, world, init, platform_name, checkpoint, dtype_text, device, out = (
        int(argv[0]), int(argv[1]), argv[2], argv[3], Path(argv[4]), argv[5], argv[6], argv[7])
    expert_parallel = argv[8:] == ["ep"]
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)    # die with the unit's process
    except Exception:  # noqa: BLE001
        pass
    from conformance.checks.engine.runtime import build_for, family_requests, generate_waves
    from conformance.collect.inventory import activate
    from conformance.collect.units import dtype_from_name
    from reference_impl import distributed as d

    from conformance.checks.collective.ranks import resolve

    platform = activate(platform_name).platform
    communicator = resolve(platform.get_device_communicator_cls())
    d.init_distributed_environment(world, rank, f"file://{init}", "gloo")
    d.initialize_model_parallel(world, communicator_cls=communicator, enable_expert_parallel=expert_parallel)
    try:
        model = build_for(checkpoint, dtype_from_name(dtype_text), device)
        reqs = family_requests(model)
        outputs = generate_waves(model, reqs, device)
    finally:
        d.destroy_model_parallel()
        d.destroy_distributed_environment()
    doc = {"block": model.model.attention.block_size, "communicator": f"{communicator.__module__}."
           f"{communicator.__qualname__}", "outputs": {str(k): v for k, v in outputs.items()}}
    if expert_parallel:
        doc["experts"] = sorted({e for m in model.modules() if hasattr(m, "local_experts") for e in m.local_experts})
    with open(out, "w") as f:
        json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
