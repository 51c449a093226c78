"""Tensor parallelism on torch.distributed: the group, its collectives and the `tensor_model_parallel_*` API.

World size 1 needs no initialization. For more ranks, each process calls
`init_distributed_environment(world_size, rank, init_method, backend="gloo")` and then
`initialize_model_parallel(tensor_model_parallel_size)` (with `enable_expert_parallel=True` also the expert-parallel
group over the same ranks, which FusedMoE splits its experts by).
"""

from reference_impl.distributed.parallel_state import (
    GroupCoordinator,
    ParallelStateError,
    destroy_distributed_environment,
    destroy_model_parallel,
    divide,
    expert_parallel_is_enabled,
    get_ep_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
    init_distributed_environment,
    initialize_model_parallel,
    model_parallel_is_initialized,
    simulated_tensor_parallel,
    single_rank_tensor_parallel,
    split_tensor_along_last_dim,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
    tensor_model_parallel_broadcast,
    tensor_model_parallel_gather,
)

__all__ = [
    "GroupCoordinator", "ParallelStateError", "divide", "split_tensor_along_last_dim",
    "init_distributed_environment", "initialize_model_parallel", "model_parallel_is_initialized",
    "get_tp_group", "get_ep_group", "expert_parallel_is_enabled", "get_tensor_model_parallel_world_size",
    "get_tensor_model_parallel_rank",
    "tensor_model_parallel_all_reduce", "tensor_model_parallel_all_gather", "tensor_model_parallel_gather",
    "tensor_model_parallel_broadcast", "destroy_model_parallel", "destroy_distributed_environment",
    "single_rank_tensor_parallel", "simulated_tensor_parallel",
]
