"""Build of the CUDA kernels (`csrc/cuda/`): a compile check anywhere nvcc exists, and the JIT
torch extension `reference_cuda` where torch has CUDA.

The .cu files include no torch headers (the CPU torch wheel lacks the c10 CUDA configuration
headers), so `compile_check` builds them with nvcc alone, each file once for every target
architecture (sm_80 and sm_90 by default), files in parallel:

    python -m reference_impl.kernels._build_cuda            # compile check into a temp dir
    python -m reference_impl.kernels._build_cuda --out DIR --arch 80 --arch 90 --jobs 4
    python -m reference_impl.kernels._build_cuda --binding   # also parse bindings.cpp vs torch headers
    python -m reference_impl.kernels._build_cuda --facts     # per kernel: vector widths, registers, spills

`load()` (CUDA torch and a GPU only) builds the .cu files plus the torch binding
`csrc/cuda/bindings.cpp` with `torch.utils.cpp_extension.load` for the local GPU's architecture.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from reference_impl.kernels._csrc import csrc_dir

logger = logging.getLogger(__name__)

LIBRARY = "reference_cuda"
CSRC_DIR = csrc_dir() / "cuda"
CU_SOURCES = ("norm.cu", "activation.cu", "rotary.cu", "quant.cu")
BINDING = "bindings.cpp"
DEFAULT_ARCHS = ("80", "90")
NVCC_FLAGS = ("-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-Wno-deprecated-gpu-targets")

_lock = threading.Lock()
_loaded = False


class CudaBuildError(RuntimeError):
    """nvcc is missing, or compiling a CUDA source failed (the message holds nvcc's output)."""


def find_nvcc() -> str | None:
    """nvcc from $CUDA_HOME/bin, else from PATH."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def gencode_flags(archs: tuple[str, ...] | list[str]) -> list[str]:
    return [f for a in archs for f in ("-gencode", f"arch=compute_{a},code=sm_{a}")]


def compile_command(nvcc: str, source: Path, output: Path, archs, keep_dir: Path | None = None) -> list[str]:
    keep = ["--keep", "--keep-dir", str(keep_dir), "-Xptxas", "-v"] if keep_dir is not None else []
    return [nvcc, *NVCC_FLAGS, *gencode_flags(archs), "-c", str(source), "-o", str(output), *keep]


def compile_check(out_dir: Path, archs=DEFAULT_ARCHS, jobs: int | None = None,
                  sources: list[Path] | None = None, keep: bool = False) -> dict[str, float]:
    """Compile every .cu (default: csrc/cuda/*.cu) to an object file for all `archs`.

    Returns seconds per source; raises `CudaBuildError` naming each failing source with nvcc's
    output. `keep` also leaves, per source, the PTX of every arch under `<stem>.keep/` and ptxas's
    resource report in `<stem>.ptxas.log`: what `reference_impl.kernels.ptx_facts` reads.
    """
    nvcc = find_nvcc()
    if nvcc is None:
        raise CudaBuildError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = sources or [CSRC_DIR / name for name in CU_SOURCES]

    def build(source: Path) -> tuple[str, float, subprocess.CompletedProcess]:
        start = time.perf_counter()
        keep_dir = out_dir / f"{source.stem}.keep" if keep else None
        if keep_dir is not None:
            keep_dir.mkdir(exist_ok=True)
        cmd = compile_command(nvcc, source, out_dir / (source.stem + ".o"), archs, keep_dir)
        result = subprocess.run(cmd, capture_output=True, text=True)
        if keep:
            (out_dir / f"{source.stem}.ptxas.log").write_text(result.stdout + result.stderr)
        return source.name, time.perf_counter() - start, result

    jobs = jobs or min(len(sources), os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(build, sources))
    failures = [f"{name}:\n{r.stdout}{r.stderr}" for name, _, r in results if r.returncode != 0]
    if failures:
        raise CudaBuildError("nvcc failed for " + "\n".join(failures))
    return {name: seconds for name, seconds, _ in results}


def nvcc_include_dirs(nvcc: str) -> list[str]:
    """The CUDA toolkit include directories nvcc itself uses (read from `nvcc --dryrun`)."""
    result = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                            capture_output=True, text=True)
    dirs = []
    for line in (result.stdout + result.stderr).splitlines():
        if "INCLUDES=" in line:
            dirs += re.findall(r'(?:-I|-isystem"?\s+"?)"?([^"\s]+)"?', line.split("=", 1)[1])
    return dirs


def binding_syntax_check(work_dir: Path) -> float:
    """Parse csrc/cuda/bindings.cpp against this torch's headers and the CUDA toolkit's (no codegen).

    The CPU wheel ships the c10 CUDA headers but not their generated configuration header, so a
    minimal stand-in is written under `work_dir` when torch lacks it. This catches binding code
    that no longer compiles on machines where only the CPU wheel exists; returns seconds taken.
    """
    from torch.utils.cpp_extension import include_paths

    nvcc = find_nvcc()
    if nvcc is None:
        raise CudaBuildError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    includes = [str(p) for p in include_paths()] + nvcc_include_dirs(nvcc)
    config = Path("c10/cuda/impl/cuda_cmake_macros.h")
    if not any((Path(p) / config).is_file() for p in include_paths()):
        stub = work_dir / "stub-include"
        (stub / config).parent.mkdir(parents=True, exist_ok=True)
        (stub / config).write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        includes.insert(0, str(stub))
    cxx = os.environ.get("CXX", "c++")
    cmd = [cxx, "-std=c++20", "-fsyntax-only", *(f"-I{p}" for p in includes), str(CSRC_DIR / BINDING)]
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise CudaBuildError(f"{BINDING} does not compile against torch's headers:\n{result.stderr}")
    return time.perf_counter() - start


# ----- runtime (CUDA torch only) ------------------------------------------------------------------
def runtime_problem() -> str | None:
    """Why the CUDA kernels cannot run in this process, or None."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if not torch.cuda.is_available():
        return "no CUDA GPU is available"
    if find_nvcc() is None:
        return "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    return None


def load() -> None:
    """Build (first use, cached by torch's extension builder) and load `reference_cuda`."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        problem = runtime_problem()
        if problem is not None:
            raise CudaBuildError(f"reference CUDA kernels unavailable: {problem}")
        from torch.utils.cpp_extension import load as cpp_load

        from reference_impl.kernels._cpp_provider import register_fakes

        major, minor = torch.cuda.get_device_capability()
        print(f"building reference CUDA kernels for sm_{major}{minor} (first use, ~1-2 min)...",
              file=sys.stderr, flush=True)
        cpp_load(name=f"{LIBRARY}_sm{major}{minor}",
                 sources=[str(CSRC_DIR / s) for s in (BINDING, *CU_SOURCES)],
                 extra_cflags=["-O3"], extra_cuda_cflags=["-O3", *gencode_flags([f"{major}{minor}"])],
                 is_python_module=False, verbose=False)
        register_fakes(LIBRARY)
        _loaded = True


def ops():
    """`torch.ops.reference_cuda`, building and loading it on first use."""
    if not _loaded:
        load()
    return torch.ops.reference_cuda


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Compile every csrc/cuda/*.cu with nvcc (no torch needed).")
    parser.add_argument("--out", type=Path, help="object directory (default: a temporary one)")
    parser.add_argument("--arch", action="append", help="SM architecture, repeatable (default: 80, 90)")
    parser.add_argument("--jobs", type=int, help="parallel nvcc processes")
    parser.add_argument("--binding", action="store_true",
                        help="also parse bindings.cpp against torch's headers (needs a C++ compiler)")
    parser.add_argument("--facts", action="store_true",
                        help="print per kernel and arch: 16-byte global loads/stores, registers, spills")
    args = parser.parse_args(argv)
    archs = tuple(args.arch or DEFAULT_ARCHS)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        start = time.perf_counter()
        try:
            times = compile_check(out, archs, args.jobs, keep=args.facts)
            if args.binding:
                times[f"{BINDING} (syntax only)"] = binding_syntax_check(out)
        except CudaBuildError as exc:
            print(exc, file=sys.stderr)
            return 1
        for name, seconds in times.items():
            print(f"{name}: {seconds:.1f} s")
        if args.facts:
            from reference_impl.kernels.ptx_facts import facts_table, kernel_facts
            print(facts_table(kernel_facts(out)))
        print(f"compiled {len(CU_SOURCES)} CUDA sources for sm_{', sm_'.join(archs)} in "
              f"{time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
