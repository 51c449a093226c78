"""Shared memory between the ranks of one host: the reference communicator's all_reduce and all_gather without
gloo's sockets (docs/collectives.md).

One file in /dev/shm holds two sets of slots, one slot per rank. A collective cuts its input into slot-sized chunks;
for each chunk every rank copies its part into its own slot, all ranks meet at a barrier, and every rank reads every
slot (summing them in rank order, so every rank gets the same bits, or copying them into place). The next chunk uses
the other set: a rank can only write a set again after the next barrier, which every rank reaches only once it has
read that set, so one barrier per chunk is enough.

The barrier is one named pipe (FIFO) per ordered pair of ranks: a rank writes one byte to each peer and reads one from
each. A pipe is the kernel's, so its write and read order the slot's stores before the peer's loads on any CPU, a
peer's tokens queue per pair (a fast rank's next barrier is not taken for this one), and a peer that has exited
closes its end: the wait ends at once with an error instead of running to the group's timeout. Waits first poll
briefly (the ranks of a tensor-parallel step arrive together), then block.

The files are removed as soon as every rank has opened them, so a killed rank leaves nothing in /dev/shm but in the
milliseconds of `join` (named `reference-comm-<pid>-<hex>`, for a clean-up to find).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import secrets
import select
import time
import weakref
from mmap import mmap

import torch
import torch.distributed as dist

SHM_DIR = "/dev/shm"
FILE_PREFIX = "reference-comm-"     # reference-comm-<creating pid>-<8 hex digits>[-<sender>to<receiver>]
BUDGET_BYTES = 4 << 20              # both sets of every rank's slot together
MIN_SLOT_BYTES, MAX_SLOT_BYTES = 256 << 10, 1 << 20
POLLS_BEFORE_BLOCKING = 64          # non-blocking polls of a peer's pipe (about 1 us each) before a blocking wait
ENV_SWITCH = "REFERENCE_COMM_SHM"   # "0": never use shared memory (gloo throughout)


class SharedMemoryError(RuntimeError):
    """A peer rank left (its end of the barrier's pipe closed) or did not arrive within the group's timeout."""


def enabled() -> bool:
    """Whether shared memory may be used: not when REFERENCE_COMM_SHM=0."""
    return os.environ.get(ENV_SWITCH, "1") != "0"


def group_timeout_s(group) -> float:
    """The group's collective timeout in seconds (gloo's default, 30 minutes, where the group does not say)."""
    try:
        return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return datetime.timedelta(minutes=30).total_seconds()


def slot_bytes_for(world: int) -> int:
    """Bytes of one rank's slot: BUDGET_BYTES over both sets of every rank, within [MIN, MAX], a multiple of 4 KB."""
    return max(MIN_SLOT_BYTES, min(MAX_SLOT_BYTES, BUDGET_BYTES // (2 * world))) // 4096 * 4096


def _pipe_path(base: str, sender: int, receiver: int) -> str:
    return f"{base}-{sender}to{receiver}"


def _each_quietly(action, items) -> None:
    """`action(item)` for every item, an OSError of one not stopping the rest (clean-up: unlink paths, close fds)."""
    for item in items:
        with contextlib.suppress(OSError):
            action(item)


class SharedMemoryExchange:
    """The slots and the barrier of one group's ranks on one host; made by the collective `join`."""

    def __init__(self, rank: int, world: int, slots: torch.Tensor, readers: dict[int, int], writers: dict[int, int],
                 timeout_s: float):
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self.slot_bytes = slots.shape[-1]
        self._slots = slots                    # uint8 (2, world, slot_bytes), mapped from the shared file
        self._readers, self._writers = readers, writers
        self._polls = {}
        for peer, fd in readers.items():
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            self._polls[peer] = poller
        self._generation = 0
        self._closer = weakref.finalize(self, _each_quietly, os.close, [*readers.values(), *writers.values()])

    @classmethod
    def join(cls, group, rank: int, world: int) -> SharedMemoryExchange | None:
        """Every rank of the gloo `group` calls this together: the exchange where every rank sees the same /dev/shm
        file (one host) and it has room, else None on every rank."""
        slot = slot_bytes_for(world)
        size = 2 * world * slot
        base, paths, ok = None, [], True
        if rank == 0:
            base = os.path.join(SHM_DIR, f"{FILE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
            paths = [base] + [_pipe_path(base, s, r) for s in range(world) for r in range(world) if s != r]
            try:
                fd = os.open(base, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.posix_fallocate(fd, 0, size)        # the pages now, or ENOSPC now (not SIGBUS mid-call)
                finally:
                    os.close(fd)
                for path in paths[1:]:
                    os.mkfifo(path, 0o600)
            except (OSError, AttributeError):
                ok = False
        said = [base if ok else None]
        dist.broadcast_object_list(said, src=dist.get_global_rank(group, 0), group=group)
        base = said[0]
        if base is None:
            _each_quietly(os.unlink, paths)
            return None
        readers, writers, slots = {}, {}, None

        def everyone(step_ok: bool) -> bool:
            flag = torch.tensor([1 if step_ok else 0], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
            return bool(flag.item())

        try:
            fd = os.open(base, os.O_RDWR)          # no O_CREAT: a rank on another host fails here
            try:
                mapped = mmap(fd, size)
            finally:
                os.close(fd)
            slots = torch.frombuffer(mapped, dtype=torch.uint8).view(2, world, slot)
            for peer in range(world):
                if peer != rank:                   # read ends first: opening a write end needs a reader
                    readers[peer] = os.open(_pipe_path(base, peer, rank), os.O_RDONLY | os.O_NONBLOCK)
            step_ok = True
        except (OSError, ValueError):
            step_ok = False
        if everyone(step_ok):
            try:
                for peer in range(world):
                    if peer != rank:
                        writers[peer] = os.open(_pipe_path(base, rank, peer), os.O_WRONLY | os.O_NONBLOCK)
                step_ok = True
            except OSError:
                step_ok = False
            joined = everyone(step_ok)
        else:
            joined = False
        if rank == 0:
            _each_quietly(os.unlink, paths)
        if not joined:
            _each_quietly(os.close, [*readers.values(), *writers.values()])
            return None
        return cls(rank, world, slots, readers, writers, group_timeout_s(group))

    # ----- the barrier ------------------------------------------------------------------------------
    def _barrier(self) -> None:
        """Every rank has written its slot of this generation's set: tell each peer, then hear from each."""
        for peer, fd in self._writers.items():
            try:
                os.write(fd, b"\0")
            except BrokenPipeError:
                raise SharedMemoryError(f"rank {peer} of the group is gone (its end of the barrier is closed)") \
                    from None
        deadline = None
        for peer, fd in self._readers.items():
            polls, poller = 0, self._polls[peer]
            while True:
                if polls < POLLS_BEFORE_BLOCKING:
                    polls += 1
                    ready = poller.poll(0)
                else:
                    now = time.monotonic()
                    deadline = deadline if deadline is not None else now + self.timeout_s
                    if now >= deadline:
                        raise SharedMemoryError(f"rank {peer} of the group did not reach the collective within the "
                                                f"group's timeout of {self.timeout_s:g} s")
                    ready = poller.poll(min(1000, max(1, int((deadline - now) * 1000))))
                if ready:
                    try:
                        got = os.read(fd, 1)
                    except BlockingIOError:
                        continue
                    if not got:
                        raise SharedMemoryError(f"rank {peer} of the group is gone (its end of the barrier closed)")
                    break
        self._generation += 1

    def _exchanged(self, src: torch.Tensor):
        """For each slot-sized chunk of flat `src`: this rank's part copied into its slot of this generation's set,
        the barrier passed, then (start, every rank's part of the chunk, in rank order) for the caller to read."""
        step = self.slot_bytes // src.dtype.itemsize
        for start in range(0, src.numel(), step):
            nbytes = min(step, src.numel() - start) * src.dtype.itemsize
            slots = self._slots[self._generation % 2]
            parts = [slots[r, :nbytes].view(src.dtype) for r in range(self.world)]
            parts[self.rank].copy_(src[start:start + parts[0].numel()])
            self._barrier()
            yield start, parts

    # ----- the collectives ----------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the ranks of contiguous `x`, in a new tensor: every rank adds the slots in rank order (the
        same bits on every rank; a 16-bit sum rounded after each addition, as gloo adds)."""
        src = x.view(-1)
        out = torch.empty_like(src)
        for start, parts in self._exchanged(src):
            total = out[start:start + parts[0].numel()]
            torch.add(parts[0], parts[1], out=total)
            for part in parts[2:]:
                total.add_(part)
        return out.view(x.shape)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """The ranks' contiguous `x` stacked in rank order: a new tensor of shape (world, *x.shape)."""
        src = x.view(-1)
        out = torch.empty((self.world, src.numel()), dtype=x.dtype, device=x.device)
        for start, parts in self._exchanged(src):
            for r, part in enumerate(parts):
                out[r, start:start + part.numel()].copy_(part)
        return out.view(self.world, *x.shape)

    def close(self) -> None:
        """Close this rank's ends of the barrier (a peer still waiting on it raises) and drop the mapping."""
        self._closer()
        self._slots = None
