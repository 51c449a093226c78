"""JIT build and load of the C++ CPU kernels (`csrc/cpu/`) as the torch library `reference_cpu`.

Built on first use with `torch.utils.cpp_extension.load` (ninja, TUs in parallel, no build
isolation, nothing downloaded) under `$TORCH_EXTENSIONS_DIR` (default: torch's extension root).
The library's name hashes the contents of the sources, the flags, compiler, torch and Python, not
where the sources live: a checkout and an installed wheel (or two venvs) with the same sources load
one cached library, and a changed source rebuilds. The vector ISA (AVX512 / AVX2 / none) follows
torch's own CPU capability detection (plus AVX512_BF16 conversions where the CPU has them).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from reference_impl.kernels._cpp_provider import register_fakes
from reference_impl.kernels._csrc import csrc_dir

logger = logging.getLogger(__name__)

LIBRARY = "reference_cpu"
CSRC_DIR = csrc_dir() / "cpu"
SOURCES = ("bindings.cpp", "norm.cpp", "activation.cpp", "rotary.cpp", "quant.cpp", "attention.cpp",
           "attention_bindings.cpp", "gemm.cpp", "gemm_bindings.cpp")
# Files the sources include (a build needs them present); paths relative to CSRC_DIR. The build name hashes every
# C++ file of cpu/ and common/ (`hashed_files`), listed here or not: a cached library is loaded without asking ninja.
HEADERS = ("kernels.h", "vec_common.h", "attention.h", "cpu_bindings.h", "../common/binding_utils.h",
           "../common/schemas.inc", "../common/impls.inc", "../common/row_index.h")
# Set to 1 to turn the provider off (dispatch then falls back to the next provider).
DISABLE_ENV = "REFERENCE_IMPL_DISABLE_CPP_KERNELS"

# torch capability -> preprocessor and arch flags (the ones torch's inductor uses).
_ISA_FLAGS = {
    "AVX512": ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512",
               "-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mfma"],
    "AVX2": ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"],
    "DEFAULT": ["-DCPU_CAPABILITY=DEFAULT"],
}

_lock = threading.Lock()
_loaded = False
_failure: CppKernelBuildError | None = None  # a failed build is not retried in this process


class CppKernelBuildError(RuntimeError):
    """The C++ CPU kernels cannot be built here (no compiler, no ninja, missing sources, build failure)."""


def compiler_name() -> str:
    """The C++ compiler torch's extension builder uses: `$CXX`, else `c++`."""
    return os.environ.get("CXX", "c++")


def toolchain_problem() -> str | None:
    """Why the kernels cannot be built here, or None when the toolchain looks usable."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return f"disabled by {DISABLE_ENV}={os.environ[DISABLE_ENV]}"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"only built on x86-64 Linux (this is {platform.system()} {platform.machine()})"
    cxx = compiler_name()
    if shutil.which(cxx) is None:
        origin = "$CXX" if "CXX" in os.environ else "the default; set CXX to choose another"
        return (f"no C++ compiler: '{cxx}' ({origin}) was not found on PATH; install g++ (or clang++) "
                "or set CXX to a working compiler")
    if shutil.which("ninja") is None:  # what torch's builder runs; cheaper than importing it here
        return "ninja is not on PATH (pip install ninja, or install your distribution's ninja-build)"
    missing = [n for n in SOURCES + HEADERS if not (CSRC_DIR / n).is_file()]
    if missing:
        return (f"kernel sources {missing} are missing from {CSRC_DIR} (an installed package "
                "ships them under reference_impl/_csrc, a source checkout under csrc/; reinstall the project)")
    return None


def check_toolchain() -> None:
    """Raise `CppKernelBuildError` naming the problem when the kernels cannot be built here."""
    problem = toolchain_problem()
    if problem is not None:
        raise CppKernelBuildError(f"reference C++ CPU kernels unavailable: {problem}")


def isa() -> str:
    """The vector ISA the kernels are built for: torch's CPU capability, plus BF16 where present."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in _ISA_FLAGS:
        return "DEFAULT"
    has_bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
    return "AVX512_BF16" if capability == "AVX512" and has_bf16 else capability


