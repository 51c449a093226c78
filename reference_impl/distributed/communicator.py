"""The reference device communicator: vLLM 0.32's `DeviceCommunicatorBase` method set and constructor, over
torch.distributed (gloo on the CPU, nccl where a platform's `dist_backend` says so; shared memory for the sums and
gathers of CPU ranks on one host, shared_memory.py), written to be obviously right.

A platform names its communicator class with `Platform.get_device_communicator_cls()` (a qualname, as in vLLM);
vLLM's `GroupCoordinator` builds one per group of more than one rank:
`cls(cpu_group=..., device=..., device_group=..., unique_name="tp:0", use_all2all=...)`. The conformance harness's
`collective` family grades any such class against a float64 reference (docs/collectives.md).

The contract, per method (`dim` may be negative; "rank" is the rank within the group; every rank calls every
collective with the same arguments, tensors of the same shape and dtype but for the `v` variants' `dim`):

- `all_reduce(x)`: the sum over the ranks of `x`, shape and dtype of `x`. It may write the sum into `x` and return
  `x` (vLLM's base and CpuCommunicator do: vLLM's `GroupCoordinator` treats the input as consumed), or return a new
  tensor; `x` then holds either its own values or the sum, nothing else. This class never writes `x`.
- `all_gather(x, dim=-1)`: the ranks' `x` concatenated along `dim` in rank order, a new tensor; `x` unchanged.
- `all_gatherv(x, dim=0, sizes=None)`: the same with each rank's own size along `dim` (`sizes[r]`, which must be
  `x.shape[dim]` on rank r; None: all equal); `x` may be a list of tensors, each gathered (a list comes back).
- `reduce_scatter(x, dim=-1)`: the sum over the ranks of `x`, split along `dim` into world-size equal chunks; rank r
  gets chunk r. `x.shape[dim]` must divide by the world size. A new tensor; `x` unchanged.
- `reduce_scatterv(x, dim=-1, sizes=None)`: the same with chunk r of `sizes[r]` elements along `dim`
  (`sum(sizes) == x.shape[dim]`; None: equal chunks).
- `gather(x, dst=0, dim=-1)`: on rank `dst` the ranks' `x` concatenated along `dim`; None on the others.
- `broadcast(t, src=0)`: rank `src`'s `t` on every rank. May be written into `t` on the ranks other than `src` (vLLM's
  base does, and returns `t`); `t` on `src` unchanged. This class returns a new tensor and never writes `t`.
- `send(t, dst=None)` / `recv(size, dtype, src=None)`: point to point; `dst` defaults to the next rank, `src` to the
  previous one (both modulo the world size), so that every rank sending then receiving passes tensors round a ring.
- `dispatch(hidden_states, topk_weights, topk_ids)` / `combine(hidden_states)`: expert parallel. On an
  expert-parallel communicator (`unique_name` "ep:...") built with `use_all2all=True`: `dispatch` gives every rank
  all ranks' tokens (the three tensors gathered along dim 0, each rank's own count), and `combine` gives each rank the
  sum over the ranks of its own tokens' rows of the combined hidden states. Otherwise both return their inputs (the
  base's no-op). `dispatch_router_logits(hidden_states, router_logits)` is `dispatch` of two tensors.
- `destroy()`: frees what the communicator holds; a call after it raises.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from reference_impl.distributed import shared_memory


def _backend(group) -> str | None:
    """The group's torch.distributed backend ("gloo", "nccl", ...), None for a group torch.distributed does not know."""
    try:
        return str(dist.get_backend(group))
    except (RuntimeError, ValueError):
        return None


class CommunicatorError(ValueError):
    """A collective called with arguments its contract does not take (a dim out of range, sizes that do not add up)."""


