"""Communicators (the reference one with one change each) that break the aliasing contract, for
tests/collective/test_collective_groups.py: the family's rank processes import this module by name."""

from __future__ import annotations

import torch

from reference_impl.distributed.communicator import ReferenceCommunicator


class ReusedBufferCommunicator(ReferenceCommunicator):
    """all_gather returns one output buffer per shape, overwritten by the next call."""

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        out = super().all_gather(input_, dim)
        buffers = self.__dict__.setdefault("_buffers", {})
        buf = buffers.setdefault((tuple(out.shape), out.dtype, tuple(out.stride())), torch.empty_like(out))
        return buf.copy_(out)


class ScribblingCommunicator(ReferenceCommunicator):
    """reduce_scatter uses its input as scratch space (zeroes it)."""

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        out = super().reduce_scatter(input_, dim)
        input_.zero_()
        return out
