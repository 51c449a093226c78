"""Linear layers: the product and bias semantics, sharding by rank (simulated), loaders, errors, cases.

Multi-rank forward passes (all-reduce, all-gather) run in tests/runtime/test_distributed.py.
"""

from __future__ import annotations

import copy

import pytest
import torch

from _layer_support import f64
from reference_impl.custom_op import CustomOp
from reference_impl.distributed import ParallelStateError, simulated_tensor_parallel
from reference_impl.layers.cases import conformance_of
from reference_impl.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)

LAYERS = (ReplicatedLinear, ColumnParallelLinear, RowParallelLinear, MergedColumnParallelLinear, QKVParallelLinear)


def _loaded(layer, weight, bias=None):
    layer.weight_loader(layer.weight, weight)
    if bias is not None:
        layer.weight_loader(layer.bias, bias)
    return layer


def test_registered_names():
    assert CustomOp.op_registry["replicated_linear"] is ReplicatedLinear
    assert CustomOp.op_registry["column_parallel_linear"] is ColumnParallelLinear
    assert CustomOp.op_registry["row_parallel_linear"] is RowParallelLinear


@pytest.mark.parametrize("cls", [ReplicatedLinear, ColumnParallelLinear, RowParallelLinear])
def test_single_rank_is_x_wt_plus_b_with_bias_flags(cls):
    w, b, x = f64(6, 5, seed=1), f64(6, seed=2), f64(3, 5, seed=3)
    out, bias = _loaded(cls(5, 6, params_dtype=torch.float64), w, b)(x)
    assert bias is None
    torch.testing.assert_close(out, x @ w.T + b, atol=1e-12, rtol=1e-12)

    skipping = _loaded(cls(5, 6, skip_bias_add=True, params_dtype=torch.float64), w, b)
    out, bias = skipping(x)
    torch.testing.assert_close(out, x @ w.T, atol=1e-12, rtol=1e-12)
    assert bias is skipping.bias

    plain = _loaded(cls(5, 6, params_dtype=torch.float64, return_bias=False), w, b)
    torch.testing.assert_close(plain(x), x @ w.T + b, atol=1e-12, rtol=1e-12)
    no_bias = _loaded(cls(5, 6, bias=False, params_dtype=torch.float64, return_bias=False), w)
    assert no_bias.bias is None
    torch.testing.assert_close(no_bias(x.reshape(3, 1, 5)), (x @ w.T).reshape(3, 1, 6), atol=1e-12, rtol=1e-12)


def test_column_parallel_shards_rows_of_weight_and_bias():
    w, b = f64(8, 3, seed=4), f64(8, seed=5)
    for rank in range(2):
        with simulated_tensor_parallel(rank, 2):
            layer = _loaded(ColumnParallelLinear(3, 8, params_dtype=torch.float64), w, b)
        assert layer.weight.shape == (4, 3) and layer.output_size_per_partition == 4
        assert torch.equal(layer.weight, w[rank * 4:(rank + 1) * 4])
        assert torch.equal(layer.bias, b[rank * 4:(rank + 1) * 4])
        x = f64(2, 3, seed=6)
        torch.testing.assert_close(layer(x)[0], (x @ w.T + b)[:, rank * 4:(rank + 1) * 4])


def test_row_parallel_shards_columns_and_takes_its_input_slice():
    w, b = f64(5, 6, seed=7), f64(5, seed=8)
    with simulated_tensor_parallel(1, 3):
        layer = _loaded(RowParallelLinear(6, 5, input_is_parallel=False, reduce_results=False, skip_bias_add=True,
                                          params_dtype=torch.float64), w, b)
    assert torch.equal(layer.weight, w[:, 2:4]) and torch.equal(layer.bias, b)   # the bias is not sharded
    x = f64(4, 6, seed=9)
    out, bias = layer(x)
    torch.testing.assert_close(out, x[:, 2:4] @ w[:, 2:4].T)   # rank 1's partial product, no bias
    assert bias is layer.bias
    with simulated_tensor_parallel(1, 3):
        reducing = _loaded(RowParallelLinear(6, 5, params_dtype=torch.float64), w, b)
    with pytest.raises(ParallelStateError, match="no process group"):
        reducing(x[:, 2:4])


def test_merged_column_parallel_keeps_each_sub_matrix_shard_in_order():
    gate, up = f64(6, 4, seed=10), f64(6, 4, seed=11)
    for rank in range(2):
        with simulated_tensor_parallel(rank, 2):
            layer = MergedColumnParallelLinear(4, [6, 6], bias=False, params_dtype=torch.float64)
        layer.weight_loader(layer.weight, gate, 0)
        layer.weight_loader(layer.weight, up, 1)
        expected = torch.cat([gate[rank * 3:(rank + 1) * 3], up[rank * 3:(rank + 1) * 3]])
        assert torch.equal(layer.weight, expected)
        fused = copy.deepcopy(layer)
        fused.weight_loader(fused.weight, torch.cat([gate, up]))   # the fused checkpoint tensor loads alike
        assert torch.equal(fused.weight, expected)
    with pytest.raises(ValueError, match="loaded_shard_id=2 is not an index into output_sizes"):
        layer.weight_loader(layer.weight, gate, 2)


