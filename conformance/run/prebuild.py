"""Build the reference C++ CPU kernels once, in the pytest process that owns the terminal, before any check.

The kernel workers build them at start when the platform brings the `cpp` provider, but a worker's
output goes to its log and an xdist worker's is captured, so a cold build (about a minute) used to
sit silent. The controller builds first instead, with its one-line notice on the terminal; every
kernel worker then loads the cached build. Nothing is built for `--collect-only`, a platform
without `cpp`, or a toolchain that cannot build (the checks report that where the kernels are called).
A build never waits forever: past its limit (`REFERENCE_IMPL_CPP_BUILD_TIMEOUT`, reference_impl.kernels._cpp_build)
it is one line naming the limit and the build directory, and the run goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def brings_cpp(inventory) -> bool:
    return any("cpp" in providers for providers in inventory.ir_providers.values())


def prebuild_reference_kernels(inventory, say: Callable[[str], None]) -> None:
    """Build (or load the cached build of) the reference C++ kernels when the platform brings them; a build is
    announced through `say` before it starts and its time after; a failure is one line, not an exception."""
    if not brings_cpp(inventory):
        return
    from reference_impl.kernels import _cpp_build

    if _cpp_build.toolchain_problem() is not None:
        return
    announced = []

    def announce(line: str) -> None:
        announced.append(line)
        say(f"conformance: {line}")

    start = time.perf_counter()
    try:
        _cpp_build.load(announce=announce)
    except Exception as exc:  # noqa: BLE001 - reported again by every check that calls a kernel
        # the first 600 characters: the limit or the lock holder and the directory, or the compiler's first error
        say(f"conformance: the reference C++ CPU kernels did not build: {' '.join(str(exc).split())[:600]}")
        return
    if announced:
        say(f"conformance: reference C++ CPU kernels built in {time.perf_counter() - start:.0f} s")
