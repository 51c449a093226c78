"""Conv2dLayer / Conv3dLayer: a float64 shift-and-multiply convolution written out, equality with
F.conv2d / F.conv3d (and nn.ConvNd's padding modes), the patch (unfold + matmul) path, argument errors."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from _layer_support import assert_close64, f64
from reference_impl.custom_op import CustomOp
from reference_impl.layers.conv import Conv2dLayer, Conv3dLayer


def _conv_reference(x, w, b, stride, padding, dilation, groups):
    """Direct formula: out[n, o, p] = b[o] + sum_{c, k} w[o, c, k] * xpad[n, g*C + c, p*s + k*d]."""
    dims = x.dim() - 2
    xp = F.pad(x, [p for pad in reversed(padding) for p in (pad, pad)])
    out_size = [(xp.shape[2 + i] - dilation[i] * (w.shape[2 + i] - 1) - 1) // stride[i] + 1 for i in range(dims)]
    c_in, c_out = w.shape[1], w.shape[0] // groups
    out = torch.zeros(x.shape[0], w.shape[0], *out_size, dtype=torch.float64)
    for offsets in itertools.product(*(range(k) for k in w.shape[2:])):
        window = xp[(slice(None), slice(None)) + tuple(
            slice(o * dilation[i], o * dilation[i] + stride[i] * (out_size[i] - 1) + 1, stride[i])
            for i, o in enumerate(offsets))]
        for g in range(groups):
            wk = w[(slice(g * c_out, (g + 1) * c_out), slice(None)) + offsets]        # [c_out, c_in]
            out[:, g * c_out:(g + 1) * c_out] += torch.einsum("oc,nc...->no...", wk,
                                                              window[:, g * c_in:(g + 1) * c_in])
    if b is not None:
        out += b.view(1, -1, *([1] * dims))
    return out


def _layer(cls, seed=0, **kwargs):
    layer = cls(params_dtype=torch.float64, **kwargs)
    with torch.no_grad():
        layer.weight.copy_(f64(*layer.weight.shape, seed=seed, scale=0.3))
        if layer.bias is not None:
            layer.bias.copy_(f64(*layer.bias.shape, seed=seed + 1))
    return layer


def test_registered_names():
    assert CustomOp.op_registry["conv2d"] is Conv2dLayer
    assert CustomOp.op_registry["conv3d"] is Conv3dLayer


CONV2D = [
    dict(in_channels=3, out_channels=5, kernel_size=4, stride=4),                       # patch path
    dict(in_channels=2, out_channels=4, kernel_size=(2, 3), stride=(2, 3), bias=False),  # patch, ragged input
    dict(in_channels=4, out_channels=6, kernel_size=3, padding=1),
    dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=(2, 0), dilation=2, groups=2),
    dict(in_channels=3, out_channels=3, kernel_size=2, stride=2, padding=1),             # kernel == stride, padded
]


@pytest.mark.parametrize("kwargs", CONV2D, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_conv2d_matches_direct_formula_and_f_conv2d(kwargs):
    layer = _layer(Conv2dLayer, **kwargs)
    x = f64(2, kwargs["in_channels"], 9, 11, seed=3)
    out = layer(x)
    expected = _conv_reference(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation,
                               layer.groups)
    assert_close64(out, expected)
    conv = F.conv2d(x, layer.weight, layer.bias, stride=layer.stride, padding=layer.padding,
                    dilation=layer.dilation, groups=layer.groups)
    assert_close64(out, conv)


CONV3D = [
    dict(in_channels=3, out_channels=4, kernel_size=(2, 4, 4), stride=(2, 4, 4)),
    dict(in_channels=2, out_channels=4, kernel_size=3, padding=1, bias=False),
    dict(in_channels=4, out_channels=2, kernel_size=(1, 3, 2), stride=(1, 2, 1), dilation=(1, 1, 2), groups=2),
]


@pytest.mark.parametrize("kwargs", CONV3D, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_conv3d_matches_direct_formula_and_f_conv3d(kwargs):
    layer = _layer(Conv3dLayer, **kwargs)
    x = f64(1, kwargs["in_channels"], 5, 9, 8, seed=4)
    out = layer(x)
    expected = _conv_reference(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation,
                               layer.groups)
    assert_close64(out, expected)
    assert_close64(out, F.conv3d(x, layer.weight, layer.bias, stride=layer.stride, padding=layer.padding,
                                 dilation=layer.dilation, groups=layer.groups))


@pytest.mark.parametrize("kwargs,linear", [
    (dict(kernel_size=4, stride=4), True),
    (dict(kernel_size=(2, 4), stride=(2, 4)), True),
    (dict(kernel_size=4, stride=2), False),
    (dict(kernel_size=4, stride=4, padding=1), False),
    (dict(kernel_size=4, stride=4, dilation=2), False),
    (dict(kernel_size=4, stride=4, groups=2), False),
    (dict(kernel_size=4, stride=4, padding="valid"), True),
])
def test_patch_path_only_for_non_overlapping_unpadded_patches(kwargs, linear):
    layer = Conv2dLayer(4, 6, **kwargs)
    assert layer.enable_linear is linear


def test_patch_path_is_a_matmul_over_patches_and_drops_a_ragged_edge(monkeypatch):
    layer = _layer(Conv2dLayer, in_channels=3, out_channels=5, kernel_size=(2, 3), stride=(2, 3))
    x = f64(2, 3, 7, 8, seed=5)                    # 7 = 3*2 + 1, 8 = 2*3 + 2: trailing rows/cols unused
    calls = []
    real_linear = F.linear
    monkeypatch.setattr(F, "linear", lambda *a: calls.append(a[0].shape) or real_linear(*a))
    out = layer(x)
    monkeypatch.undo()
    assert calls == [torch.Size([2 * 3 * 2, 3 * 2 * 3])]
    assert out.shape == (2, 5, 3, 2)
    # Patch (1, 0) of image 1 holds rows 2..3 and columns 0..2.
    patch = x[1, :, 2:4, 0:3]
    assert_close64(out[1, :, 1, 0], layer.weight.flatten(1) @ patch.flatten() + layer.bias)
    assert_close64(out, F.conv2d(x, layer.weight, layer.bias, stride=(2, 3)))


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_padding_modes_match_nn_conv2d(mode):
    layer = _layer(Conv2dLayer, in_channels=2, out_channels=3, kernel_size=3, padding=(1, 2), padding_mode=mode)
    ref = nn.Conv2d(2, 3, 3, padding=(1, 2), padding_mode=mode, dtype=torch.float64)
    ref.load_state_dict(layer.state_dict())
    x = f64(1, 2, 6, 7, seed=6)
    assert_close64(layer(x), ref(x))


@pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch's own conv in the check
def test_padding_same_keeps_the_size_for_even_kernels_like_pytorch():
    layer = _layer(Conv2dLayer, in_channels=2, out_channels=3, kernel_size=(2, 4), padding="same", dilation=(1, 2))
    x = f64(1, 2, 6, 7, seed=7)
    out = layer(x)
    assert out.shape[2:] == x.shape[2:]
    assert_close64(out, F.conv2d(x, layer.weight, layer.bias, padding="same", dilation=(1, 2)))
    reflect = _layer(Conv2dLayer, in_channels=2, out_channels=3, kernel_size=(2, 4), padding="same",
                     padding_mode="reflect")
    ref = nn.Conv2d(2, 3, (2, 4), padding="same", padding_mode="reflect", dtype=torch.float64)
    ref.load_state_dict(reflect.state_dict())
    assert_close64(reflect(x), ref(x))


def test_params_dtype_and_half_precision_output():
    layer = Conv3dLayer(3, 8, (2, 4, 4), stride=(2, 4, 4), params_dtype=torch.bfloat16)
    assert layer.weight.dtype == layer.bias.dtype == torch.bfloat16 and layer.weight.shape == (8, 3, 2, 4, 4)
    x = torch.randn(1, 3, 4, 8, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.bfloat16 and out.shape == (1, 8, 2, 2, 2)
    exact = F.conv3d(x.double(), layer.weight.double(), layer.bias.double(), stride=(2, 4, 4))
    torch.testing.assert_close(out.double(), exact, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("kwargs,match", [
    (dict(in_channels=4, out_channels=6, kernel_size=3, groups=4), "groups=4"),
    (dict(in_channels=0, out_channels=6, kernel_size=3), "in_channels=0"),
    (dict(in_channels=4, out_channels=6, kernel_size=(3, 3, 3)), "kernel_size"),
    (dict(in_channels=4, out_channels=6, kernel_size=3, stride=0), "stride=0"),
    (dict(in_channels=4, out_channels=6, kernel_size=3, padding=-1), "padding=-1"),
    (dict(in_channels=4, out_channels=6, kernel_size=3, padding="full"), "padding='full'"),
    (dict(in_channels=4, out_channels=6, kernel_size=3, padding="same", stride=2), "padding='same' needs stride 1"),
    (dict(in_channels=4, out_channels=6, kernel_size=3, padding_mode="mirror"), "padding_mode='mirror'"),
])
def test_bad_construction_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
        Conv2dLayer(**kwargs)


def test_bad_inputs_name_the_expected_shape():
    layer = Conv2dLayer(3, 4, 2, stride=2)
    with pytest.raises(ValueError, match=r"expects x of shape \(batch, 3, 2 spatial dims\), got \(1, 4, 8, 8\)"):
        layer(torch.randn(1, 4, 8, 8))
    with pytest.raises(ValueError, match=r"got \(3, 8, 8\)"):
        layer(torch.randn(3, 8, 8))
    with pytest.raises(ValueError, match="smaller than the kernel"):
        Conv2dLayer(3, 4, 4, stride=4)(torch.randn(1, 3, 2, 8))
    with pytest.raises(ValueError, match=r"\(batch, 2, 3 spatial dims\)"):
        Conv3dLayer(2, 4, 2)(torch.randn(1, 2, 4, 4))
