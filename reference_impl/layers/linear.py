"""Linear layers over the tensor-parallel group: replicated, column-parallel and row-parallel.

Weights are stored as in `torch.nn.Linear`: `[output_size_per_partition, input_size_per_partition]`,
so `y = x W^T + b` (vLLM's docstrings write the same product as `Y = XA + b` with `A = W^T`).
`forward` returns `output`, or `(output, output_bias)` when `return_bias` (the default, as in vLLM);
`output_bias` is the bias when `skip_bias_add` (which leaves it out of `output`), else None.
`weight_loader(param, loaded_weight[, loaded_shard_id])` copies this rank's shard of a full
checkpoint tensor into `param` (the layer's `weight` or `bias`). The product runs through
`cpu_gemm.linear`: F.linear, or a prepacked oneDNN GEMM a runtime installed (layers/cpu_gemm.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from reference_impl.custom_op import PluggableLayer
from reference_impl.distributed import GroupCoordinator, divide, get_tp_group
from reference_impl.distributed.parallel_state import _DEFAULT_TP
from reference_impl.ir.cases import randn, strided
from reference_impl.ir.tolerances import LINEAR_TOLERANCES
from reference_impl.layers import cpu_gemm
from reference_impl.layers.cases import LayerCase, declare_cases


def _parameter(shape: Sequence[int], dtype: torch.dtype | None) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape, dtype=dtype or torch.get_default_dtype()), requires_grad=False)


class LinearBase(PluggableLayer):
    """Shared arguments, bias handling and loading of the linear layers (PluggableLayers, as in vLLM 0.32:
    a plugin replaces the whole class; `forward` is `forward_native`).

    `disable_tp=True` makes the layer use a single-rank group whatever the tensor-parallel size is.
    Quantization is not part of the reference: a `quant_config` raises NotImplementedError.
    """

    computes_through_cpu_gemm = True   # cpu_gemm.pack_cpu_gemms may prepack its weight

    def __init__(self, input_size: int, output_size: int, skip_bias_add: bool = False,
                 params_dtype: torch.dtype | None = None, quant_config=None, prefix: str = "", *,
                 return_bias: bool = True, disable_tp: bool = False):
        super().__init__()
        if quant_config is not None:
            raise NotImplementedError(f"{type(self).__name__}({prefix!r}): quantized linear layers are not part of "
                                      "the reference implementation (quant_config must be None)")
        if input_size <= 0 or output_size <= 0:
            raise ValueError(f"{type(self).__name__}({prefix!r}): input_size={input_size} and "
                             f"output_size={output_size} must be positive")
        self.input_size = input_size
        self.output_size = output_size
        self.skip_bias_add = skip_bias_add
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.prefix = prefix
        self.return_bias = return_bias
        self.disable_tp = disable_tp
        self.tp_group: GroupCoordinator = _DEFAULT_TP if disable_tp else get_tp_group()
        self.tp_rank = self.tp_group.rank_in_group
        self.tp_size = self.tp_group.world_size

    def _result(self, output: torch.Tensor):
        if not self.return_bias:
            return output
        return output, (self.bias if self.skip_bias_add else None)

    def _check_input(self, x: torch.Tensor, expected: int) -> None:
        if x.shape[-1] != expected:
            raise ValueError(f"{type(self).__name__}({self.prefix!r}) expected input last dim {expected}, got "
                             f"shape {tuple(x.shape)}")

    def _param_name(self, param: nn.Parameter) -> str:
        for name, p in self.named_parameters(recurse=False):
            if p is param:
                return name
        raise ValueError(f"{type(self).__name__}({self.prefix!r}): the parameter given to weight_loader is not "
                         "one of this layer's")

    def _copy_shard(self, param: nn.Parameter, shard: torch.Tensor, what: str) -> None:
        if tuple(shard.shape) != tuple(param.shape):
            raise ValueError(f"{type(self).__name__}({self.prefix!r}): {what} has shape {tuple(shard.shape)} for "
                             f"rank {self.tp_rank} of {self.tp_size}, the parameter has {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(shard)

    def _narrow(self, loaded: torch.Tensor, dim: int, start: int, size: int, what: str) -> torch.Tensor:
        if loaded.dim() <= dim or loaded.shape[dim] < start + size:
            raise ValueError(f"{type(self).__name__}({self.prefix!r}): {what} of shape {tuple(loaded.shape)} has no "
                             f"rows [{start}, {start + size}) along dim {dim} for rank {self.tp_rank} of "
                             f"{self.tp_size}")
        return loaded.narrow(dim, start, size)

    def extra_repr(self) -> str:
        return (f"in_features={self.input_size}, output_features={self.output_size}, "
                f"bias={self.bias is not None}, tp_size={self.tp_size}")


@PluggableLayer.register("replicated_linear")
class ReplicatedLinear(LinearBase):
    """`y = x W^T + b` with the full weight on every rank (`disable_tp` has no effect)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = True, skip_bias_add: bool = False,
                 params_dtype: torch.dtype | None = None, quant_config=None, prefix: str = "", *,
                 return_bias: bool = True, disable_tp: bool = False):
        super().__init__(input_size, output_size, skip_bias_add, params_dtype, quant_config, prefix,
                         return_bias=return_bias, disable_tp=disable_tp)
        self.weight = _parameter((output_size, input_size), params_dtype)
        self.bias = _parameter((output_size,), params_dtype) if bias else None

    def forward_native(self, x: torch.Tensor):
        self._check_input(x, self.input_size)
        output = cpu_gemm.linear(self, x, self.weight, None if self.skip_bias_add else self.bias)
        return self._result(output)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        self._copy_shard(param, loaded_weight, self._param_name(param))


