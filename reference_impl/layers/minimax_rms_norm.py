"""MiniMaxText01RMSNormTP (docs/catalog.md `minimax_text01_rmsnorm_tp`): MiniMax-Text-01's RMS norm over
a hidden dim sharded across the tensor-parallel group, vLLM 0.32's semantics and conformance cases."""

from __future__ import annotations

import torch
import torch.nn as nn

from reference_impl.custom_op import CustomOp
from reference_impl.distributed import divide, get_tp_group
from reference_impl.ir.cases import randn
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases, randomize_parameters


@CustomOp.register("minimax_text01_rmsnorm_tp")
class MiniMaxText01RMSNormTP(CustomOp):
    """`forward(x [..., hidden / tp]) -> same shape`: in float32, `variance = mean(x^2)` over this rank's
    features, averaged over the tensor-parallel group (all-reduce / tp) when tp > 1; `x * rsqrt(variance
    + eps) * weight`, cast to x's dtype (the product takes the promotion of float32 and the weight's dtype).

    The weight is this rank's `hidden_size / weight_shard_world_size` features (default: the TP size),
    in torch's default dtype. A residual is not supported (vLLM asserts; here ValueError). vLLM's class
    overrides `forward` itself, so its CustomOp dispatch never runs; here it dispatches like any CustomOp.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, weight_shard_world_size: int | None = None,
                 weight_shard_rank: int | None = None, enforce_enable: bool = False) -> None:
        super().__init__(enforce_enable=enforce_enable)
        self.tp_group = get_tp_group()
        self.tp_world = self.tp_group.world_size
        self.tp_rank = self.tp_group.rank_in_group
        self.weight_shard_world = weight_shard_world_size or self.tp_world
        self.weight_shard_rank = self.tp_rank if weight_shard_rank is None else weight_shard_rank
        per_shard = divide(hidden_size, self.weight_shard_world, "MiniMaxText01RMSNormTP hidden_size")
        self.weight = nn.Parameter(torch.ones(per_shard), requires_grad=False)
        self.variance_epsilon = eps

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if residual is not None:
            raise ValueError("MiniMaxText01RMSNormTP does not support a residual connection")
        if x.shape[-1] != self.weight.shape[0]:
            raise ValueError(f"MiniMaxText01RMSNormTP expected this rank's {self.weight.shape[0]} features, got shape "
                             f"{tuple(x.shape)}")
        orig_dtype = x.dtype
        compute = torch.promote_types(x.dtype, torch.float32)   # float64 for the golden run
        x = x.to(compute)
        variance = x.pow(2).mean(dim=-1, keepdim=True, dtype=compute)
        if self.tp_world > 1:
            variance = self.tp_group.all_reduce(variance) / self.tp_world
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        return (x * self.weight).to(orig_dtype)

    def extra_repr(self) -> str:
        return f"hidden_size={self.weight.shape[0] * self.weight_shard_world}, eps={self.variance_epsilon}"


def _case(name, tokens, hidden, *, level="quick", default_dtype=True):
    def make_inputs(dtype, device, gen):
        return (randn((tokens, hidden), dtype, device, gen),)

    return LayerCase(name, lambda dtype: {"hidden_size": hidden}, make_inputs, init_params=randomize_parameters,
                     level=level, default_dtype=default_dtype,
                     dtypes=None if default_dtype else (torch.float16, torch.bfloat16))


# Single rank here (the harness runs one process); the TP all-reduce is covered by tests/runtime/test_distributed.py.
declare_cases(MiniMaxText01RMSNormTP, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    _case("tokens=7,hidden=769", 7, 769),
    _case("tokens=5,hidden=256,weight=float32", 5, 256, default_dtype=False),
    _case("tokens=1,hidden=64", 1, 64),
    _case("tokens=16,hidden=6144", 16, 6144, level="standard"),
])
