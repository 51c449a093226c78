"""The tensor-parallel group: single rank without init, errors, and a spawned gloo world of two ranks.

The two-rank world is started once per module (spawned processes are slow to import torch); every
scenario of tests/support/_tp_scenarios.py runs on both ranks and each test asserts one scenario's result.
"""

from __future__ import annotations

import pytest
import torch

import _tp_scenarios
from _rank_world import assert_scenario, spawn_world
from reference_impl import distributed as d
from reference_impl.distributed import ParallelStateError


# ----- one process --------------------------------------------------------------------------------
def test_single_rank_without_initialization():
    assert not d.model_parallel_is_initialized()
    group = d.get_tp_group()
    assert (group.world_size, group.rank_in_group, d.get_tensor_model_parallel_world_size(),
            d.get_tensor_model_parallel_rank()) == (1, 0, 1, 0)
    x = torch.randn(3, 4)
    assert d.tensor_model_parallel_all_reduce(x) is x
    assert d.tensor_model_parallel_all_gather(x, dim=0) is x
    assert d.tensor_model_parallel_gather(x) is x
    assert d.tensor_model_parallel_broadcast(x) is x
    assert not torch.distributed.is_initialized()


def test_initialize_single_rank_and_errors():
    with pytest.raises(ParallelStateError, match="needs init_distributed_environment"):
        d.initialize_model_parallel(2)
    group = d.initialize_model_parallel(1)
    try:
        assert d.model_parallel_is_initialized() and d.get_tp_group() is group and group.world_size == 1
        with pytest.raises(ParallelStateError, match="already initialized"):
            d.initialize_model_parallel(1)
    finally:
        d.destroy_model_parallel()
    assert not d.model_parallel_is_initialized()
    with pytest.raises(ValueError, match="need world_size >= 1"):
        d.init_distributed_environment(2, 2)


def test_divide_and_split_name_the_problem():
    assert d.divide(12, 4) == 3
    with pytest.raises(ValueError, match="output size 10 is not divisible by the tensor-parallel size 4"):
        d.divide(10, 4, "output size")
    parts = d.split_tensor_along_last_dim(torch.arange(12.0).reshape(2, 6), 3)
    assert [tuple(p.shape) for p in parts] == [(2, 2)] * 3
    with pytest.raises(ValueError, match="last dimension 6"):
        d.split_tensor_along_last_dim(torch.zeros(2, 6), 4)


def test_simulated_group_builds_shards_but_refuses_collectives():
    with d.simulated_tensor_parallel(1, 2) as group:
        assert (d.get_tensor_model_parallel_rank(), d.get_tensor_model_parallel_world_size()) == (1, 2)
        with pytest.raises(ParallelStateError, match="no process group behind it"):
            group.all_reduce(torch.ones(2))
    assert d.get_tensor_model_parallel_world_size() == 1
    with pytest.raises(ValueError, match="0 <= rank < world_size"):
        with d.simulated_tensor_parallel(2, 2):
            pass


def test_collective_ops_have_fake_kernels():
    """The opaque collectives propagate shapes without running (what torch.compile traces)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, 5)
        assert torch.ops.reference_dist.all_reduce(x, "tp").shape == (3, 5)
        assert torch.ops.reference_dist.all_gather(x, 1, 4, "tp").shape == (3, 20)
        assert torch.ops.reference_dist.broadcast(x, 0, "tp").shape == (3, 5)


# ----- two ranks (gloo) ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """{scenario: {rank: traceback or None}} from one spawned world of two ranks."""
    return spawn_world(_tp_scenarios, str(tmp_path_factory.mktemp("gloo") / "store"))


@pytest.mark.parametrize("scenario", [s.__name__ for s in _tp_scenarios.SCENARIOS])
def test_two_rank_scenario(two_ranks, scenario):
    assert_scenario(two_ranks, scenario, _tp_scenarios.WORLD_SIZE)