@PluggableLayer.register("column_parallel_linear")
class ColumnParallelLinear(LinearBase):
    """Output dimension sharded: rank r holds rows `[r*n, (r+1)*n)` of W (and of the bias).

    `forward` gives this rank's `x W_r^T + b_r`, or with `gather_output` the full output
    (all-gather along the last dimension). With `skip_bias_add` the returned bias is this rank's shard.
    `output_sizes` (default `[output_size]`) lists the logical sub-matrices stacked along the output
    dimension; each is sharded separately (see MergedColumnParallelLinear).
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = True, gather_output: bool = False,
                 skip_bias_add: bool = False, params_dtype: torch.dtype | None = None, quant_config=None,
                 prefix: str = "", *, return_bias: bool = True, disable_tp: bool = False, tp_rank: int | None = None,
                 tp_size: int | None = None, output_sizes: list[int] | None = None):
        super().__init__(input_size, output_size, skip_bias_add, params_dtype, quant_config, prefix,
                         return_bias=return_bias, disable_tp=disable_tp)
        if (tp_rank, tp_size) != (None, None) and (tp_rank, tp_size) != (self.tp_rank, self.tp_size):
            raise NotImplementedError(f"{type(self).__name__}({prefix!r}): tp_rank={tp_rank}, tp_size={tp_size} other "
                                      f"than the tensor-parallel group's ({self.tp_rank} of {self.tp_size}) are not "
                                      "part of the reference")
        self.gather_output = gather_output
        self.output_sizes = list(output_sizes) if output_sizes is not None else [output_size]
        if sum(self.output_sizes) != output_size:
            raise ValueError(f"{type(self).__name__}({prefix!r}): output_sizes {self.output_sizes} do not add up "
                             f"to output_size={output_size}")
        self.output_partition_sizes = [divide(s, self.tp_size, f"{type(self).__name__}({prefix!r}) output size")
                                       for s in self.output_sizes]
        self.output_size_per_partition = sum(self.output_partition_sizes)
        self.weight = _parameter((self.output_size_per_partition, input_size), params_dtype)
        self.bias = _parameter((self.output_size_per_partition,), params_dtype) if bias else None

    def forward_native(self, x: torch.Tensor):
        self._check_input(x, self.input_size)
        output = cpu_gemm.linear(self, x, self.weight, None if self.skip_bias_add else self.bias)
        if self.gather_output:
            output = self.tp_group.all_gather(output, dim=-1)
        return self._result(output)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      loaded_shard_id: int | None = None) -> None:
        """Load the full checkpoint tensor, or with `loaded_shard_id` the full sub-matrix of that index."""
        name = self._param_name(param)
        if loaded_shard_id is None and len(self.output_sizes) == 1:
            n = self.output_size_per_partition
            self._copy_shard(param, self._narrow(loaded_weight, 0, self.tp_rank * n, n, name), name)
            return
        if loaded_shard_id is None:   # a fused checkpoint tensor: split it into its sub-matrices
            if loaded_weight.shape[0] != self.output_size:
                raise ValueError(f"{type(self).__name__}({self.prefix!r}): fused {name} has {loaded_weight.shape[0]} "
                                 f"rows, expected output_size={self.output_size}")
            for index, part in enumerate(torch.split(loaded_weight, self.output_sizes, dim=0)):
                self.weight_loader(param, part, index)
            return
        self._load_sub(param, loaded_weight, self._shard_index(loaded_shard_id), name)

    def _shard_index(self, loaded_shard_id) -> int:
        if not isinstance(loaded_shard_id, int) or not 0 <= loaded_shard_id < len(self.output_sizes):
            raise ValueError(f"{type(self).__name__}({self.prefix!r}): loaded_shard_id={loaded_shard_id!r} is not an "
                             f"index into output_sizes {self.output_sizes}")
        return loaded_shard_id

    def _load_sub(self, param: nn.Parameter, loaded: torch.Tensor, index: int, name: str,
                  shard_rank: int | None = None) -> None:
        size = self.output_partition_sizes[index]
        offset = sum(self.output_partition_sizes[:index])
        rank = self.tp_rank if shard_rank is None else shard_rank
        what = f"{name} shard {index}"
        shard = self._narrow(loaded, 0, rank * size, size, what)
        target = param.narrow(0, offset, size)
        if tuple(shard.shape) != tuple(target.shape):
            raise ValueError(f"{type(self).__name__}({self.prefix!r}): {what} has shape {tuple(shard.shape)}, the "
                             f"parameter slice has {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(shard)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel matrices stacked along the output (gate and up projections, for example).

    Each rank holds its shard of every sub-matrix, in order, so an elementwise op over the halves
    (SiluAndMul) works per rank. Load each with `weight_loader(param, w, loaded_shard_id=i)`.
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = True, gather_output: bool = False,
                 skip_bias_add: bool = False, params_dtype: torch.dtype | None = None, quant_config=None,
                 prefix: str = "", *, return_bias: bool = True, disable_tp: bool = False):
        super().__init__(input_size, sum(output_sizes), bias, gather_output, skip_bias_add, params_dtype,
                         quant_config, prefix, return_bias=return_bias, disable_tp=disable_tp,
                         output_sizes=output_sizes)


class QKVParallelLinear(ColumnParallelLinear):
    """The fused query/key/value projection, sharded by attention heads.

    Rank r holds its `num_heads = total_num_heads / tp` query heads, then its key and value heads.
    When the tensor-parallel size exceeds `total_num_kv_heads`, each KV head is replicated on
    `tp / total_num_kv_heads` consecutive ranks. Shard ids are "q", "k", "v".
    """

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: int | None = None, bias: bool = True, skip_bias_add: bool = False,
                 params_dtype: torch.dtype | None = None, quant_config=None, prefix: str = "", *,
                 return_bias: bool = True, disable_tp: bool = False):
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        tp_size = 1 if disable_tp else get_tp_group().world_size
        num_heads = divide(total_num_heads, tp_size, f"QKVParallelLinear({prefix!r}) total_num_heads")
        if tp_size >= total_num_kv_heads:   # fewer KV heads than ranks: replicate each KV head
            if tp_size % total_num_kv_heads:
                raise ValueError(f"QKVParallelLinear({prefix!r}): tensor-parallel size {tp_size} is not a multiple "
                                 f"of total_num_kv_heads={total_num_kv_heads}")
            num_kv_heads, kv_replicas = 1, tp_size // total_num_kv_heads
        else:
            num_kv_heads = divide(total_num_kv_heads, tp_size, f"QKVParallelLinear({prefix!r}) total_num_kv_heads")
            kv_replicas = 1
        q_size, kv_size = num_heads * head_size * tp_size, num_kv_heads * head_size * tp_size
        super().__init__(hidden_size, q_size + 2 * kv_size, bias, False, skip_bias_add, params_dtype, quant_config,
                         prefix, return_bias=return_bias, disable_tp=disable_tp,
                         output_sizes=[q_size, kv_size, kv_size])
        self.hidden_size = hidden_size
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.num_kv_head_replicas = kv_replicas

    _SHARD_IDS = {"q": 0, "k": 1, "v": 2}

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      loaded_shard_id: str | None = None) -> None:
        """Load the fused checkpoint tensor, or with `loaded_shard_id` "q", "k" or "v" the full projection."""
        name = self._param_name(param)
        if loaded_shard_id is None:
            sizes = [self.total_num_heads * self.head_size] + [self.total_num_kv_heads * self.head_size] * 2
            if loaded_weight.shape[0] != sum(sizes):
                raise ValueError(f"QKVParallelLinear({self.prefix!r}): fused {name} has {loaded_weight.shape[0]} rows, "
                                 f"expected {sum(sizes)} (q {sizes[0]} + k {sizes[1]} + v {sizes[2]})")
            for shard_id, part in zip("qkv", torch.split(loaded_weight, sizes, dim=0)):
                self.weight_loader(param, part, shard_id)
            return
        if loaded_shard_id not in self._SHARD_IDS:
            raise ValueError(f"QKVParallelLinear({self.prefix!r}): loaded_shard_id={loaded_shard_id!r} is not one of "
                             "'q', 'k', 'v'")
        index = self._SHARD_IDS[loaded_shard_id]
        shard_rank = self.tp_rank if index == 0 else self.tp_rank // self.num_kv_head_replicas
        self._load_sub(param, loaded_weight, index, f"{name} '{loaded_shard_id}'", shard_rank)


@PluggableLayer.register("row_parallel_linear")
class RowParallelLinear(LinearBase):
    """Input dimension sharded: rank r holds columns `[r*n, (r+1)*n)` of W; the bias is not sharded.

    With `input_is_parallel` (default) `x` is already this rank's slice of the input, otherwise the
    layer takes its slice. Each rank computes `x_r W_r^T`; with `reduce_results` (default) the
    partial products are summed over the group (all-reduce) and the bias added once (by rank 0,
    before the reduction). Without `reduce_results` a bias must be skipped (`skip_bias_add`), since
    adding it to every partial sum would count it `tp` times.
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = True, input_is_parallel: bool = True,
                 skip_bias_add: bool = False, params_dtype: torch.dtype | None = None, reduce_results: bool = True,
                 quant_config=None, prefix: str = "", *, return_bias: bool = True, disable_tp: bool = False):
        super().__init__(input_size, output_size, skip_bias_add, params_dtype, quant_config, prefix,
                         return_bias=return_bias, disable_tp=disable_tp)
        if not reduce_results and bias and not skip_bias_add:
            raise ValueError(f"RowParallelLinear({prefix!r}): reduce_results=False with a bias that is added "
                             "(skip_bias_add=False) would add the bias on every rank; skip it or reduce")
        self.input_is_parallel = input_is_parallel
        self.reduce_results = reduce_results
        self.input_size_per_partition = divide(input_size, self.tp_size, f"RowParallelLinear({prefix!r}) input size")
        self.weight = _parameter((output_size, self.input_size_per_partition), params_dtype)
        self.bias = _parameter((output_size,), params_dtype) if bias else None

    def forward_native(self, x: torch.Tensor):
        if self.input_is_parallel:
            self._check_input(x, self.input_size_per_partition)
            x_parallel = x
        else:
            self._check_input(x, self.input_size)
            n = self.input_size_per_partition
            x_parallel = x[..., self.tp_rank * n:(self.tp_rank + 1) * n]
        add_bias = self.bias is not None and not self.skip_bias_add and self.tp_rank == 0
        output = cpu_gemm.linear(self, x_parallel, self.weight, self.bias if add_bias else None)
        if self.reduce_results:
            output = self.tp_group.all_reduce(output)
        return self._result(output)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        name = self._param_name(param)
        if param is self.weight:
            n = self.input_size_per_partition
            loaded_weight = self._narrow(loaded_weight, 1, self.tp_rank * n, n, name)
        self._copy_shard(param, loaded_weight, name)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", input_is_parallel={self.input_is_parallel}, reduce_results={self.reduce_results}"