def build_flags() -> list[str]:
    name = isa()
    arch = _ISA_FLAGS["AVX512"] + ["-mavx512bf16"] if name == "AVX512_BF16" else _ISA_FLAGS[name]
    return ["-O3", "-DNDEBUG", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", *arch]


def hashed_files() -> list[str]:
    """Every C++ source, header and .inc file under cpu/ and common/, as paths relative to CSRC_DIR, sorted: a
    header added or edited there renames the build, whether or not HEADERS lists it."""
    roots = (CSRC_DIR, CSRC_DIR.parent / "common")
    found = {os.path.relpath(p, CSRC_DIR) for root in roots for p in root.rglob("*")
             if p.is_file() and p.suffix in (".cpp", ".h", ".inc")}
    return sorted(found)


def build_name() -> str:
    """Library name: ISA tag plus a hash of everything that changes the binary (the bytes of `hashed_files`, flags,
    compiler, torch and Python versions); where the sources live is not part of it."""
    h = hashlib.sha256()
    for name in hashed_files():
        h.update(name.encode())
        h.update((CSRC_DIR / name).read_bytes())
    h.update(" ".join(build_flags()).encode())
    h.update(compiler_name().encode())
    h.update(torch.__version__.encode())
    h.update(sys.version.split()[0].encode())
    return f"{LIBRARY}_{isa().lower()}_{h.hexdigest()[:12]}"


def _extensions_root() -> Path:
    from torch.utils.cpp_extension import get_default_build_root

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())


def library_path(name: str) -> Path:
    """Where the built library `name` is cached: one file per content hash, whichever sources built it."""
    return _extensions_root() / name / f"{name}.so"


def build_directory(name: str) -> Path:
    """Where ninja builds `name` from the sources at CSRC_DIR: one directory per source location under the
    library's, since torch's build files record absolute source paths (two checkouts sharing one would rebuild
    it for each other, and one's interrupted build would leave the other waiting on its lock)."""
    where = hashlib.sha256(str(CSRC_DIR.resolve()).encode()).hexdigest()[:8]
    return _extensions_root() / name / f"build-{where}"


def _load_library(library: Path) -> None:
    global _loaded
    try:
        torch.ops.load_library(str(library))
    except OSError as exc:   # not a library this process can load (damaged, or made for another system)
        raise CppKernelBuildError(f"the cached reference C++ CPU kernels {library} do not load ({exc}); delete "
                                  "that file to rebuild them") from exc
    register_fakes(LIBRARY)
    _loaded = True


def _load_cached(name: str) -> bool:
    """Load the cached library `name` if a process built it; whether it did. The caller holds `_lock`."""
    library = library_path(name)
    if not library.is_file():
        return False
    _load_library(library)
    logger.info("reference C++ CPU kernels loaded from %s", library)
    return True


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def load(announce: Callable[[str], None] = _to_stderr) -> None:
    """Load the cached library, building it first if no process has (ninja, into `build_directory`, then copied to
    `library_path`); idempotent and thread-safe. A build first passes its one-line notice to `announce` (stderr by
    default; the conformance harness passes its terminal, which pytest's output capture cannot hide)."""
    global _failure, _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        if _failure is not None:
            raise _failure
        check_toolchain()
        name = build_name()
        if _load_cached(name):
            return
        directory = build_directory(name)
        directory.mkdir(parents=True, exist_ok=True)
        jobs = min(len(SOURCES), os.cpu_count() or 1)
        estimate = 10 * -(-len(SOURCES) // jobs) + 5
        announce(f"building reference C++ CPU kernels (first use, ~{estimate} s) in {directory} ...")
        from torch.utils.cpp_extension import load as cpp_load

        start = time.perf_counter()
        try:
            cpp_load(name=name, sources=[str(CSRC_DIR / s) for s in SOURCES],
                     extra_cflags=build_flags(), extra_ldflags=["-fopenmp"],
                     build_directory=str(directory), is_python_module=False, verbose=False)
        except Exception as exc:  # compiler errors arrive as RuntimeError/CalledProcessError
            _failure = CppKernelBuildError(
                f"building the reference C++ CPU kernels in {directory} failed: {exc}")
            raise _failure from exc
        logger.info("reference C++ CPU kernels built in %.1f s", time.perf_counter() - start)
        register_fakes(LIBRARY)
        _loaded = True
        _publish(directory / f"{name}.so", library_path(name))


def _publish(built: Path, library: Path) -> None:
    """Copy a fresh build to its content name, by an atomic rename (a concurrent reader sees all of it or none).
    A failure only costs the next process a ninja run over the build directory, so it is logged, not raised."""
    partial = library.with_name(f".{library.name}.{os.getpid()}.partial")
    try:
        shutil.copyfile(built, partial)
        os.replace(partial, library)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        logger.warning("reference C++ CPU kernels built but not cached at %s: %s", library, exc)


def load_if_built() -> bool:
    """Load the library if a previous process built it for these sources, flags and torch (never
    build); whether it is loaded now. For compiled code that inductor serves from its cache: it
    calls `torch.ops.reference_cpu` directly, before any kernel call would have loaded it."""
    if _loaded:
        return True
    if toolchain_problem() is not None:
        return False
    with _lock:
        return _loaded or _load_cached(build_name())


def ops():
    """`torch.ops.reference_cpu`, building and loading it on first use."""
    if not _loaded:
        load()
    return torch.ops.reference_cpu
