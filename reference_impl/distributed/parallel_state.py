"""The tensor-parallel group: rank, world size and the collectives the parallel layers use.

Without any initialization the group is a single rank (world size 1): every collective returns its
input and no `torch.distributed` call is made, so layers and models run in a plain process.
`init_distributed_environment` + `initialize_model_parallel` build real groups on
`torch.distributed` (gloo on the CPU); the collectives then run as opaque torch ops
(`reference_dist::*`) so compiled graphs call them instead of tracing into `torch.distributed`. Each op calls the
group's device communicator (`reference_impl.distributed.communicator.ReferenceCommunicator`, vLLM 0.32's
`DeviceCommunicatorBase` contract), as vLLM's `GroupCoordinator` calls the platform's.

Expert parallelism (`initialize_model_parallel(..., enable_expert_parallel=True)`) adds an expert-parallel group
over the tensor-parallel ranks, as vLLM builds its "ep" group with data parallelism 1: its device communicator is
built with `unique_name` "ep:0" and `use_all2all=False` (vLLM turns all2all on only with data or sequence
parallelism), and FusedMoE splits its experts by the rank in it. The partial expert sums are then combined by the
MoE block's one tensor-parallel all_reduce, over the same ranks, as vLLM's MoE runner does.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
import torch.distributed as dist


class ParallelStateError(RuntimeError):
    """The parallel state is used wrongly (initialized twice, sizes that do not divide, ...)."""


def divide(numerator: int, denominator: int, what: str = "size") -> int:
    """`numerator // denominator`, raising ValueError when it does not divide exactly."""
    if denominator <= 0 or numerator % denominator:
        raise ValueError(f"{what} {numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator


def split_tensor_along_last_dim(x: torch.Tensor, num_partitions: int) -> tuple[torch.Tensor, ...]:
    """Equal views of `x` along its last dimension (ValueError when it does not divide)."""
    size = divide(x.shape[-1], num_partitions, "last dimension")
    return torch.split(x, size, dim=-1)


# ----- groups ---------------------------------------------------------------------------------------
_GROUPS: dict[str, GroupCoordinator] = {}


@dataclasses.dataclass(eq=False)
class GroupCoordinator:
    """One group of ranks and its collectives; all collectives are functional (fresh outputs).

    `ranks` are global ranks; `device_group` is the torch.distributed group (None for a single rank,
    which needs no torch.distributed at all).
    """

    name: str
    ranks: list[int]
    rank: int                                   # this process's global rank
    device_group: object | None = None
    communicator: object | None = None          # the device communicator of a real group of more than one rank

    def __post_init__(self):
        if self.device_group is not None and self.communicator is None and len(self.ranks) > 1:
            from reference_impl.distributed.communicator import ReferenceCommunicator

            self.communicator = ReferenceCommunicator(self.device_group, unique_name=f"{self.name}:0")

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def rank_in_group(self) -> int:
        return self.ranks.index(self.rank)

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    def _check_real(self, what: str) -> None:
        if self.device_group is None:
            raise ParallelStateError(f"{what} on group {self.name!r} (rank {self.rank_in_group} of {self.world_size}) "
                                     "has no process group behind it (simulated_tensor_parallel): only "
                                     "construction and weight loading work there")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over the group (every rank gets it); `x` itself for a single rank."""
        if self.world_size == 1:
            return x
        self._check_real("all_reduce")
        return torch.ops.reference_dist.all_reduce(x, self.name)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The ranks' `x` concatenated along `dim` in rank order (every rank gets it)."""
        if self.world_size == 1:
            return x
        self._check_real("all_gather")
        dim = dim % x.dim() if x.dim() else 0
        return torch.ops.reference_dist.all_gather(x, dim, self.world_size, self.name)

    def gather(self, x: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        """Like `all_gather` but only rank `dst` of the group gets the result; the others get None."""
        if self.world_size == 1:
            return x
        gathered = self.all_gather(x, dim)
        return gathered if self.rank_in_group == dst else None

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """A copy of rank `src`'s `x` on every rank (`x` itself for a single rank)."""
        if self.world_size == 1:
            return x
        self._check_real("broadcast")
        return torch.ops.reference_dist.broadcast(x, src, self.name)

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.device_group)


def _single_rank_group(name: str) -> GroupCoordinator:
    return GroupCoordinator(name=name, ranks=[0], rank=0, device_group=None)


