"""The CUDA kernels without a GPU: every .cu compiles with nvcc for sm_80 and sm_90, the torch
binding parses against this torch's headers, the .cu files stay free of torch, build failures are
reported with the failing file, and the "cuda" provider is registered but honestly unsupported
where torch has no CUDA or no GPU. Skipped with the reason where nvcc is absent.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from reference_impl import ir
from reference_impl.kernels import _build_cuda, ptx_facts

NVCC = _build_cuda.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (set CUDA_HOME or put nvcc on PATH)")


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cuda-objects")
    times = _build_cuda.compile_check(out, ("80", "90"), keep=True)
    assert set(times) == set(_build_cuda.CU_SOURCES)
    return out


@pytest.fixture(scope="module")
def facts(objects) -> list[ptx_facts.KernelFacts]:
    found = ptx_facts.kernel_facts(objects)
    assert {(f.source, f.arch) for f in found} == {(s, a) for s in _build_cuda.CU_SOURCES for a in ("80", "90")}
    return found


# Kernels that exist to handle rows or groups not 16-byte aligned: scalar memory operations by design.
UNALIGNED_FALLBACKS = re.compile(r"group_quant_kernel<[^>]*, false>")
# Kernels that write no activations or codes (a reduction into a workspace).
NO_OUTPUT_ROWS = re.compile(r"tensor_absmax_kernel")


@needs_nvcc
def test_no_kernel_spills_or_uses_a_stack_frame(facts):
    """Registers hold each kernel's working set on sm_80 and sm_90: local memory would cost
    bandwidth the memory-bound kernels do not have."""
    for f in facts:
        assert f.registers > 0, f"{f.name} sm_{f.arch}: no ptxas resource report"
        assert f.spill_bytes == 0 and f.stack_bytes == 0, (
            f"{f.name} sm_{f.arch}: {f.spill_bytes} spill bytes, {f.stack_bytes} stack bytes")


@needs_nvcc
def test_aligned_kernels_load_and_store_16_bytes_per_thread(facts):
    """Every kernel but the unaligned fallbacks reads its rows in 16-byte units; the activation,
    norm and rotary kernels also write 16 bytes at once, the quant kernels packed codes (4 or 8
    bytes: the 16 bytes of input they come from)."""
    for f in facts:
        if UNALIGNED_FALLBACKS.search(f.name):
            continue
        assert f.loads_16b >= 1, f"{f.name} sm_{f.arch}: no 16-byte global load"
        if NO_OUTPUT_ROWS.search(f.name):
            continue
        if f.source == "quant.cu":
            assert f.packed_stores >= 1, f"{f.name} sm_{f.arch}: fp8 codes stored one byte at a time"
        else:
            assert f.stores_16b >= 1, f"{f.name} sm_{f.arch}: no 16-byte global store"


@needs_nvcc
def test_sm90_quant_kernels_use_the_hardware_fp8_conversion(facts):
    for f in facts:
        if f.source == "quant.cu" and f.arch == "90" and not NO_OUTPUT_ROWS.search(f.name):
            assert f.fp8_hw_converts >= 1, f"{f.name}: fp8 encoded in software on sm_90"


def test_ptx_facts_parse_entries_vectors_and_resources(tmp_path):
    """The parser on a hand-written PTX and ptxas log (no nvcc needed): one vectorized kernel, one
    scalar kernel that spills."""
    keep = tmp_path / "k.keep"
    keep.mkdir()
    (keep / "k.compute_90.ptx").write_text(
        ".visible .entry _Z4fastPf(\n .param .u64 p)\n{\n ld.global.nc.v4.u32 {%r1,%r2,%r3,%r4}, [%rd1];\n"
        " st.global.v4.f32 [%rd2], {%f1,%f2,%f3,%f4};\n}\n"
        ".entry _Z4slowPf(\n .param .u64 p)\n{\n ld.global.f32 %f1, [%rd1];\n st.global.v2.u32 [%rd2], {%r1,%r2};\n"
        " cvt.rn.satfinite.e4m3x2.f32 %rs1, %f1, %f2;\n}\n")
    (tmp_path / "k.ptxas.log").write_text(
        "ptxas info    : Compiling entry function '_Z4fastPf' for 'sm_90'\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\nptxas info    : Used 12 registers\n"
        "ptxas info    : Compiling entry function '_Z4slowPf' for 'sm_90'\n"
        "    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\nptxas info    : Used 255 registers\n")
    fast, slow = sorted(ptx_facts.kernel_facts(tmp_path), key=lambda f: f.mangled)
    assert (fast.loads_16b, fast.stores_16b, fast.packed_stores, fast.registers, fast.spill_bytes) == (1, 1, 0, 12, 0)
    assert (slow.loads_16b, slow.stores_16b, slow.packed_stores, slow.fp8_hw_converts) == (0, 0, 1, 1)
    assert (slow.registers, slow.stack_bytes, slow.spill_bytes) == (255, 16, 12)
    assert fast.arch == "90" and fast.source == "k.cu"
    assert "fast" in ptx_facts.facts_table([fast, slow])


@needs_nvcc
@pytest.mark.parametrize("source", _build_cuda.CU_SOURCES)
def test_cu_source_compiles_for_sm80_and_sm90(objects, source):
    obj = objects / (Path(source).stem + ".o")
    assert obj.is_file() and obj.stat().st_size > 0
    archs = set(re.findall(rb"sm_\d\d", obj.read_bytes()))
    assert {b"sm_80", b"sm_90"} <= archs, f"{source}: embedded device code for {sorted(archs)}"


@needs_nvcc
def test_binding_parses_against_torch_headers(tmp_path):
    assert _build_cuda.binding_syntax_check(tmp_path) > 0


def test_cuda_sources_do_not_include_torch():
    cuda_dir = _build_cuda.CSRC_DIR
    for path in [*cuda_dir.glob("*.cu"), *cuda_dir.glob("*.cuh"), cuda_dir / "kernels.h"]:
        includes = re.findall(r'#include\s+[<"]([^>"]+)[>"]', path.read_text())
        torchy = [i for i in includes if i.split("/")[0] in ("torch", "ATen", "c10") or "binding" in i]
        assert not torchy, f"{path.name} includes {torchy}; .cu files must build without torch"


@needs_nvcc
def test_compile_failure_names_the_file(tmp_path):
    broken = tmp_path / "broken_kernel.cu"
    broken.write_text("__global__ void k(float* x) { x[0] = undefined_symbol; }\n")
    with pytest.raises(_build_cuda.CudaBuildError, match=r"broken_kernel\.cu(.|\n)*undefined_symbol"):
        _build_cuda.compile_check(tmp_path / "out", ("80",), sources=[broken])


def test_missing_nvcc_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert _build_cuda.find_nvcc() is None
    with pytest.raises(_build_cuda.CudaBuildError, match="nvcc not found"):
        _build_cuda.compile_check(tmp_path / "out")


def test_cuda_provider_is_registered_and_honest_about_support():
    from reference_impl.kernels import cuda

    problem = _build_cuda.runtime_problem()
    if torch.version.cuda is None or not torch.cuda.is_available():
        assert problem is not None and cuda.SUPPORTED is False
    for name in cuda.OPS:
        impl = getattr(ir.ops, name).impls[cuda.PROVIDER]
        assert impl.supported is cuda.SUPPORTED
        assert impl.inplace is (name in ("fused_add_rms_norm", "rotary_embedding", "rotary_embedding_query"))
    # CPU tensors are never the CUDA kernels' business, whatever `supported` says.
    x = torch.ones(2, 8)
    assert getattr(ir.ops, "silu_and_mul").impls[cuda.PROVIDER].supports_args(x) is False
    priority = cuda.default_priority()
    assert set(priority) == set(cuda.OPS)
    assert all(p[0] == cuda.PROVIDER and p[-1] == "native" for p in priority.values())
