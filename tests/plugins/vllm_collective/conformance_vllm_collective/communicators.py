"""Device communicators written against vLLM 0.32's `DeviceCommunicatorBase`: a correct one and its planted faults.

`TwinCommunicator` fixes what vLLM's base gets wrong (its `reduce_scatter` moves the wrong axis, its in-place
`broadcast` and `all_reduce` hand a strided tensor's storage to gloo, its `send` refuses a non-contiguous tensor) and
implements the `v` variants and expert-parallel dispatch/combine; it inherits `all_gather`, `gather`, `recv` and
`destroy` from vLLM's base. Every other class changes one method of it.
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist
from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase


class TwinCommunicator(DeviceCommunicatorBase):
    """Correct: in place where vLLM's base is (all_reduce, broadcast of a contiguous tensor), out of place otherwise."""

    def __init__(self, cpu_group, device=None, device_group=None, unique_name="", use_all2all=False):
        super().__init__(cpu_group, device, device_group, unique_name, use_all2all=use_all2all)
        self._token_counts: list[int] | None = None

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        target = input_ if input_.is_contiguous() else input_.contiguous()
        dist.all_reduce(target, group=self.device_group)
        return target

    def _gather_padded(self, x: torch.Tensor, dim: int, sizes: list[int]) -> torch.Tensor:
        widest = max(sizes)
        shape = list(x.shape)
        shape[dim] = widest
        padded = torch.zeros(shape, dtype=x.dtype, device=x.device)
        padded.narrow(dim, 0, x.shape[dim]).copy_(x)
        pieces = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(pieces, padded, group=self.device_group)
        return torch.cat([p.narrow(dim, 0, n) for p, n in zip(pieces, sizes)], dim=dim)

    def all_gatherv(self, input_, dim: int = 0, sizes=None):
        if isinstance(input_, (list, tuple)):
            return [self.all_gatherv(t, dim, sizes) for t in input_]
        dim %= input_.dim()
        sizes = list(sizes) if sizes is not None else [input_.shape[dim]] * self.world_size
        return self._gather_padded(input_, dim, sizes)

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        dim %= input_.dim()
        moved = input_.movedim(dim, 0).contiguous()
        out = torch.empty((moved.shape[0] // self.world_size, *moved.shape[1:]), dtype=moved.dtype,
                          device=moved.device)
        dist.reduce_scatter_tensor(out, moved, group=self.device_group)
        return out.movedim(0, dim).contiguous()

    def reduce_scatterv(self, input_: torch.Tensor, dim: int = -1, sizes=None) -> torch.Tensor:
        dim %= input_.dim()
        if sizes is None:
            return self.reduce_scatter(input_, dim)
        summed = input_.movedim(dim, 0).contiguous().clone()
        dist.all_reduce(summed, group=self.device_group)
        start = sum(sizes[: self.rank_in_group])
        return summed[start:start + sizes[self.rank_in_group]].movedim(0, dim).contiguous()

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        target = tensor if tensor.is_contiguous() else tensor.contiguous()
        dist.broadcast(target, self.ranks[src], group=self.device_group)
        return target

    def send(self, tensor: torch.Tensor, dst: int | None = None) -> None:
        if dst is None:
            dst = (self.rank_in_group + 1) % self.world_size
        dist.send(tensor.contiguous(), self.ranks[dst], group=self.device_group)

    def dispatch(self, hidden_states, topk_weights, topk_ids, is_sequence_parallel=False, extra_tensors=None):
        if not self.use_all2all:
            return super().dispatch(hidden_states, topk_weights, topk_ids, is_sequence_parallel, extra_tensors)
        count = torch.tensor([hidden_states.shape[0]])
        counts = [torch.zeros_like(count) for _ in range(self.world_size)]
        dist.all_gather(counts, count, group=self.cpu_group)
        self._token_counts = [int(c) for c in counts]
        out = [self._gather_padded(t, 0, self._token_counts) for t in (hidden_states, topk_weights, topk_ids)]
        return tuple(out)

    def combine(self, hidden_states, is_sequence_parallel=False):
        if not self.use_all2all:
            return super().combine(hidden_states, is_sequence_parallel)
        return self.reduce_scatterv(hidden_states, 0, self._token_counts)


class WrongDimCommunicator(TwinCommunicator):
    """all_gather concatenates along dim 0 whatever `dim` says."""

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        x = input_.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x, group=self.device_group)
        return torch.cat(parts, dim=0)


class WrongChunkCommunicator(TwinCommunicator):
    """reduce_scatter hands each rank the next rank's chunk of the sum."""

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        total = input_.contiguous().clone()
        dist.all_reduce(total, group=self.device_group)
        return total.chunk(self.world_size, dim)[(self.rank_in_group + 1) % self.world_size].contiguous()


class RemainderCommunicator(TwinCommunicator):
    """all_reduce sums whole blocks of world-size elements and leaves the last numel % world elements as they were."""

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        flat = input_.contiguous().flatten().clone()
        whole = flat.numel() - flat.numel() % self.world_size
        if whole:
            head = flat[:whole]
            dist.all_reduce(head, group=self.device_group)
        return flat.view(input_.shape)


class IgnoresSrcDstCommunicator(TwinCommunicator):
    """broadcast always from rank 0, gather always to rank 0."""

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        return super().broadcast(tensor, 0)

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1):
        return super().gather(input_, 0, dim)


class HangsCommunicator(TwinCommunicator):
    """Rank 1 never returns from broadcast(src=1)."""

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        if self.rank_in_group == 1 and src == 1:
            while True:
                time.sleep(60)
        return super().broadcast(tensor, src)


class CrashesCommunicator(TwinCommunicator):
    """Rank 1 dies (SIGSEGV) in gather(dst=1)."""

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1):
        if self.rank_in_group == 1 and dst == 1:
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().gather(input_, dst, dim)


class BaseReduceScatterCommunicator(TwinCommunicator):
    """The twin with vLLM 0.32's own reduce_scatter (its fault is vLLM's code, upstream of this plugin)."""

    reduce_scatter = DeviceCommunicatorBase.reduce_scatter