def _lookup(group_name: str) -> GroupCoordinator:
    try:
        return _GROUPS[group_name]
    except KeyError:
        raise ParallelStateError(f"no process group named {group_name!r} (known: {sorted(_GROUPS)}); "
                                 "was initialize_model_parallel called in this process?") from None


# ----- the collectives as opaque torch ops -----------------------------------------------------------
@torch.library.custom_op("reference_dist::all_reduce", mutates_args=())
def _all_reduce_op(x: torch.Tensor, group_name: str) -> torch.Tensor:
    comm = _lookup(group_name).communicator
    # a communicator other than the reference may sum in place (vLLM's contract allows it): this op is functional
    return comm.all_reduce(x if _is_reference(comm) else x.clone())


def _is_reference(comm) -> bool:
    from reference_impl.distributed.communicator import ReferenceCommunicator

    return type(comm) is ReferenceCommunicator


@_all_reduce_op.register_fake
def _(x, group_name):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("reference_dist::all_gather", mutates_args=())
def _all_gather_op(x: torch.Tensor, dim: int, world_size: int, group_name: str) -> torch.Tensor:
    return _lookup(group_name).communicator.all_gather(x, dim)


@_all_gather_op.register_fake
def _(x, dim, world_size, group_name):
    shape = list(x.shape)
    shape[dim] *= world_size
    return x.new_empty(shape)


@torch.library.custom_op("reference_dist::broadcast", mutates_args=())
def _broadcast_op(x: torch.Tensor, src: int, group_name: str) -> torch.Tensor:
    """`src` is the rank within the group (vLLM's convention)."""
    comm = _lookup(group_name).communicator
    return comm.broadcast(x if _is_reference(comm) else x.clone(), src)


@_broadcast_op.register_fake
def _(x, src, group_name):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# ----- the process-wide state ------------------------------------------------------------------------
_TP: GroupCoordinator | None = None
_EP: GroupCoordinator | None = None
_WORLD: GroupCoordinator | None = None
_JOINED = False     # whether init_distributed_environment itself called init_process_group


def init_distributed_environment(world_size: int, rank: int, init_method: str = "env://",
                                 backend: str = "gloo") -> GroupCoordinator:
    """Join the torch.distributed world (once per process) and return the world group."""
    global _WORLD, _JOINED
    if not dist.is_available():
        raise ParallelStateError("torch.distributed is not available in this torch build")
    if world_size < 1 or not (0 <= rank < world_size):
        raise ValueError(f"rank {rank} / world size {world_size}: need world_size >= 1 and 0 <= rank < world_size")
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, init_method=init_method, world_size=world_size, rank=rank)
        _JOINED = True
    elif dist.get_world_size() != world_size or dist.get_rank() != rank:
        raise ParallelStateError(f"torch.distributed is already initialized as rank {dist.get_rank()} of "
                                 f"{dist.get_world_size()}, not rank {rank} of {world_size}")
    _WORLD = GroupCoordinator("world", list(range(world_size)), rank, dist.group.WORLD)
    _GROUPS["world"] = _WORLD
    return _WORLD


def initialize_model_parallel(tensor_model_parallel_size: int = 1, backend: str | None = None,
                              communicator_cls: type | None = None,
                              enable_expert_parallel: bool = False) -> GroupCoordinator:
    """Split the world into tensor-parallel groups of consecutive ranks; every rank must call it. `communicator_cls`:
    the device communicator class of the tensor-parallel group (a platform's `get_device_communicator_cls()`,
    resolved), built as vLLM's GroupCoordinator builds it; default the reference communicator.
    `enable_expert_parallel`: also an expert-parallel group of the same ranks (get_ep_group), its communicator built
    with `unique_name` "ep:0" and `use_all2all=False`, as vLLM builds it with data parallelism 1."""
    global _TP, _EP
    if _TP is not None:
        raise ParallelStateError("the tensor-parallel group is already initialized; call "
                                 "destroy_model_parallel() first")
    if _WORLD is None:
        if tensor_model_parallel_size != 1:
            raise ParallelStateError(f"tensor_model_parallel_size={tensor_model_parallel_size} needs "
                                     "init_distributed_environment(world_size, rank) first")
        _TP = _single_rank_group("tp")
        _GROUPS["tp"] = _TP
        return _TP
    world_size = _WORLD.world_size
    if tensor_model_parallel_size < 1 or world_size % tensor_model_parallel_size:
        raise ParallelStateError(f"world size {world_size} is not divisible by tensor_model_parallel_size="
                                 f"{tensor_model_parallel_size}")
    _TP = _build_groups("tp", tensor_model_parallel_size, backend, communicator_cls, {})
    _GROUPS["tp"] = _TP
    if enable_expert_parallel and tensor_model_parallel_size > 1:
        # after every tp group: every rank creates the groups in the same order (torch.distributed requires it)
        _EP = _build_groups("ep", tensor_model_parallel_size, backend, communicator_cls, {"use_all2all": False})
        _GROUPS["ep"] = _EP
    return _TP


