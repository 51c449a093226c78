"""The Triton rounding helpers (`kernels/triton/_jit_common.py`) against torch's own conversions,
bit pattern by bit pattern, including the NaN payloads NVIDIA GPUs produce.

A GPU's canonical NaN is 0x7FFFFFFF, the interpreter's 0x7FC00000: integer rounding tricks that
survive the one can squash the other to -0 or Inf, so the helpers are fed the GPU's patterns
through bit casts. Triton decides at decoration time whether `@triton.jit` interprets, so the
kernel runs in a child process (this file is its script): under TRITON_INTERPRET=1 on every
machine, and compiled for the device on a machine with CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve()
CHILD_TIMEOUT_S = 300
FP8_MAX = 448.0

# Named patterns: the GPU's and the interpreter's NaNs, signalling and negative NaNs, infinities,
# the largest finite values (they round to Inf in bfloat16), ties to even, zeros and subnormals.
SPECIAL_BITS = {
    "nan 0x7FFFFFFF (GPU canonical)": 0x7FFFFFFF,
    "nan 0xFFFFFFFF": 0xFFFFFFFF,
    "nan 0x7F800001 (signalling)": 0x7F800001,
    "nan 0xFF800001": 0xFF800001,
    "nan 0x7FC00000 (interpreter)": 0x7FC00000,
    "nan 0xFFC00000": 0xFFC00000,
    "nan 0x7FBFFFFF": 0x7FBFFFFF,
    "nan 0x7F808000": 0x7F808000,
    "+inf": 0x7F800000,
    "-inf": 0xFF800000,
    "max finite 0x7F7FFFFF": 0x7F7FFFFF,
    "-max finite 0xFF7FFFFF": 0xFF7FFFFF,
    "bf16 tie below max 0x7F7F8000": 0x7F7F8000,
    "just below that tie 0x7F7F7FFF": 0x7F7F7FFF,
    "bf16 tie, even stays 0x3F808000": 0x3F808000,
    "bf16 tie, odd rounds up 0x3F818000": 0x3F818000,
    "above a tie 0x3F808001": 0x3F808001,
    "+0": 0x00000000,
    "-0": 0x80000000,
    "smallest subnormal": 0x00000001,
    "largest subnormal": 0x007FFFFF,
    "448": 0x43E00000,
    "-448": 0xC3E00000,
    "e4m3 tie 1.0625": 0x3F880000,
    "e4m3 tie 1.1875": 0x3F980000,
    "e4m3 subnormal tie 2^-10": 0x3A800000,
    "e4m3 min normal 2^-6": 0x3C800000,
    "just below e4m3 min normal": 0x3C7FFFFF,
}
# Every upper half of a float32 with these lower halves: each bfloat16 value, its neighbours'
# ties from both sides, and every exponent for the fp8 helpers.
LOWER_HALVES = (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF)


def input_bits() -> torch.Tensor:
    """The float32 bit patterns the helpers are fed, as int32 (named specials first)."""
    upper = torch.arange(1 << 16, dtype=torch.int64) << 16
    sweep = (upper[:, None] | torch.tensor(LOWER_HALVES, dtype=torch.int64)[None, :]).flatten()
    special = torch.tensor(list(SPECIAL_BITS.values()), dtype=torch.int64)
    return _to_int32(torch.cat([special, sweep]))


def _to_int32(u: torch.Tensor) -> torch.Tensor:
    return torch.where(u >= 1 << 31, u - (1 << 32), u).to(torch.int32)


def _hex(bits: int) -> str:
    return f"0x{bits & 0xFFFFFFFF:08X}"


# ----- child side ---------------------------------------------------------------------------------
def child(out_path: str) -> None:
    """Run the helpers over `input_bits()` on this process's Triton backend; save the raw results."""
    import triton

    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    device = "cpu" if interpret else "cuda"
    x = input_bits().view(torch.float32).to(device)
    n = x.numel()
    outs = {"bf16": torch.empty_like(x), "bf16_store": torch.empty(n, dtype=torch.bfloat16, device=device),
            "f16": torch.empty_like(x), "e4m3": torch.empty_like(x), "fp8": torch.empty_like(x),
            "fp8_store": torch.empty(n, dtype=torch.float8_e4m3fn, device=device)}
    block = 8192
    from reference_impl.kernels.triton._env import hardware_fp8

    rounding_kernel[(triton.cdiv(n, block),)](x, outs["bf16"], outs["bf16_store"], outs["f16"], outs["e4m3"],
                                              outs["fp8"], outs["fp8_store"], n, BLOCK=block, HW_FP8=hardware_fp8())
    torch.save({k: v.cpu() for k, v in outs.items()}, out_path)