def test_qkv_shards_heads_and_replicates_kv_heads_beyond_their_count():
    head, heads, kv = 2, 8, 2
    wq, wk, wv = f64(heads * head, 5, seed=12), f64(kv * head, 5, seed=13), f64(kv * head, 5, seed=14)
    for rank in range(4):
        with simulated_tensor_parallel(rank, 4):
            layer = QKVParallelLinear(5, head, heads, kv, bias=False, params_dtype=torch.float64)
        assert (layer.num_heads, layer.num_kv_heads, layer.num_kv_head_replicas) == (2, 1, 2)
        for shard_id, w in zip("qkv", (wq, wk, wv)):
            layer.weight_loader(layer.weight, w, shard_id)
        kv_head = rank // 2
        expected = torch.cat([wq[rank * 4:(rank + 1) * 4], wk[kv_head * 2:(kv_head + 1) * 2],
                              wv[kv_head * 2:(kv_head + 1) * 2]])
        assert torch.equal(layer.weight, expected), rank
    with pytest.raises(ValueError, match="loaded_shard_id='x' is not one of 'q', 'k', 'v'"):
        layer.weight_loader(layer.weight, wq, "x")
    with pytest.raises(ValueError, match="fused weight has 3 rows, expected 24"):
        layer.weight_loader(layer.weight, f64(3, 5))
    with simulated_tensor_parallel(0, 4), pytest.raises(ValueError, match="not a multiple of total_num_kv_heads=3"):
        QKVParallelLinear(5, head, 12, 3)


def test_argument_and_loading_errors_name_the_problem():
    with pytest.raises(NotImplementedError, match="quant_config must be None"):
        ReplicatedLinear(4, 4, quant_config=object())
    with pytest.raises(ValueError, match="input_size=0"):
        ColumnParallelLinear(0, 4)
    with simulated_tensor_parallel(0, 4), pytest.raises(ValueError, match="output size 6 is not divisible"):
        ColumnParallelLinear(3, 6, prefix="model.up")
    with pytest.raises(ValueError, match="reduce_results=False with a bias"):
        RowParallelLinear(4, 4, reduce_results=False)
    layer = ReplicatedLinear(4, 3, prefix="model.proj")
    with pytest.raises(ValueError, match=r"model.proj.*expected input last dim 4, got shape \(2, 5\)"):
        layer(torch.zeros(2, 5))
    with pytest.raises(ValueError, match=r"weight has shape \(3, 5\).*parameter has \(3, 4\)"):
        layer.weight_loader(layer.weight, torch.zeros(3, 5))
    other = ReplicatedLinear(4, 3)
    with pytest.raises(ValueError, match="not one of this layer's"):
        layer.weight_loader(other.weight, torch.zeros(3, 4))
    with simulated_tensor_parallel(1, 2):
        col = ColumnParallelLinear(4, 6)
    with pytest.raises(ValueError, match=r"has no rows \[3, 6\) along dim 0 for rank 1 of 2"):
        col.weight_loader(col.weight, torch.zeros(4, 4))


def test_disable_tp_keeps_the_full_weight():
    with simulated_tensor_parallel(1, 2):
        layer = ColumnParallelLinear(3, 8, disable_tp=True)
    assert layer.weight.shape == (8, 3) and layer.tp_size == 1


def _cases():
    for cls in LAYERS:
        for case in conformance_of(cls).cases:
            for dtype in (torch.float32, torch.bfloat16):
                yield pytest.param(cls, case, dtype, id=f"{cls.__name__}::{case.name}::{str(dtype)[6:]}")


@pytest.mark.parametrize("cls,case,dtype", list(_cases()))
def test_conformance_cases_track_float64(cls, case, dtype):
    """Each declared case runs, and native in `dtype` is within a few tolerances of the float64 run."""
    layer = cls(**case.make_kwargs(dtype))
    case.init_params(layer, torch.Generator().manual_seed(3))
    inputs = case.make_inputs(dtype, "cpu", torch.Generator().manual_seed(4))
    out = layer(*inputs)
    golden = copy.deepcopy(layer).to(torch.float64)(*[a.double() for a in inputs])
    outs, golds = (out, golden) if isinstance(out, tuple) else ((out,), (golden,))
    atol, rtol = conformance_of(cls).get_tolerance(dtype)
    for o, g in zip(outs, golds):
        assert o.dtype == dtype
        torch.testing.assert_close(o.double(), g, atol=4 * atol, rtol=4 * rtol)
