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
from reference_impl.kernels import _build_cuda

NVCC = _build_cuda.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (set CUDA_HOME or put nvcc on PATH)")


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cuda-objects")
    times = _build_cuda.compile_check(out, ("80", "90"))
    assert set(times) == set(_build_cuda.CU_SOURCES)
    return out


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