# ----- conformance cases (single rank: the harness runs one process) --------------------------------
def _init_linear(layer: nn.Module, gen: torch.Generator) -> None:
    """Weights ~ N(0, 1/fan_in) and biases ~ N(0, 0.1): outputs of order one."""
    with torch.no_grad():
        for name, p in layer.named_parameters():
            fan_in = p.shape[-1] if name.endswith("weight") else 100
            p.copy_((torch.randn(p.shape, generator=gen) / fan_in ** 0.5).to(p.dtype))


def _linear_case(name, tokens, in_size, out_size, *, layout=None, level="quick", **kwargs):
    def make_inputs(dtype, device, gen):
        x = randn((tokens, in_size), dtype, device, gen)
        return (strided(x) if layout == "strided" else x,)

    kwargs.setdefault("return_bias", False)
    return LayerCase(name, lambda dtype: {"input_size": in_size, "output_size": out_size, "params_dtype": dtype,
                                          **kwargs}, make_inputs, init_params=_init_linear, level=level)


def _cases(extra=()):
    return [
        _linear_case("tokens=7,in=65,out=33,bias", 7, 65, 33),
        _linear_case("tokens=5,in=64,out=96,no_bias", 5, 64, 96, bias=False),
        _linear_case("tokens=4,in=48,out=40,strided", 4, 48, 40, layout="strided"),
        _linear_case("tokens=3,in=32,out=24,skip_bias_add", 3, 32, 24, skip_bias_add=True, return_bias=True),
        _linear_case("tokens=1,in=1,out=1", 1, 1, 1),
        *extra,
        _linear_case("tokens=33,in=1024,out=1536,bias", 33, 1024, 1536, level="standard"),
    ]