def child_compile(out_path: str) -> None:
    """Compile the test kernel for an sm_90 target (no GPU needed), as the GPU run would."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"x_ptr": "*fp32", "bf16_ptr": "*fp32", "bf16_store_ptr": "*bf16", "f16_ptr": "*fp32",
                 "e4m3_ptr": "*fp32", "fp8_ptr": "*fp32", "fp8_store_ptr": "*fp8e4nv", "n": "i32",
                 "BLOCK": "constexpr", "HW_FP8": "constexpr"}
    compiled = triton.compile(ASTSource(fn=rounding_kernel, signature=signature,
                                        constexprs={"BLOCK": 1024, "HW_FP8": True}),
                              target=GPUTarget("cuda", 90, 32))
    Path(out_path).write_text("cubin" if "cubin" in compiled.asm else "no cubin")


# ----- parent side --------------------------------------------------------------------------------
def _spawn(out: Path, mode: str, interpret: bool) -> None:
    env = dict(os.environ)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, str(HERE), mode, str(out)], env=env, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S)
    assert proc.returncode == 0 and out.exists(), f"child exited with {proc.returncode}:\n{proc.stderr[-4000:]}"


def _run_child(tmp_path: Path, interpret: bool) -> dict[str, torch.Tensor]:
    out = tmp_path / "rounding.pt"
    _spawn(out, "run", interpret)
    return torch.load(out)


@pytest.fixture(scope="module", params=["interpreter", "gpu"])
def results(request, tmp_path_factory):
    if request.param == "gpu" and not torch.cuda.is_available():
        pytest.skip("no CUDA device: the compiled kernels run on a GPU machine only")
    interpret = request.param == "interpreter"
    return {**_run_child(tmp_path_factory.mktemp(request.param), interpret=interpret), "interpret": interpret}


def _mismatches(got: torch.Tensor, expected: torch.Tensor, x_bits: torch.Tensor, where: torch.Tensor) -> list[str]:
    """Input patterns (within `where`) whose result differs: NaN must give NaN, anything else
    must give exactly the expected float32 bits. The first few, as hex."""
    got_nan, exp_nan = torch.isnan(got), torch.isnan(expected)
    bad = (got_nan != exp_nan) | (~exp_nan & (got.view(torch.int32) != expected.view(torch.int32)))
    idx = torch.nonzero(bad & where).flatten()[:8].tolist()
    return [f"{_hex(int(x_bits[i]))} -> {_hex(int(got.view(torch.int32)[i]))}, "
            f"torch {_hex(int(expected.view(torch.int32)[i]))}" for i in idx]


def _check(got, expected, where=None):
    x_bits = input_bits()
    where = torch.ones_like(x_bits, dtype=torch.bool) if where is None else where
    bad = _mismatches(got.float(), expected.float(), x_bits, where)
    assert not bad, "differs from torch on: " + "; ".join(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the 'gpu' parameter compiles and runs the kernel")
def test_rounding_kernel_compiles_for_sm90(tmp_path):
    """The helpers as the GPU compiles them (the integer NaN tests included), without a GPU."""
    out = tmp_path / "compile.txt"
    _spawn(out, "compile", interpret=False)
    assert out.read_text() == "cubin"


def test_input_set_has_the_gpu_patterns():
    bits = {int(b) & 0xFFFFFFFF for b in input_bits()}
    for pattern in (0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0x7FC00000, 0xFFC00000, 0x7F800000, 0xFF800000,
                    0x7F7FFFFF):
        assert pattern in bits
    x = input_bits().view(torch.float32)
    assert int(torch.isnan(x).sum()) > 1000 and int(torch.isinf(x).sum()) >= 2


def test_bfloat16_rounding_equals_torch(results):
    x = input_bits().view(torch.float32)
    _check(results["bf16"], x.to(torch.bfloat16).float())


def test_bfloat16_store_equals_torch(results):
    """The rounded value stored to a bfloat16 tensor (as the kernels do). The interpreter's own
    float32 -> bfloat16 cast flushes bfloat16 subnormals to zero, so those are checked on a GPU."""
    x = input_bits().view(torch.float32)
    expected = x.to(torch.bfloat16)
    where = None
    if results["interpret"]:
        where = (expected.float().abs() >= torch.finfo(torch.bfloat16).tiny) | ~torch.isfinite(x) | (x == 0)
    _check(results["bf16_store"], expected, where)


def test_float16_rounding_equals_torch(results):
    x = input_bits().view(torch.float32)
    _check(results["f16"], x.to(torch.float16).float())


def test_e4m3_rounding_equals_torch_within_its_domain(results):
    """round_to_e4m3 takes values already clamped to [-448, 448], and NaN."""
    x = input_bits().view(torch.float32)
    domain = torch.isnan(x) | (x.abs() <= FP8_MAX)
    _check(results["e4m3"], x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float(), where=domain)


def test_fp8_quantize_step_equals_torch_everywhere(results):
    """The kernels' clamp-then-round step (`round_to_e4m3(clamp_fp8(x))`): native's `x.clamp(-448, 448).to(float8_e4m3fn)`
    for every input, Inf and NaN included."""
    x = input_bits().view(torch.float32)
    _check(results["fp8"], x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float())


def test_fp8_store_equals_torch(results):
    """That step stored to a float8_e4m3fn tensor. The interpreter's float32 -> fp8 cast turns NaN
    into a number, so NaN inputs are checked on a GPU (whose cvt gives the NaN code)."""
    x = input_bits().view(torch.float32)
    where = ~torch.isnan(x) if results["interpret"] else None
    _check(results["fp8_store"], x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), where)


def test_named_gpu_nans_stay_nan(results):
    """The patterns of the H100 run by name, so a regression names the payload."""
    names = list(SPECIAL_BITS)
    keys = ["bf16", "bf16_store", "f16", "e4m3", "fp8"] + ([] if results["interpret"] else ["fp8_store"])
    for key in keys:
        got = results[key].float()[:len(names)]
        squashed = [n for i, n in enumerate(names) if n.startswith("nan") and not torch.isnan(got[i])]
        assert not squashed, f"{key}: NaN input lost: {squashed}"


# Defined only in the child: Triton resolves a kernel's globals in its module, and the parent
# must not decorate kernels before the child's environment decides compile or interpret.
if __name__ == "__main__":
    import triton
    import triton.language as tl

    from reference_impl.kernels.triton._jit_common import round_to, round_to_e4m3
    from reference_impl.kernels.triton._quant_jit import clamp_fp8, store_fp8

    @triton.jit
    def rounding_kernel(x_ptr, bf16_ptr, bf16_store_ptr, f16_ptr, e4m3_ptr, fp8_ptr, fp8_store_ptr, n,
                        BLOCK: tl.constexpr, HW_FP8: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        bf = round_to(x, tl.bfloat16)
        tl.store(bf16_ptr + offs, bf, mask=mask)
        tl.store(bf16_store_ptr + offs, bf.to(tl.bfloat16), mask=mask)
        tl.store(f16_ptr + offs, round_to(x, tl.float16), mask=mask)
        tl.store(e4m3_ptr + offs, round_to_e4m3(x), mask=mask)
        tl.store(fp8_ptr + offs, round_to_e4m3(clamp_fp8(x)), mask=mask)
        store_fp8(fp8_store_ptr + offs, x, mask, HW_FP8)

    {"run": child, "compile": child_compile}[sys.argv[1]](sys.argv[2])
