"""Convolution layers of vision encoders (docs/catalog.md `conv2d` / `conv3d`).

The native semantics are exactly `F.conv2d` / `F.conv3d` with the layer's weight, bias, stride,
padding, dilation and groups (non-zero padding modes pad first with `F.pad`, like nn.ConvNd). Where
vLLM 0.32 differs (it ignores padding_mode and pads 'same' as k // 2 per side) the reference keeps
PyTorch's meaning; the cases that depend on it are marked beyond vLLM. vLLM 0.32 also takes its
patch path for kernel == stride with a dilation > 1, which ignores the dilation (wrong output size
and values, where its own F.conv path honours it): a defect, so those cases are not marked.
Patch embeddings (kernel_size == stride, no padding, dilation 1, one group) take an equivalent
unfold + matmul path, which is how vLLM runs them: the patches do not overlap, so each output
pixel is one row of `patches @ W^T`.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn
from reference_impl.ir.tolerances import CONV_TOLERANCES
from reference_impl.layers._composite import init_composite_params
from reference_impl.layers.cases import LayerCase, declare_cases

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _as_tuple(cls_name: str, what: str, value, n: int, minimum: int) -> tuple[int, ...]:
    values = (value,) * n if isinstance(value, int) else tuple(value)
    if len(values) != n or not all(isinstance(v, int) and v >= minimum for v in values):
        raise ValueError(f"{cls_name}: {what}={value!r} must be an int or {n} ints, each >= {minimum}")
    return values


class ConvLayerBase(CustomOp):
    """Shared construction of Conv2dLayer / Conv3dLayer (vLLM's ConvLayerBase arguments).

    `padding` is an int, a tuple, 'valid' (0) or 'same' (output size = input size; stride must
    be 1; PyTorch's rule, which puts the odd extra pad of an even kernel on the right). Weight
    `[out, in/groups, *kernel]` and bias `[out]` are initialised like nn.ConvNd.
    """

    num_dim: int

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, ...],
                 stride: int | tuple[int, ...] = 1,
                 padding: int | tuple[int, ...] | Literal["same", "valid"] = 0,
                 dilation: int | tuple[int, ...] = 1, groups: int = 1, bias: bool = True,
                 padding_mode: Literal["zeros", "reflect", "replicate", "circular"] = "zeros", *,
                 params_dtype: torch.dtype | None = None, enforce_enable: bool = False) -> None:
        super().__init__(enforce_enable=enforce_enable)
        name, n = type(self).__name__, self.num_dim
        if not (isinstance(in_channels, int) and isinstance(out_channels, int) and in_channels > 0
                and out_channels > 0):
            raise ValueError(f"{name}: in_channels={in_channels!r} and out_channels={out_channels!r} must be "
                             f"positive ints")
        if not isinstance(groups, int) or groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError(f"{name}: groups={groups!r} must be positive and divide in_channels={in_channels} "
                             f"and out_channels={out_channels}")
        if padding_mode not in PADDING_MODES:
            raise ValueError(f"{name}: padding_mode={padding_mode!r} is not one of {PADDING_MODES}")
        self.kernel_size = _as_tuple(name, "kernel_size", kernel_size, n, 1)
        self.stride = _as_tuple(name, "stride", stride, n, 1)
        self.dilation = _as_tuple(name, "dilation", dilation, n, 1)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"{name}: padding={padding!r} must be 'same', 'valid', an int or {n} ints")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError(f"{name}: padding='same' needs stride 1, got stride={self.stride}")
            self.padding: tuple[int, ...] | str = (0,) * n if padding == "valid" else "same"
        else:
            self.padding = _as_tuple(name, "padding", padding, n, 0)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.groups = groups
        self.padding_mode = padding_mode
        self.enable_linear = (self.kernel_size == self.stride and self.padding == (0,) * n and groups == 1
                              and self.dilation == (1,) * n)
        self.input_size = in_channels * math.prod(self.kernel_size)

        dtype = params_dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_channels, dtype=dtype)) if bias else None
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        # nn.ConvNd's default: kaiming-uniform(a=sqrt(5)) weight, bias uniform in +-1/sqrt(fan_in).
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.weight[0].numel())
            nn.init.uniform_(self.bias, -bound, bound)

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() != self.num_dim + 2 or x.shape[1] != self.in_channels:
            raise ValueError(f"{type(self).__name__} expects x of shape (batch, {self.in_channels}, "
                             f"{self.num_dim} spatial dims), got {tuple(x.shape)}")
        small = [s for s, k, d in zip(x.shape[2:], self.kernel_size, self.dilation) if s < (k - 1) * d + 1]
        if self.enable_linear and small:
            raise ValueError(f"{type(self).__name__}: input {tuple(x.shape)} is smaller than the kernel "
                             f"{self.kernel_size}")

    def _forward_mulmat(self, x: torch.Tensor) -> torch.Tensor:
        """Non-overlapping patches: unfold each spatial dim into (count, kernel), one matmul, fold back."""
        n = self.num_dim
        batch = x.shape[0]
        for d, k in enumerate(self.kernel_size):
            x = x.unfold(2 + d, k, k)               # [B, C, n_1.., k_1..]: windows appended at the end
        counts = x.shape[2:2 + n]
        # [B, n_1.., C, k_1..] so one row is a patch in the weight's (C, k_1, ..) order.
        x = x.permute(0, *range(2, 2 + n), 1, *range(2 + n, 2 + 2 * n)).reshape(-1, self.input_size)
        out = F.linear(x, self.weight.reshape(self.out_channels, self.input_size), self.bias)
        return out.view(batch, *counts, self.out_channels).permute(0, n + 1, *range(1, n + 1))

    def _forward_conv(self, x: torch.Tensor) -> torch.Tensor:
        conv = F.conv2d if self.num_dim == 2 else F.conv3d
        padding = self.padding
        if self.padding_mode != "zeros" or padding == "same":
            mode = "constant" if self.padding_mode == "zeros" else self.padding_mode
            x = F.pad(x, self._explicit_pad(), mode=mode)
            padding = 0
        return conv(x, self.weight, self.bias, stride=self.stride, padding=padding, dilation=self.dilation,
                    groups=self.groups)

    def _explicit_pad(self) -> tuple[int, ...]:
        """F.pad's (last dim first) pairs for the layer's padding; 'same' splits like PyTorch's conv."""
        pairs = []
        for i in reversed(range(self.num_dim)):
            if self.padding == "same":
                total = self.dilation[i] * (self.kernel_size[i] - 1)
                pairs += [total // 2, total - total // 2]
            else:
                pairs += [self.padding[i], self.padding[i]]
        return tuple(pairs)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return self._forward_mulmat(x) if self.enable_linear else self._forward_conv(x)

    def extra_repr(self) -> str:
        return (f"in_channels={self.in_channels}, out_channels={self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"bias={self.bias is not None}, padding_mode={self.padding_mode!r}")


@CustomOp.register("conv2d")
class Conv2dLayer(ConvLayerBase):
    """Conv2d on `x = (batch, in_channels, height, width)`; equals F.conv2d (see the module docstring)."""

    num_dim = 2


@CustomOp.register("conv3d")
class Conv3dLayer(ConvLayerBase):
    """Conv3d on `x = (batch, in_channels, time, height, width)`; equals F.conv3d."""

    num_dim = 3


# ----- conformance cases --------------------------------------------------------------------------
def _conv_fan_in(name: str, shape: torch.Size) -> int:
    return math.prod(shape[1:])


def _init_conv(layer, gen):
    init_composite_params(layer, gen, fan_in=_conv_fan_in)


# vLLM 0.32's ConvLayerBase ignores padding_mode (always zero padding) and turns 'same' into k // 2 per
# side (for an even kernel the output grows by one); the reference follows nn.ConvNd there.
PADDING_MODE_BEYOND_VLLM = "padding_mode other than 'zeros': vLLM 0.32 ignores it and pads with zeros"
EVEN_SAME_BEYOND_VLLM = ("padding='same' with an even kernel: vLLM 0.32 pads k // 2 on both sides, so its output is "
                         "one larger than PyTorch's 'same'")


def _conv_case(name, batch, spatial, kwargs, *, level="quick", beyond_vllm=None):
    def make_inputs(dtype, device, gen):
        return (randn((batch, kwargs["in_channels"], *spatial), dtype, device, gen),)

    return LayerCase(name, lambda dtype: {**kwargs, "params_dtype": dtype}, make_inputs, init_params=_init_conv,
                     level=level, beyond_vllm=beyond_vllm)


declare_cases(Conv2dLayer, tolerances=CONV_TOLERANCES, cases=[
    _conv_case("patch=4,c=3->16,8x8", 2, (8, 8), {"in_channels": 3, "out_channels": 16, "kernel_size": 4,
                                      "stride": 4}),
    _conv_case("patch=(2,4),no_bias,c=4->8,9x10", 1, (9, 10),
   {"in_channels": 4, "out_channels": 8, "kernel_size": (2, 4), "stride": (2, 4), "bias": False}),
    _conv_case("k=3,pad=1,c=4->6,7x9", 2, (7, 9), {"in_channels": 4, "out_channels": 6, "kernel_size": 3,
                                       "padding": 1}),
    _conv_case("k=3,stride=2,dilation=2,groups=2,c=4->6,11x11", 1, (11, 11),
   {"in_channels": 4, "out_channels": 6, "kernel_size": 3, "stride": 2, "dilation": 2, "groups": 2}),
    _conv_case("k=(2,3),same,reflect,c=3->5,6x7", 1, (6, 7),
               {"in_channels": 3, "out_channels": 5, "kernel_size": (2, 3), "padding": "same",
                "padding_mode": "reflect"}, beyond_vllm=f"{EVEN_SAME_BEYOND_VLLM}; {PADDING_MODE_BEYOND_VLLM}"),
    _conv_case("k=3,same,c=3->4,6x7", 1, (6, 7), {"in_channels": 3, "out_channels": 4, "kernel_size": 3,
                                                   "padding": "same"}),
    # kernel == stride with a dilation: F.conv2d's dilated taps (3x3 out of 8x8); vLLM 0.32's patch path ignores it
    _conv_case("k=2,stride=2,dilation=2,c=3->8,8x8", 1, (8, 8), {"in_channels": 3, "out_channels": 8,
                                                                  "kernel_size": 2, "stride": 2, "dilation": 2}),
    _conv_case("patch=14,c=3->64,28x28", 2, (28, 28), {"in_channels": 3, "out_channels": 64, "kernel_size": 14,
                                           "stride": 14}, level="standard"),
])

declare_cases(Conv3dLayer, tolerances=CONV_TOLERANCES, cases=[
    _conv_case("patch=(2,4,4),c=3->8,4x8x8", 2, (4, 8, 8),
   {"in_channels": 3, "out_channels": 8, "kernel_size": (2, 4, 4), "stride": (2, 4, 4)}),
    _conv_case("patch=2,no_bias,c=2->4,3x5x4", 1, (3, 5, 4),
   {"in_channels": 2, "out_channels": 4, "kernel_size": 2, "stride": 2, "bias": False}),
    _conv_case("k=3,pad=1,c=2->4,4x5x5", 1, (4, 5, 5), {"in_channels": 2, "out_channels": 4, "kernel_size": 3,
                                            "padding": 1}),
    _conv_case("k=(1,3,3),stride=(1,2,2),replicate,pad=(0,1,1),groups=2,c=4->4,2x6x6", 1, (2, 6, 6),
   {"in_channels": 4, "out_channels": 4, "kernel_size": (1, 3, 3), "stride": (1, 2, 2),
    "padding": (0, 1, 1), "padding_mode": "replicate", "groups": 2}, beyond_vllm=PADDING_MODE_BEYOND_VLLM),
    _conv_case("k=2,stride=2,dilation=2,c=2->4,6x8x8", 1, (6, 8, 8), {"in_channels": 2, "out_channels": 4,
                                                                       "kernel_size": 2, "stride": 2, "dilation": 2}),
    _conv_case("patch=(2,14,14),c=3->32,4x28x28", 1, (4, 28, 28),
   {"in_channels": 3, "out_channels": 32, "kernel_size": (2, 14, 14), "stride": (2, 14, 14)},
   level="standard"),
])
