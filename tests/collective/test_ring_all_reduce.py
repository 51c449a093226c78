"""The reference communicator's all_reduce ring (point to point straight into a new output, no copy of the input:
`ReferenceCommunicator._ring_all_reduce`, its path where the ranks share no memory; shared memory is switched off
here with REFERENCE_COMM_SHM=0) against gloo's own all_reduce, on spawned gloo ranks: the same sums for
sizes around the ring's threshold and past 2^20 elements, in float32, bfloat16 and float16, of contiguous and
strided inputs, at 2 and 3 ranks; every rank the same bits; the input untouched; and a peer that never calls makes
the call raise within the group's timeout instead of hanging."""

from __future__ import annotations

import time
import traceback

import pytest
from _rank_world import join_reference_communicator, spawn_said


def _join(rank: int, world: int, init_file: str, timeout_s: float):
    import os

    os.environ["REFERENCE_COMM_SHM"] = "0"     # the ring is the path of ranks on different hosts
    return join_reference_communicator(rank, world, init_file, timeout_s)


def _inputs(rank: int, threshold_elems: int):
    """(name, input) per case: the same cases on every rank, each rank's own values."""
    import torch

    gen = torch.Generator().manual_seed(1000 + rank)
    cases = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        per_byte = torch.empty((), dtype=dtype).element_size()
        for n in (threshold_elems * 4 // per_byte - 1, threshold_elems * 4 // per_byte, (1 << 20) + 3):
            cases.append((f"{dtype} n={n}", torch.randn(n, generator=gen).to(dtype)))
        big = torch.randn(700, 300, generator=gen).to(dtype)
        cases.append((f"{dtype} transposed", big.t()))
        cases.append((f"{dtype} every other", torch.randn(2 * 150_001, generator=gen).to(dtype)[::2]))
    return cases


def _check_sums(rank: int, world: int, init_file: str, results) -> None:
    try:
        import torch
        import torch.distributed as dist

        comm, group = _join(rank, world, init_file, 30.0)
        assert comm._ring and comm._shm is None, "the ring, not shared memory, should be on"
        at_threshold = [("float32 past the threshold", torch.full((comm.RING_MIN_BYTES // 4 + 3,), rank + 0.5))]
        small = 64 << 10
        for name, x in at_threshold + _inputs(rank, small // 4):
            comm.RING_MIN_BYTES = small if name != at_threshold[0][0] else type(comm).RING_MIN_BYTES
            before = x.clone()
            out = comm.all_reduce(x)
            expected = x.contiguous().clone()
            dist.all_reduce(expected, group=group)
            assert torch.equal(x, before), f"{name}: the input was written"
            assert out.shape == x.shape and out.dtype == x.dtype, f"{name}: {out.shape} {out.dtype}"
            assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr(), f"{name}: shares the input"
            if world == 2:      # a + b either way round: the same bits as gloo's
                assert torch.equal(out, expected), f"{name}: differs from gloo's sum"
            else:               # another order of additions: within the family's bound
                bound = world * torch.finfo(x.dtype).eps * world * x.abs().float().max().item()
                worst = (out.float() - expected.float()).abs().max().item()
                assert worst <= bound, f"{name}: off gloo's sum by {worst} (bound {bound})"
            mine = out.reshape(-1).view(torch.uint8) if out.is_contiguous() else out.contiguous().view(-1)
            everyone = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(everyone, mine.contiguous(), group=group)
            assert all(torch.equal(e, everyone[0]) for e in everyone), f"{name}: the ranks got different bits"
        results.put((rank, None))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the parent asserts on it
        results.put((rank, traceback.format_exc()))


def _absent_peer(rank: int, world: int, init_file: str, results) -> None:
    """Rank 0 calls all_reduce on the ring; rank 1 never does and exits after a while."""
    try:
        import torch

        comm, _ = _join(rank, world, init_file, 2.0)
        comm.RING_MIN_BYTES = 0
        if rank == 0:
            start = time.monotonic()
            try:
                comm.all_reduce(torch.ones(1 << 20))
                results.put((rank, "returned"))
            except Exception as exc:  # noqa: BLE001 - gloo's timeout or a closed connection
                results.put((rank, f"raised after {time.monotonic() - start:.1f} s: {type(exc).__name__}"))
        else:
            time.sleep(8)
            results.put((rank, "left"))
    except Exception:  # noqa: BLE001
        results.put((rank, traceback.format_exc()))


@pytest.mark.parametrize("world", [2, 3])
def test_the_ring_sums_as_gloo_does_and_leaves_the_input_alone(world, tmp_path):
    said = spawn_said(_check_sums, world, tmp_path, timeout=120.0)
    assert said == {rank: None for rank in range(world)}, said


def test_a_peer_that_never_calls_makes_the_ring_raise_within_the_timeout(tmp_path):
    said = spawn_said(_absent_peer, 2, tmp_path, timeout=120.0)
    assert said.get(1) == "left", said
    assert said.get(0, "").startswith("raised after"), said
    assert float(said[0].split()[2]) < 7, said      # the 2 s timeout, not the peer's leaving at 8 s