def _build_groups(name: str, size: int, backend: str | None, communicator_cls: type | None,
                  extra: dict) -> GroupCoordinator:
    """Groups `name` of `size` consecutive ranks over the world; this rank's, its communicator built with
    `unique_name` "<name>:0" (and `extra`) as vLLM's GroupCoordinator builds it (without a class: the reference
    communicator, which GroupCoordinator builds itself)."""
    mine = None
    for start in range(0, _WORLD.world_size, size):
        ranks = list(range(start, start + size))
        # every rank creates every group (torch.distributed requires it), keeps its own
        group = dist.new_group(ranks, backend=backend) if size > 1 else None
        if _WORLD.rank in ranks:
            comm = None
            if communicator_cls is not None and group is not None:
                comm = communicator_cls(cpu_group=group, device=None, device_group=group, unique_name=f"{name}:0",
                                        **extra)
            mine = GroupCoordinator(name, ranks, _WORLD.rank, group, comm)
    return mine


def model_parallel_is_initialized() -> bool:
    return _TP is not None


def get_tp_group() -> GroupCoordinator:
    """The tensor-parallel group; a single-rank group when nothing was initialized."""
    return _TP if _TP is not None else _DEFAULT_TP


def get_ep_group() -> GroupCoordinator:
    """The expert-parallel group (the tensor-parallel ranks, with `enable_expert_parallel`); a single-rank group
    when expert parallelism is off."""
    return _EP if _EP is not None else _DEFAULT_EP


def expert_parallel_is_enabled() -> bool:
    """Whether initialize_model_parallel built an expert-parallel group of more than one rank."""
    return _EP is not None and _EP.world_size > 1


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank_in_group


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    return get_tp_group().all_reduce(x)


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return get_tp_group().all_gather(x, dim)


def tensor_model_parallel_gather(x: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
    return get_tp_group().gather(x, dst, dim)


def tensor_model_parallel_broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    return get_tp_group().broadcast(x, src)


def destroy_model_parallel() -> None:
    """Forget the tensor- and expert-parallel groups (torch.distributed groups are freed with the process group)."""
    global _TP, _EP
    _TP = _EP = None
    _GROUPS.pop("tp", None)
    _GROUPS.pop("ep", None)


def destroy_distributed_environment() -> None:
    """Forget all groups and leave torch.distributed, if this module joined it."""
    global _WORLD, _JOINED
    destroy_model_parallel()
    _WORLD = None
    _GROUPS.pop("world", None)
    if _JOINED and dist.is_initialized():
        dist.destroy_process_group()
    _JOINED = False


@contextlib.contextmanager
def single_rank_tensor_parallel() -> Iterator[GroupCoordinator]:
    """Inside the block the tensor-parallel group is a single rank, whatever was initialized, and so is the
    expert-parallel group (its ranks are the tensor-parallel ones)."""
    global _TP, _EP
    saved = _TP, _EP
    _TP, _EP = _DEFAULT_TP, None
    try:
        yield _TP
    finally:
        _TP, _EP = saved


@contextlib.contextmanager
def simulated_tensor_parallel(rank: int, world_size: int) -> Iterator[GroupCoordinator]:
    """Layers built inside the block see rank `rank` of `world_size` without any process group.

    For inspecting sharding and weight loading in one process; collectives on this group raise
    ParallelStateError.
    """
    global _TP
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} / world size {world_size}: need 0 <= rank < world_size")
    saved = _TP
    _TP = GroupCoordinator(f"simulated-tp{world_size}", list(range(world_size)), rank, None)
    try:
        yield _TP
    finally:
        _TP = saved


_DEFAULT_TP = _single_rank_group("tp-single")
_GROUPS["tp-single"] = _DEFAULT_TP
_DEFAULT_EP = _single_rank_group("ep-single")
_GROUPS["ep-single"] = _DEFAULT_EP