class ReferenceCommunicator:
    """vLLM 0.32's `DeviceCommunicatorBase` contract, out of place throughout (inputs are never written)."""

    def __init__(self, cpu_group, device: torch.device | None = None, device_group=None, unique_name: str = "",
                 global_ranks: list[int] | None = None, global_world_size: int | None = None,
                 use_all2all: bool = False):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.cpu_group = cpu_group
        self.device_group = device_group if device_group is not None else cpu_group
        self.unique_name = unique_name
        if global_ranks is not None:     # a stateless group, as vLLM's base takes it
            self.rank = cpu_group.rank()
            self.world_size = cpu_group.size()
            self.ranks = list(global_ranks)
            self.global_rank = self.ranks[self.rank]
            self.global_world_size = global_world_size if global_world_size is not None else len(self.ranks)
        else:
            self.rank = dist.get_rank(cpu_group)
            self.world_size = dist.get_world_size(cpu_group)
            self.ranks = dist.get_process_group_ranks(cpu_group)
            self.global_rank = dist.get_rank()
            self.global_world_size = dist.get_world_size()
        self.rank_in_group = self.ranks.index(self.global_rank)
        self.is_ep_communicator = unique_name.split(":")[0] == "ep"
        self.use_all2all = self.is_ep_communicator and use_all2all
        self.all2all_manager = None
        self._dispatched: list[int] | None = None    # tokens per rank of the last dispatch, for combine
        # on gloo on the CPU: shared memory where every rank is on this host (shared_memory.py), else all_reduce's
        # ring (point to point into the output); other backends sum a copy in place
        self._ring = self.world_size > 1 and self.device.type == "cpu" and _backend(self.device_group) == "gloo"
        self._shm = (shared_memory.SharedMemoryExchange.join(self.device_group, self.rank_in_group, self.world_size)
                     if self._ring and global_ranks is None and shared_memory.enabled() else None)
        self._destroyed = False

    # ----- helpers -----------------------------------------------------------------------------
    def _live(self, method: str) -> None:
        if self._destroyed:
            raise RuntimeError(f"{type(self).__name__}.{method} on group {self.unique_name!r} after destroy()")

    @staticmethod
    def _dim(x: torch.Tensor, dim: int, method: str) -> int:
        if x.dim() == 0 or not -x.dim() <= dim < x.dim():
            raise CommunicatorError(f"{method}: dim={dim} is out of range for a tensor of shape {tuple(x.shape)}")
        return dim % x.dim()

    def _gather_parts(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `x` (same shape on every rank), in rank order."""
        x = x.contiguous()
        if self._shm is not None:
            return list(self._shm.all_gather(x).unbind(0))
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x, group=self.device_group)
        return parts

    def _sizes(self, x: torch.Tensor, dim: int, sizes, method: str, total: int | None = None) -> list[int]:
        if sizes is None:
            if total is None:
                return [x.shape[dim]] * self.world_size
            if total % self.world_size:
                raise CommunicatorError(f"{method}: size {total} along dim {dim} is not divisible by the world "
                                        f"size {self.world_size}; give `sizes`")
            return [total // self.world_size] * self.world_size
        sizes = [int(s) for s in sizes]
        if len(sizes) != self.world_size or any(s < 0 for s in sizes):
            raise CommunicatorError(f"{method}: sizes={sizes} must be {self.world_size} sizes of at least 0, one "
                                    "per rank")
        if total is None and sizes[self.rank_in_group] != x.shape[dim]:
            raise CommunicatorError(f"{method}: sizes[{self.rank_in_group}]={sizes[self.rank_in_group]} is not this "
                                    f"rank's size {x.shape[dim]} along dim {dim}")
        if total is not None and sum(sizes) != total:
            raise CommunicatorError(f"{method}: sizes={sizes} add up to {sum(sizes)}, not the input's size {total} "
                                    f"along dim {dim}")
        return sizes

    # ----- the collectives -----------------------------------------------------------------------
    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        """The sum in a new tensor; `input_` is never written.

        Ranks on one host sum through shared memory (`shared_memory.SharedMemoryExchange`). Otherwise
        torch.distributed's all_reduce only sums in place, so the plain way is gloo on a copy of the input: a copy
        that costs as much as gloo's whole in-place call at a few MB. On a gloo group, from RING_MIN_BYTES on, the
        sum is a ring (`_ring_all_reduce`) written straight into the new output instead: no copy of the input and
        no buffer but the output. Below that a call is gloo's latency, not bandwidth, and the copy costs nothing.
        """
        self._live("all_reduce")
        x = input_.contiguous()
        if self._shm is not None and x.dtype != torch.bool:
            return self._shm.all_reduce(x)
        if self._ring and x.is_floating_point() and x.numel() * x.element_size() >= self.RING_MIN_BYTES:
            return self._ring_all_reduce(x)
        out = x.clone()
        dist.all_reduce(out, group=self.device_group)
        return out

    # below this the ring's 2 * (world - 1) point-to-point waits (gloo's, about 1 to 2.5 ms each on a busy 2-core
    # machine) can cost more than the copy it saves (at 4 MB it won one run by 1.8x and lost the next by 0.77x); at
    # 8 and 64 MB it was 1.2 to 1.5x faster than gloo on a copy (docs/collectives.md, bench_collectives.py)
    RING_MIN_BYTES = 8 << 20

    def _ring_all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the ranks of contiguous `x` by a ring of point-to-point messages, into a new tensor.

        The flat input is cut into world-size chunks. Reduce-scatter: at step k every rank sends chunk `rank - k`
        (its own input at step 0, after that the partial sum it received the step before) to the next rank and
        receives chunk `rank - k - 1` from the previous one straight into the output, adding its own input's
        chunk there; after world-size - 1 steps the rank holds chunk `rank + 1` summed over every rank. All-gather:
        the same ring passes the summed chunks on, each received straight into its place in the output. Every
        chunk is summed on one rank and copied to the others, so every rank gets the same bits (tensor-parallel
        ranks must agree); a 16-bit sum is added in its dtype as gloo adds it. Each message's wait is bounded by
        the group's timeout (gloo's), as any collective on the group is, so a dead or absent peer raises.
        """
        world, rank = self.world_size, self.rank_in_group
        src, out = x.reshape(-1), torch.empty(x.numel(), dtype=x.dtype, device=x.device)
        bounds = [x.numel() * c // world for c in range(world + 1)]

        def chunk(t: torch.Tensor, c: int) -> torch.Tensor:
            c %= world
            return t[bounds[c]:bounds[c + 1]]

        def exchange(send: torch.Tensor, recv: torch.Tensor) -> None:
            works = [dist.isend(send, group=self.device_group, group_dst=(rank + 1) % world),
                     dist.irecv(recv, group=self.device_group, group_src=(rank - 1) % world)]
            for work in works:
                work.wait()

        for k in range(world - 1):             # reduce-scatter
            exchange(chunk(src if k == 0 else out, rank - k), chunk(out, rank - k - 1))
            chunk(out, rank - k - 1).add_(chunk(src, rank - k - 1))
        for k in range(world - 1):             # all-gather of the summed chunks
            exchange(chunk(out, rank + 1 - k), chunk(out, rank - k))
        return out.view(x.shape)

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """One all_gather (shared memory, or gloo's) into a fresh buffer, rank r's tensor at r: for dim 0 (or only
        size-1 dims before `dim`) that buffer is the result (a view, no copy); otherwise one copy puts the ranks'
        parts side by side along `dim`."""
        self._live("all_gather")
        dim = self._dim(input_, dim, "all_gather")
        x = input_.contiguous()
        # one collective into one buffer, rank r's tensor at stacked[r]; moving the rank axis next to `dim` and
        # merging the two is the concatenation in rank order (a view when dim is 0, else one copy)
        if self._shm is not None:
            stacked = self._shm.all_gather(x)
        else:
            flat = torch.empty(self.world_size * x.numel(), dtype=x.dtype, device=x.device)   # gloo takes it flat
            dist.all_gather_into_tensor(flat, x.reshape(-1), group=self.device_group)
            stacked = flat.view(self.world_size, *x.shape)
        return stacked.movedim(0, dim).reshape(*x.shape[:dim], self.world_size * x.shape[dim], *x.shape[dim + 1:])

    def all_gatherv(self, input_: torch.Tensor | list[torch.Tensor], dim: int = 0,
                    sizes: list[int] | None = None) -> torch.Tensor | list[torch.Tensor]:
        self._live("all_gatherv")
        if isinstance(input_, (list, tuple)):
            return [self._all_gatherv_one(t, dim, sizes) for t in input_]
        return self._all_gatherv_one(input_, dim, sizes)

    def _all_gatherv_one(self, x: torch.Tensor, dim: int, sizes) -> torch.Tensor:
        dim = self._dim(x, dim, "all_gatherv")
        sizes = self._sizes(x, dim, sizes, "all_gatherv")
        biggest = max(sizes)
        padded_shape = list(x.shape)
        padded_shape[dim] = biggest
        padded = x.new_zeros(padded_shape)
        padded.narrow(dim, 0, x.shape[dim]).copy_(x)
        parts = self._gather_parts(padded)
        return torch.cat([p.narrow(dim, 0, s) for p, s in zip(parts, sizes)], dim=dim)

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        self._live("reduce_scatter")
        dim = self._dim(input_, dim, "reduce_scatter")
        sizes = self._sizes(input_, dim, None, "reduce_scatter", total=input_.shape[dim])
        return self._reduce_scatter_sizes(input_, dim, sizes)

    def reduce_scatterv(self, input_: torch.Tensor, dim: int = -1, sizes: list[int] | None = None) -> torch.Tensor:
        self._live("reduce_scatterv")
        dim = self._dim(input_, dim, "reduce_scatterv")
        sizes = self._sizes(input_, dim, sizes, "reduce_scatterv", total=input_.shape[dim])
        return self._reduce_scatter_sizes(input_, dim, sizes)

    def reduce_scatterv_into_output(self, input_: torch.Tensor, output: torch.Tensor, dim: int = -1,
                                    sizes: list[int] | None = None) -> torch.Tensor:
        output.copy_(self.reduce_scatterv(input_, dim, sizes))
        return output

    def _reduce_scatter_sizes(self, x: torch.Tensor, dim: int, sizes: list[int]) -> torch.Tensor:
        total = self.all_reduce(x)
        start = sum(sizes[: self.rank_in_group])
        return total.narrow(dim, start, sizes[self.rank_in_group]).contiguous()

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        self._live("gather")
        dim = self._dim(input_, dim, "gather")
        if not 0 <= dst < self.world_size:
            raise CommunicatorError(f"gather: dst={dst} is not a rank of the group (world size {self.world_size})")
        x = input_.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.rank_in_group == dst else None
        dist.gather(x, parts, dst=self.ranks[dst], group=self.device_group)
        return torch.cat(parts, dim=dim) if parts is not None else None

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        self._live("broadcast")
        if not 0 <= src < self.world_size:
            raise CommunicatorError(f"broadcast: src={src} is not a rank of the group (world size {self.world_size})")
        out = tensor.contiguous().clone()
        if self.world_size > 1:
            dist.broadcast(out, self.ranks[src], group=self.device_group)
        return out

    def send(self, tensor: torch.Tensor, dst: int | None = None) -> None:
        self._live("send")
        if dst is None:
            dst = (self.rank_in_group + 1) % self.world_size
        dist.send(tensor.contiguous(), self.ranks[dst], group=self.device_group)

    def recv(self, size: torch.Size, dtype: torch.dtype, src: int | None = None) -> torch.Tensor:
        self._live("recv")
        if src is None:
            src = (self.rank_in_group - 1) % self.world_size
        out = torch.empty(size, dtype=dtype, device=self.device)
        dist.recv(out, self.ranks[src], group=self.device_group)
        return out

    # ----- expert parallel ------------------------------------------------------------------------
    def _counts(self, tokens: int) -> list[int]:
        counts = torch.tensor([tokens], dtype=torch.int64)
        parts = [torch.empty_like(counts) for _ in range(self.world_size)]
        dist.all_gather(parts, counts, group=self.cpu_group)
        return [int(p.item()) for p in parts]

    def dispatch_router_logits(self, hidden_states: torch.Tensor, router_logits: torch.Tensor,
                               is_sequence_parallel: bool = False, extra_tensors: list[torch.Tensor] | None = None):
        self._live("dispatch_router_logits")
        tensors = [hidden_states, router_logits, *(extra_tensors or [])]
        out = self._dispatch(tensors)
        return (out[0], out[1], out[2:]) if extra_tensors is not None else (out[0], out[1])

    def dispatch(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 is_sequence_parallel: bool = False, extra_tensors: list[torch.Tensor] | None = None):
        self._live("dispatch")
        tensors = [hidden_states, topk_weights, topk_ids, *(extra_tensors or [])]
        out = self._dispatch(tensors)
        return (out[0], out[1], out[2], out[3:]) if extra_tensors is not None else (out[0], out[1], out[2])

    def _dispatch(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        if not self.use_all2all:
            return list(tensors)
        tokens = tensors[0].shape[0]
        for t in tensors[1:]:
            if t.shape[0] != tokens:
                raise CommunicatorError(f"dispatch: every tensor needs the same number of tokens (dim 0) as "
                                        f"hidden_states ({tokens}); got shape {tuple(t.shape)}")
        sizes = self._counts(tokens)
        self._dispatched = sizes
        return [self._all_gatherv_one(t, 0, sizes) for t in tensors]

    def combine(self, hidden_states: torch.Tensor, is_sequence_parallel: bool = False) -> torch.Tensor:
        self._live("combine")
        if not self.use_all2all:
            return hidden_states
        if self._dispatched is None:
            raise RuntimeError(f"combine on group {self.unique_name!r} before any dispatch: the tokens per rank "
                               "come from the last dispatch")
        return self._reduce_scatter_sizes(hidden_states, 0, self._sizes(hidden_states, 0, self._dispatched,
                                                                         "combine", total=hidden_states.shape[0]))

    def batch_isend_irecv(self, p2p_ops: list):
        raise NotImplementedError("ReferenceCommunicator.batch_isend_irecv: not part of the graded contract")

    def destroy(self) -> None:
        self._dispatched = None
        if self._shm is not None:
            self._shm.close()
            self._shm = None
        self._destroyed = True


CLASS_PATH = f"{__name__}.ReferenceCommunicator"
