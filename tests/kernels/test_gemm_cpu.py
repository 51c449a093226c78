"""The C++ few-row GEMM (`reference_cpu::pack_gemm_panels`, `reference_cpu::panel_gemm`) against float64:
every dtype, column and k tails, row counts across the micro-kernel's row groups and row blocks, strided
inputs, bias, empty products, thread-count independence, the panel layout, and the argument errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (rows, out_features, in_features): one row; a row group's tail; more rows than one row block (64) holds;
# n and k that are no multiple of any vector; k larger than one k-tile; a single column and feature.
SHAPES = [(1, 96, 256), (5, 33, 7), (8, 1280, 768), (13, 17, 513), (70, 100, 300), (131, 40, 2100), (3, 1, 1)]


def random(shape, dtype, gen):
    return torch.randn(shape, generator=gen).to(dtype)


def assert_matches_float64(got, x, w, bias):
    """fp32 sums rounded once to the dtype: within float32's summation error of the exact product, plus the
    dtype's own rounding of it (half a unit in the last place, relative)."""
    exact = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    assert got.dtype == x.dtype and got.shape == exact.shape
    k = x.shape[1]
    scale = (x.double().abs() @ w.double().abs().T) + (0 if bias is None else bias.double().abs())
    rounding = {torch.float32: 0.0, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[x.dtype]
    bound = scale * 2.0 ** -24 * (k + 2) + exact.abs() * rounding * 1.0001
    err = (got.double() - exact).abs()
    assert (err <= bound).all(), f"max error {err.max().item():.3g} over its bound at {(err - bound).argmax().item()}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_panel_gemm_is_the_linear_product(ops, dtype, shape):
    m, n, k = shape
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    w, x, b = random((n, k), dtype, gen), random((m, k), dtype, gen), random((n,), dtype, gen)
    panels = ops.pack_gemm_panels(w)
    for bias in (None, b):
        got = ops.panel_gemm(x, panels, n, bias)
        assert_matches_float64(got, x, w, bias)


def test_panels_hold_the_weight_column_by_column(ops):
    w = torch.arange(37 * 5, dtype=torch.float32).reshape(37, 5)
    panels = ops.pack_gemm_panels(w)
    cols = panels.shape[2]
    assert cols in (16, 32, 8) and panels.shape == ((37 + cols - 1) // cols, 5, cols)
    for p in range(panels.shape[0]):
        for c in range(cols):
            column = p * cols + c
            want = w[column] if column < 37 else torch.zeros(5)
            assert torch.equal(panels[p, :, c], want)


def test_strided_inputs_and_empty_products(ops):
    gen = torch.Generator().manual_seed(1)
    big_w, big_x = random((50, 80), torch.bfloat16, gen), random((6, 80), torch.bfloat16, gen)
    w, x = big_w[:, :48], big_x[:, 8:56]                      # rows further apart than their length
    assert not w.is_contiguous() and not x.is_contiguous()
    got = ops.panel_gemm(x, ops.pack_gemm_panels(w), 50, None)
    assert torch.equal(got, ops.panel_gemm(x.contiguous(), ops.pack_gemm_panels(w.contiguous()), 50, None))
    assert_matches_float64(got, x, w, None)
    empty_k = ops.panel_gemm(torch.ones(4, 0), ops.pack_gemm_panels(torch.ones(5, 0)), 5, torch.arange(5.0))
    assert torch.equal(empty_k, torch.arange(5.0).expand(4, 5))       # an empty sum is zero: the bias alone
    assert ops.panel_gemm(torch.ones(0, 3), ops.pack_gemm_panels(torch.ones(5, 3)), 5, None).shape == (0, 5)


def test_results_do_not_depend_on_the_thread_count(ops):
    gen = torch.Generator().manual_seed(2)
    w, x = random((4096, 768), torch.float32, gen), random((8, 768), torch.float32, gen)
    panels = ops.pack_gemm_panels(w)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.panel_gemm(x, panels, 4096, None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, ops.panel_gemm(x, panels, 4096, None))


def test_bad_arguments_name_the_problem(ops):
    w = torch.randn(20, 8)
    panels = ops.pack_gemm_panels(w)
    cases = [
        (lambda: ops.pack_gemm_panels(torch.randn(3, 4, 5)), "weight must be 2-D"),
        (lambda: ops.pack_gemm_panels(torch.ones(3, 4, dtype=torch.int32)), "weight dtype Int is not supported"),
        (lambda: ops.pack_gemm_panels(torch.randn(8, 4).T), "weight must be contiguous in its last dim"),
        (lambda: ops.panel_gemm(torch.randn(2, 9), panels, 20, None), "x has 9 features, the panels 8"),
        (lambda: ops.panel_gemm(torch.randn(2, 8).bfloat16(), panels, 20, None), "differs from the panels' dtype"),
        (lambda: ops.panel_gemm(torch.randn(2, 8), panels, 200, None), "out_features 200 does not match"),
        (lambda: ops.panel_gemm(torch.randn(2, 8), panels[:, :, :4], 20, None), "panels must be a contiguous"),
        (lambda: ops.panel_gemm(torch.randn(2, 8), panels, 20, torch.randn(19)), "bias must be a contiguous \\[20\\]"),
        (lambda: ops.panel_gemm(torch.randn(2, 8), panels, 20, torch.randn(20).half()), "bias dtype Half differs"),
        (lambda: ops.panel_gemm(torch.randn(8, 2).T, panels, 20, None), "x must be contiguous in its last dim"),
    ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()
