"""The reference communicator's shared-memory path (`reference_impl/distributed/shared_memory.py`), on spawned gloo
ranks of this host: all_reduce and all_gather give what gloo gives, across the slots' chunk boundaries, in float32,
bfloat16, float16 and int64, of strided inputs, at 2 and 3 ranks, every rank the same bits, inputs untouched and
results that outlive the next call; nothing is left in /dev/shm once the ranks have joined; a rank that cannot map
the file turns shared memory off on every rank; a peer that exits makes a waiting rank raise at once, and one that
never calls makes it raise at the group's timeout."""

from __future__ import annotations

import time
import traceback

import pytest
from _rank_world import join_reference_communicator, spawn_said


def _files_of(pid: int) -> list[str]:
    import os

    from reference_impl.distributed import shared_memory

    prefix = f"{shared_memory.FILE_PREFIX}{pid}-"
    return [n for n in os.listdir(shared_memory.SHM_DIR) if n.startswith(prefix)]


def _cases(rank: int, slot_bytes: int):
    """(name, input) per case: the same cases on every rank, each rank's own values."""
    import torch

    gen = torch.Generator().manual_seed(2000 + rank)
    cases = [("float32 5", torch.randn(5, generator=gen)), ("float32 empty", torch.empty(0)),
             ("int64 past a slot", torch.randint(-1000, 1000, (slot_bytes // 8 + 7,), generator=gen))]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        per_slot = slot_bytes // torch.empty((), dtype=dtype).element_size()
        for n in (per_slot, per_slot + 3, 2 * per_slot + per_slot // 2):
            cases.append((f"{dtype} n={n}", torch.randn(n, generator=gen).to(dtype)))
        cases.append((f"{dtype} transposed", torch.randn(700, 300, generator=gen).to(dtype).t()))
        cases.append((f"{dtype} every other", torch.randn(2 * 150_001, generator=gen).to(dtype)[::2]))
    return cases


def _check_collectives(rank: int, world: int, init_file: str, results) -> None:
    try:
        import torch
        import torch.distributed as dist

        comm, group = join_reference_communicator(rank, world, init_file, 60.0)
        assert comm._shm is not None, "ranks of one host should share memory"
        pids = [None] * world
        dist.all_gather_object(pids, __import__("os").getpid(), group=group)
        assert _files_of(pids[0]) == [], f"files left in /dev/shm after join: {_files_of(pids[0])}"
        for name, x in _cases(rank, comm._shm.slot_bytes):
            before = x.clone()
            out = comm.all_reduce(x)
            expected = x.contiguous().clone()
            dist.all_reduce(expected, group=group)
            assert torch.equal(x, before), f"all_reduce {name}: the input was written"
            assert out.shape == x.shape and out.dtype == x.dtype, f"all_reduce {name}: {out.shape} {out.dtype}"
            if world == 2 or not x.is_floating_point() or not x.numel():   # a + b either way round: gloo's bits
                assert torch.equal(out, expected), f"all_reduce {name}: differs from gloo's sum"
            else:                                           # another order of additions: within the family's bound
                bound = world * torch.finfo(x.dtype).eps * world * x.abs().float().max().item()
                worst = (out.float() - expected.float()).abs().max().item()
                assert worst <= bound, f"all_reduce {name}: off gloo's sum by {worst} (bound {bound})"
            everyone = [torch.empty_like(out.contiguous()) for _ in range(world)]
            dist.all_gather(everyone, out.contiguous(), group=group)
            assert all(torch.equal(e, everyone[0]) for e in everyone), f"all_reduce {name}: ranks' bits differ"

            gathered = comm.all_gather(x, dim=-1)
            parts = [torch.empty_like(x.contiguous()) for _ in range(world)]
            dist.all_gather(parts, x.contiguous(), group=group)
            assert torch.equal(x, before), f"all_gather {name}: the input was written"
            assert torch.equal(gathered, torch.cat(parts, dim=-1)), f"all_gather {name}: differs from gloo's"
            kept = out.clone()
            comm.all_reduce(x + 1 if x.dtype != torch.int64 else x * 2)
            assert torch.equal(out, kept), f"all_reduce {name}: the result changed at the next call"
        results.put((rank, None))
        comm.destroy()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the parent asserts on it
        results.put((rank, traceback.format_exc()))


def _one_rank_cannot_map(rank: int, world: int, init_file: str, results) -> None:
    """Rank 1 fails to map the file (as a rank on another host would fail to open it): gloo on every rank."""
    try:
        import torch
        import torch.distributed as dist

        from reference_impl.distributed import shared_memory

        if rank == 1:
            def refuse(*args, **kwargs):
                raise OSError("mapping refused by the test")
            shared_memory.mmap = refuse
        comm, group = join_reference_communicator(rank, world, init_file, 60.0)
        assert comm._shm is None, "shared memory should be off on every rank when one rank cannot map it"
        pids = [None] * world
        dist.all_gather_object(pids, __import__("os").getpid(), group=group)
        assert _files_of(pids[0]) == [], f"files left in /dev/shm: {_files_of(pids[0])}"
        x = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
        expected = x.clone()
        dist.all_reduce(expected, group=group)
        assert torch.equal(comm.all_reduce(x), expected), "the gloo path's sum differs"
        results.put((rank, None))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        results.put((rank, traceback.format_exc()))


def _peer_leaves(rank: int, world: int, init_file: str, how: str, results) -> None:
    """Rank 0 calls all_reduce; rank 1 never does: it exits at once ("exits") or sleeps 6 s first ("stays")."""
    try:
        import torch

        comm, _ = join_reference_communicator(rank, world, init_file, 2.0)
        assert comm._shm is not None
        if rank == 0:
            start = time.monotonic()
            try:
                comm.all_reduce(torch.ones(1 << 10))
                results.put((rank, "returned"))
            except Exception as exc:  # noqa: BLE001 - what it raised is the result
                results.put((rank, f"raised after {time.monotonic() - start:.1f} s: {type(exc).__name__}: {exc}"))
        else:
            if how == "stays":
                time.sleep(6)
            results.put((rank, "left"))
    except Exception:  # noqa: BLE001
        results.put((rank, traceback.format_exc()))


@pytest.mark.parametrize("world", [2, 3])
def test_shared_memory_collectives_give_what_gloo_gives(world, tmp_path):
    said = spawn_said(_check_collectives, world, tmp_path)
    assert said == {rank: None for rank in range(world)}, said


def test_a_rank_that_cannot_map_the_file_turns_shared_memory_off_everywhere(tmp_path):
    said = spawn_said(_one_rank_cannot_map, 2, tmp_path)
    assert said == {0: None, 1: None}, said


def test_a_peer_that_exits_makes_the_wait_raise_at_once(tmp_path):
    said = spawn_said(_peer_leaves, 2, tmp_path, "exits")
    assert said.get(1) == "left", said
    assert said.get(0, "").startswith("raised after") and "is gone" in said[0], said    # not the timeout


def test_a_peer_that_never_calls_makes_the_wait_raise_at_the_timeout(tmp_path):
    said = spawn_said(_peer_leaves, 2, tmp_path, "stays")
    assert said.get(1) == "left", said
    # the 2 s timeout (its message), not the peer's leaving at 6 s ("is gone")
    assert said.get(0, "").startswith("raised after") and "timeout of 2 s" in said[0], said
