"""QuantFP8 and GroupShape: scales and codes against float64 formulas, dequantization error,
argument variants (scale_ub, padding, column-major scales), errors, and IR dispatch."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from _layer_support import counting_provider
from reference_impl.custom_op import CustomOp
from reference_impl.layers.quantization import GroupShape, QuantFP8

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
MIN_SCALE = 1.0 / (448.0 * 512.0)


def _x(*shape, seed=0, scale=3.0, dtype=torch.float32):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _scales64(x, group_shape):
    a = x.double().abs()
    if group_shape.is_per_tensor():
        absmax = a.amax().reshape(1)
    elif group_shape.is_per_token():
        absmax = a.amax(dim=-1, keepdim=True)
    else:
        absmax = a.unflatten(-1, (-1, group_shape.col)).amax(dim=-1)
    return (absmax / FP8_MAX).clamp(min=MIN_SCALE)


def _expand(scale, x):
    if scale.shape[-1] not in (1, x.shape[-1]):
        scale = scale.repeat_interleave(x.shape[-1] // scale.shape[-1], dim=-1)
    return scale


def _codes64(x, scale):
    """fp8 codes of x / scale, with the division and clamp in float64."""
    return (x.double() / _expand(scale.double(), x)).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def _assert_codes_close(q, expected):
    """Codes equal, or one fp8 step apart where float32 and float64 round x/scale differently."""
    assert q.dtype == FP8 and q.shape == expected.shape
    a, b = q.double(), expected.double()
    step = torch.maximum(b.abs() * 2.0 ** -3, torch.full_like(b, 2.0 ** -9))
    assert ((a - b).abs() <= step).all()
    assert (a == b).double().mean() > 0.99


def _assert_dequantizes(q, scale, x):
    """|q * scale - x| within half an fp8 step (relative 2^-4, or the subnormal step 2^-10)."""
    s = _expand(scale.double(), x)
    err = (q.double() * s - x.double()).abs()
    bound = torch.maximum(x.double().abs() * 2.0 ** -4, 2.0 ** -10 * s) * 1.0001
    assert (err <= bound).all()


def test_registered_name_and_group_shapes():
    assert CustomOp.op_registry["quant_fp8"] is QuantFP8
    assert GroupShape.PER_TENSOR == (-1, -1) and GroupShape.PER_TENSOR.is_per_tensor()
    assert GroupShape.PER_TOKEN == (1, -1) and GroupShape.PER_TOKEN.is_per_token()
    assert GroupShape(1, 128).is_per_group() and not GroupShape(1, 128).is_per_token()
    assert not GroupShape(128, 128).is_per_group()


SHAPES = [GroupShape.PER_TENSOR, GroupShape.PER_TOKEN, GroupShape(1, 64)]
IDS = ["per_tensor", "per_token", "per_group=64"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("group_shape", SHAPES, ids=IDS)
def test_dynamic_scales_and_codes_match_float64(group_shape, dtype):
    x = _x(6, 256, seed=1, dtype=dtype)
    q, scale = QuantFP8(False, group_shape)(x)
    expected_scale = _scales64(x, group_shape)
    assert scale.dtype == torch.float32 and scale.shape == expected_scale.shape
    torch.testing.assert_close(scale.double(), expected_scale, rtol=1e-7, atol=0)
    _assert_codes_close(q, _codes64(x, expected_scale))
    _assert_dequantizes(q, scale, x)


@pytest.mark.parametrize("group_shape", SHAPES, ids=IDS)
def test_static_quant_uses_the_given_scale(group_shape):
    x = _x(5, 128, seed=2)
    scale = (_scales64(x, group_shape) * 1.5).float()     # deliberately not the dynamic one
    q, returned = QuantFP8(True, group_shape)(x, scale)
    assert returned is scale
    _assert_codes_close(q, _codes64(x, scale))


def test_static_saturates_at_fp8_max():
    x = torch.tensor([[1000.0, -1000.0, 1.0, 0.0]])
    q, _ = QuantFP8(True, GroupShape.PER_TENSOR)(x, torch.tensor([1.0]))
    assert q.float().tolist() == [[448.0, -448.0, 1.0, 0.0]]


def test_tiny_inputs_use_the_minimum_scale():
    x = _x(3, 128, seed=3, scale=1e-7)
    _, scale = QuantFP8(False, GroupShape.PER_TOKEN)(x)
    assert torch.all(scale == torch.tensor(MIN_SCALE, dtype=torch.float32))


def test_scale_ub_caps_dynamic_per_token_scales():
    x = _x(4, 64, seed=4, scale=10.0)
    ub = torch.tensor([2.0])
    q, scale = QuantFP8(False, GroupShape.PER_TOKEN)(x, None, ub)
    torch.testing.assert_close(scale, torch.full((4, 1), 2.0 / FP8_MAX))
    assert q.float().abs().max() == FP8_MAX               # values beyond the cap saturate


def test_column_major_group_scales_and_token_padding():
    x = _x(3, 256, seed=5)
    _, row_major = QuantFP8(False, GroupShape(1, 64))(x)
    _, col_major = QuantFP8(False, GroupShape(1, 64), column_major_scales=True)(x)
    assert torch.equal(row_major, col_major) and col_major.stride() == (1, 3)
    q, _ = QuantFP8(False, GroupShape.PER_TOKEN, num_token_padding=8)(x)
    assert q.shape == (8, 256) and torch.all(q[3:].float() == 0)
    unpadded, _ = QuantFP8(False, GroupShape.PER_TOKEN)(x)
    assert torch.equal(q[:3].view(torch.uint8), unpadded.view(torch.uint8))


@pytest.mark.parametrize("group_shape", [(128, 128), (2, -1), (1, 0)])
def test_unsupported_group_shapes_are_rejected_by_name(group_shape):
    with pytest.raises(ValueError, match=rf"group_shape={tuple(group_shape)}".replace("(", r"\(").replace(")", r"\)")):
        QuantFP8(False, group_shape)


def test_argument_errors():
    x = _x(2, 128)
    with pytest.raises(ValueError, match="needs the scale"):
        QuantFP8(True, GroupShape.PER_TENSOR)(x)
    with pytest.raises(ValueError, match="do not pass scale"):
        QuantFP8(False, GroupShape.PER_TENSOR)(x, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="scale_ub"):
        QuantFP8(False, GroupShape.PER_TENSOR)(x, None, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="scale_ub"):
        QuantFP8(True, GroupShape.PER_TOKEN)(x, torch.ones(2, 1), torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"group_shape=\(-1, 1\) is not supported for dynamic"):
        QuantFP8(False, GroupShape.PER_CHANNEL)


def test_ragged_last_group_is_zero_padded_like_vllm():
    x = _x(2, 128)
    q, scales = QuantFP8(False, GroupShape(1, 96))(x)
    assert q.shape == (2, 128) and scales.shape == (2, 2)   # groups of 96 and 32 features
    assert torch.equal(scales[:, 1], (x[:, 96:].float().abs().amax(-1) / 448.0).clamp(min=1 / (448 * 512)))


def test_quant_layer_goes_through_ir_dispatch():
    x = _x(3, 128)
    with counting_provider("static_quant_fp8") as static, counting_provider("dynamic_quant_fp8") as dynamic, \
            counting_provider("dynamic_group_quant_fp8") as group:
        QuantFP8(True, GroupShape.PER_TOKEN)(x, torch.ones(3, 1))
        QuantFP8(False, GroupShape.PER_TOKEN)(x)
        QuantFP8(False, GroupShape.PER_TENSOR)(x)
        QuantFP8(False, GroupShape(1, 64))(x)
    assert len(static) == 1 and len(group) == 1 and group[0][1] == 64
    assert [call[1] for call in dynamic] == [True, False]     # per_token reaches the op


class _Divisions(TorchDispatchMode):
    """Records the divisor of every aten.div call."""

    def __init__(self):
        super().__init__()
        self.divisors = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten.div:
            self.divisors.append(args[1])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("form", ["per_token", "per_tensor", "scale_ub", "group", "group_ue8m0"])
def test_dynamic_scales_divide_by_a_tensor_on_the_device_not_a_python_number(form):
    """torch's CUDA division by a Python number multiplies by its reciprocal (two roundings): on an H100 the native
    per-token scale came out one ulp above absmax / 448 and flipped fp8 codes at exact ties, so the correctly
    rounding cuda and triton kernels got QUALITY_WARNINGs. Every scale division of the natives takes a tensor."""
    from reference_impl import ir
    from reference_impl.layers.quantization import group_quant_ue8m0

    x = _x(4, 256, dtype=torch.bfloat16)
    call = {"per_token": lambda: ir.ops.dynamic_quant_fp8.native_fn(x, True),
            "per_tensor": lambda: ir.ops.dynamic_quant_fp8.native_fn(x, False),
            "scale_ub": lambda: ir.ops.dynamic_quant_fp8.native_fn(x, True, torch.tensor([2.0])),
            "group": lambda: ir.ops.dynamic_group_quant_fp8.native_fn(x, 128),
            "group_ue8m0": lambda: group_quant_ue8m0(x, 128)}[form]
    with _Divisions() as seen:
        call()
    assert seen.divisors and all(isinstance(d, torch.Tensor) and d.device == x.device for d in seen.divisors), \
        [type(d).__name__ for d in seen.divisors]
