"""JIT build and load of the C++ CPU kernels (`csrc/cpu/`) as the torch library `reference_cpu`.

Built on first use with `torch.utils.cpp_extension.load` (ninja, TUs in parallel, no build
isolation, nothing downloaded) under `$TORCH_EXTENSIONS_DIR` (default: torch's extension root).
The library's name hashes the contents of the sources, the flags, compiler, torch and Python, not
where the sources live: a checkout and an installed wheel (or two venvs) with the same sources load
one cached library, and a changed source rebuilds. The vector ISA (AVX512 / AVX2 / none) follows
torch's own CPU capability detection (plus AVX512_BF16 conversions where the CPU has them).

A build never waits forever and never leaves a lock that stops the next one: it runs in a subprocess that dies with
its starter (Linux PR_SET_PDEATHSIG, taking ninja and the compilers with it) under a time limit, while the starter
holds an flock on `build_lock_path` (released by the kernel when its holder dies, however); a torch `lock` file left
in the build directory by a killed build is removed under that flock, where no other build can be inside torch's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
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
# Seconds a build (or the wait for another process's build of the same directory) may take before it is an error.
BUILD_TIMEOUT_ENV = "REFERENCE_IMPL_CPP_BUILD_TIMEOUT"
DEFAULT_BUILD_TIMEOUT_S = 900.0   # a cold build: about 1 min on an idle 2-core machine, 2 on a loaded one

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


def build_timeout() -> float:
    """The limit of one build, and of the wait for another process's: `$REFERENCE_IMPL_CPP_BUILD_TIMEOUT` seconds."""
    value = os.environ.get(BUILD_TIMEOUT_ENV, "")
    try:
        limit = float(value) if value else DEFAULT_BUILD_TIMEOUT_S
    except ValueError:
        raise CppKernelBuildError(f"{BUILD_TIMEOUT_ENV}={value!r} is not a number of seconds") from None
    if limit <= 0:
        raise CppKernelBuildError(f"{BUILD_TIMEOUT_ENV}={value!r} must be a positive number of seconds")
    return limit


def build_lock_path(name: str) -> Path:
    """The file a process holds an flock on while it builds `name` in `build_directory(name)`, next to that
    directory; it names its holder's pid. The file stays: only the flock means anything."""
    directory = build_directory(name)
    return directory.with_name(f"{directory.name}.lock")


def load(announce: Callable[[str], None] = _to_stderr) -> None:
    """Load the cached library, building it first if no process has (ninja, into `build_directory`, then copied to
    `library_path`); idempotent and thread-safe. A build first passes its one-line notice to `announce` (stderr by
    default; the conformance harness passes its terminal, which pytest's output capture cannot hide). A build, or
    the wait for another process's, longer than `build_timeout()` is a `CppKernelBuildError`."""
    global _failure
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
        try:
            _build(name, announce)
        except CppKernelBuildError as exc:
            _failure = exc
            raise