declare_cases(ReplicatedLinear, tolerances=LINEAR_TOLERANCES,
              cases=_cases())
declare_cases(ColumnParallelLinear, tolerances=LINEAR_TOLERANCES,
              cases=_cases([_linear_case("tokens=6,in=40,out=56,gather_output", 6, 40, 56,
                                         gather_output=True)]))
declare_cases(RowParallelLinear, tolerances=LINEAR_TOLERANCES,
              cases=_cases([_linear_case("tokens=6,in=40,out=56,input_not_parallel", 6, 40, 56,
                                         input_is_parallel=False)]))


def _merged_case(name, tokens, in_size, sizes, **kwargs):
    def make_inputs(dtype, device, gen):
        return (randn((tokens, in_size), dtype, device, gen),)

    return LayerCase(name, lambda dtype: {"input_size": in_size, "output_sizes": sizes, "params_dtype": dtype,
                                          "return_bias": False, **kwargs}, make_inputs, init_params=_init_linear)


def _qkv_case(name, tokens, hidden, head_size, heads, kv_heads, **kwargs):
    def make_inputs(dtype, device, gen):
        return (randn((tokens, hidden), dtype, device, gen),)

    return LayerCase(name, lambda dtype: {"hidden_size": hidden, "head_size": head_size, "total_num_heads": heads,
                                          "total_num_kv_heads": kv_heads, "params_dtype": dtype,
                                          "return_bias": False, **kwargs}, make_inputs, init_params=_init_linear)


# Unregistered subclasses (they share the registered name of ColumnParallelLinear) with their own arguments.
declare_cases(MergedColumnParallelLinear, tolerances=LINEAR_TOLERANCES, cases=[
    _merged_case("tokens=5,in=65,sizes=64+64", 5, 65, [64, 64]),
    _merged_case("tokens=3,in=32,sizes=16+48,no_bias", 3, 32, [16, 48], bias=False),
])
declare_cases(QKVParallelLinear, tolerances=LINEAR_TOLERANCES, cases=[
    _qkv_case("tokens=5,hidden=65,heads=4,kv=2,head=16", 5, 65, 16, 4, 2),
    _qkv_case("tokens=3,hidden=32,heads=2,kv=2,head=8,no_bias", 3, 32, 8, 2, 2, bias=False),
])
