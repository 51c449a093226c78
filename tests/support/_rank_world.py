"""A world of gloo rank processes that each run a module's scenarios, for the tests of the reference's tensor and
expert parallelism (tests/runtime/test_distributed.py, tests/layers/test_moe_expert_parallel.py): a scenario module
has WORLD_SIZE, SCENARIOS (functions of the rank) and a `run_rank(rank, init_file, queue)` that calls
`run_scenarios`; the test module's fixture calls `spawn_world` once, and each scenario's test `assert_scenario`.
`spawn_ranks` starts and collects any such world; `spawn_said` and `join_reference_communicator` are the
communicator tests' (ring and shared-memory all_reduce): one message a rank, one reference communicator a rank."""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_mod
import traceback


def run_scenarios(rank: int, init_file: str, queue, world: int, scenarios, **parallel) -> None:
    """One rank: join the world over gloo (`initialize_model_parallel(world, **parallel)`), run every scenario and
    put (rank, scenario name, traceback or None) on `queue`; a setup that raises is reported as "setup"."""
    import torch

    torch.set_num_threads(1)
    from reference_impl import distributed as d

    try:
        d.init_distributed_environment(world, rank, f"file://{init_file}", backend="gloo")
        d.initialize_model_parallel(world, **parallel)
    except Exception:  # noqa: BLE001 - reported as every scenario failing
        queue.put((rank, "setup", traceback.format_exc()))
        return
    for scenario in scenarios:
        try:
            scenario(rank)
            queue.put((rank, scenario.__name__, None))
        except Exception:  # noqa: BLE001
            queue.put((rank, scenario.__name__, traceback.format_exc()))
    d.destroy_distributed_environment()


def rank_context():
    """The multiprocessing context of the tests' rank processes: forked from a server (one per test process) that has
    imported torch and the reference's distributed package, instead of a fresh interpreter per rank, which spends
    about 2 CPU-seconds on those imports. A rank is still a process of its own, from a process that never ran a
    collective or a parallel op; `rank_process` gives it the caller's environment of the moment (the server keeps
    the one it started with)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "reference_impl.distributed"])
    return ctx


def rank_process(ctx, target, args: tuple):
    """A process of `ctx` (rank_context) running `target(*args)` under this process's current environment."""
    return ctx.Process(target=_in_environment, args=(dict(os.environ), target, *args))


def _in_environment(environment: dict[str, str], target, *args) -> None:
    os.environ.clear()
    os.environ.update(environment)
    target(*args)


def spawn_ranks(target, world: int, args: tuple, expected: int, timeout: float = 120.0, stop=None) -> list:
    """Start `world` rank processes `target(rank, *args, queue)` (rank_context), take up to `expected` items from the
    queue (fewer when one waits past `timeout` or `stop(item)` says so), then join every process (killed after 30 s)."""
    ctx = rank_context()
    queue = ctx.Queue()
    procs = [rank_process(ctx, target, (rank, *args, queue)) for rank in range(world)]
    for p in procs:
        p.start()
    items = []
    try:
        for _ in range(expected):
            items.append(queue.get(timeout=timeout))
            if stop is not None and stop(items[-1]):
                break
    except queue_mod.Empty:
        pass
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return items


def spawn_world(module, init_file: str, timeout: float = 120.0) -> dict[str, dict[int, str | None]]:
    """{scenario: {rank: traceback or None}} from one world running `module.run_rank` on every rank."""
    outcome: dict[str, dict[int, str | None]] = {}
    items = spawn_ranks(module.run_rank, module.WORLD_SIZE, (init_file,), module.WORLD_SIZE * len(module.SCENARIOS),
                        timeout, stop=lambda item: item[1] == "setup")
    for rank, name, error in items:
        outcome.setdefault(name, {})[rank] = error
    return outcome


def assert_scenario(outcome: dict[str, dict[int, str | None]], scenario: str, world: int) -> None:
    """Every rank reported `scenario` and none raised (the world's setup too)."""
    assert "setup" not in outcome, outcome["setup"]
    by_rank = outcome.get(scenario, {})
    assert sorted(by_rank) == list(range(world)), f"{scenario}: no result from some rank"
    failures = {rank: err for rank, err in by_rank.items() if err}
    assert not failures, "\n".join(f"rank {r}:\n{e}" for r, e in failures.items())


def join_reference_communicator(rank: int, world: int, init_file: str, timeout_s: float):
    """This rank (one thread) in a gloo world of `world` ranks met at `init_file`, every collective bounded by
    `timeout_s`, and the reference communicator of a "tp" gloo group of all of them: (communicator, group). Shared
    memory is used or not as REFERENCE_COMM_SHM says when this is called (the ring all_reduce tests set it to 0)."""
    import datetime

    import torch
    import torch.distributed as dist

    from reference_impl.distributed.communicator import ReferenceCommunicator

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timeout)
    group = dist.new_group(list(range(world)), backend="gloo", timeout=timeout)
    return ReferenceCommunicator(cpu_group=group, device=torch.device("cpu"), device_group=group,
                                 unique_name="tp:0"), group


def spawn_said(target, world: int, tmp_path, *extra, timeout: float = 180.0) -> dict:
    """{rank: what it said} from `world` ranks running `target(rank, world, rendezvous file, *extra, queue)`
    (each puts one (rank, message) on the queue)."""
    return dict(spawn_ranks(target, world, (world, str(tmp_path / "rendezvous"), *extra), world, timeout))