def _build(name: str, announce: Callable[[str], None]) -> None:
    """Build `name` holding its build lock (waiting for another process's build first), publish and load it."""
    limit = build_timeout()
    directory = build_directory(name)
    directory.mkdir(parents=True, exist_ok=True)
    with _BuildLock(build_lock_path(name), directory, limit, announce) as lock:
        if _load_cached(name):   # built by the process whose build this one waited for
            return
        jobs = min(len(SOURCES), os.cpu_count() or 1)
        estimate = 10 * -(-len(SOURCES) // jobs) + 5
        stale = _remove_stale_torch_lock(directory)
        announce(f"building reference C++ CPU kernels (first use, ~{estimate} s) in {directory}"
                 + (f" (removed {stale}, left by a build that was stopped or killed)" if stale else "") + " ...")
        start = time.perf_counter()
        _run_builder(name, directory, limit, lock.fd)
        logger.info("reference C++ CPU kernels built in %.1f s", time.perf_counter() - start)
        built, library = directory / f"{name}.so", library_path(name)
        _publish(built, library)
        _load_library(library if library.is_file() else built)


class _BuildLock:
    """An exclusive flock on `path` for the length of a build. Linux releases it when its holder dies, however it
    dies, so a lock is never stale; a live holder is waited for up to `limit` seconds, then it is an error."""

    def __init__(self, path: Path, directory: Path, limit: float, announce: Callable[[str], None]):
        self.path, self.directory, self.limit, self.announce = path, directory, limit, announce
        self.fd: int | None = None

    def __enter__(self) -> _BuildLock:
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.limit
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            holder = _read_holder(fd)
            if time.monotonic() >= deadline:
                os.close(fd)
                raise CppKernelBuildError(
                    f"the reference C++ CPU kernels are being built in {self.directory} by another process "
                    f"({holder}), which has not finished within the limit of {self.limit:g} s ({BUILD_TIMEOUT_ENV}); "
                    "end that process, or raise the limit")
            if not told:
                self.announce(f"waiting for another process ({holder}) building the reference C++ CPU kernels "
                              f"in {self.directory} (limit {self.limit:g} s) ...")
                told = True
            time.sleep(0.25)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {platform.node()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)   # releases the flock
            self.fd = None


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "pid unknown"


def _remove_stale_torch_lock(directory: Path) -> Path | None:
    """Remove torch's own build lock (FileBaton: a file that names no owner) if a killed build left it in `directory`;
    the file removed, or None. Every torch build there runs under a `_BuildLock`, which the caller holds: no build is
    running, so the file is stale (left, it would make torch wait for it forever)."""
    baton = directory / "lock"
    if not baton.exists():
        return None
    baton.unlink(missing_ok=True)
    logger.warning("removed %s, left by a build that was stopped or killed", baton)
    return baton


# The builder: torch.utils.cpp_extension.load in a process of its own, leading its own process group (itself and ninja;
# ninja puts each compiler in a group of its own). SIGTERM, from its starter or from PR_SET_PDEATHSIG when its starter
# dies, stops the build: ninja passes the signal on to its compilers' groups and waits for them, then the group ends.
_BUILDER = """
import ctypes, json, os, signal, sys, time
spec = json.loads(sys.argv[1])

def stop(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.05)
        except ChildProcessError:
            break
    os.killpg(0, signal.SIGKILL)

signal.signal(signal.SIGTERM, stop)
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)   # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != spec["parent"]:
    sys.exit("the process that started this build has ended")
from torch.utils.cpp_extension import load
try:
    load(name=spec["name"], sources=spec["sources"], extra_cflags=spec["cflags"], extra_ldflags=spec["ldflags"],
         build_directory=spec["directory"], is_python_module=False, verbose=False)
except Exception as exc:
    sys.exit(str(exc))
"""


def _run_builder(name: str, directory: Path, limit: float, lock_fd: int | None = None) -> None:
    """Build `name` into `directory` in a builder process within `limit` seconds; `CppKernelBuildError` naming the
    directory (and the limit, or the compiler's output) otherwise. Whatever happens, no process of it runs after.
    The builder shares `lock_fd` (the build lock's descriptor): should this process die, the lock is held until the
    builder has stopped its compilers."""
    import tempfile

    spec = {"parent": os.getpid(), "name": name, "sources": [str(CSRC_DIR / s) for s in SOURCES],
            "cflags": build_flags(), "ldflags": ["-fopenmp"], "directory": str(directory)}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-c", _BUILDER, json.dumps(spec)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                pass_fds=() if lock_fd is None else (lock_fd,))
        try:
            finished = _wait_unreaped(proc.pid, limit)
        finally:   # a timeout, an interrupt, a builder killed on its own: none of its compilers may go on
            _stop_group(proc.pid)
            proc.wait()
        if not finished:
            raise CppKernelBuildError(
                f"building the reference C++ CPU kernels in {directory} took longer than its limit of {limit:g} s "
                f"({BUILD_TIMEOUT_ENV}) and was stopped; raise the limit if this machine is that slow")
        if proc.returncode != 0:
            err.seek(0)
            detail = err.read().decode(errors="replace").strip() or f"the build process ended ({proc.returncode})"
            raise CppKernelBuildError(f"building the reference C++ CPU kernels in {directory} failed: {detail}")


def _wait_unreaped(pid: int, limit: float) -> bool:
    """Wait up to `limit` s for child `pid` to end, leaving it unreaped (its pid, and so its process group's id,
    cannot name another process yet); whether it ended."""
    deadline = time.monotonic() + limit
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _stop_group(pgid: int, grace: float = 15.0) -> None:
    """End process group `pgid`: SIGTERM (ninja stops its compilers, in groups of their own, and waits for them),
    then SIGKILL to whatever still runs after `grace` seconds. Nothing to do for a group whose members have ended."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace
    while _group_runs(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _group_runs(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (one ended and not yet reaped does not count)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


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
