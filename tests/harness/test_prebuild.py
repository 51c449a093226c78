"""The first C++ build of a conformance run is announced on the terminal, even under xdist (README promises a line)."""

from __future__ import annotations

import re
import shutil
import types

import pytest

from conformance.run import prebuild
from harness_runner import run_harness
from reference_impl.kernels import _cpp_build


def _inventory(*providers):
    return types.SimpleNamespace(ir_providers={"rms_norm": list(providers)})


def test_a_build_is_announced_before_it_starts_and_timed_after(monkeypatch):
    said = []

    def fake_load(announce):
        said.append("building started")            # what load() does after its notice
        announce("building reference C++ CPU kernels (first use, ~15 s) in /x ...")

    monkeypatch.setattr(_cpp_build, "toolchain_problem", lambda: None)
    monkeypatch.setattr(_cpp_build, "load", fake_load)
    prebuild.prebuild_reference_kernels(_inventory("cpp"), said.append)
    assert said[1] == "conformance: building reference C++ CPU kernels (first use, ~15 s) in /x ..."
    assert re.fullmatch(r"conformance: reference C\+\+ CPU kernels built in \d+ s", said[2])


def test_nothing_is_said_for_a_cached_build_a_platform_without_cpp_or_no_toolchain(monkeypatch):
    said, loads = [], []
    monkeypatch.setattr(_cpp_build, "load", lambda announce: loads.append(1))   # cached: no notice
    monkeypatch.setattr(_cpp_build, "toolchain_problem", lambda: None)
    prebuild.prebuild_reference_kernels(_inventory("cpp"), said.append)
    prebuild.prebuild_reference_kernels(_inventory("myplat"), said.append)
    monkeypatch.setattr(_cpp_build, "toolchain_problem", lambda: "no C++ compiler")
    prebuild.prebuild_reference_kernels(_inventory("cpp"), said.append)
    assert said == [] and loads == [1]


def test_a_failed_build_is_one_line_and_the_run_goes_on(monkeypatch):
    said = []

    def failing_load(announce):
        announce("building ...")
        raise _cpp_build.CppKernelBuildError("building the reference C++ CPU kernels in /x failed: error: boom\nmore")

    monkeypatch.setattr(_cpp_build, "toolchain_problem", lambda: None)
    monkeypatch.setattr(_cpp_build, "load", failing_load)
    prebuild.prebuild_reference_kernels(_inventory("cpp"), said.append)
    assert said[-1] == ("conformance: the reference C++ CPU kernels did not build: building the reference C++ CPU "
                        "kernels in /x failed: error: boom more")


def test_the_notice_reaches_the_terminal_of_a_run_with_xdist_workers(tmp_path):
    """A copy of the kernel cache without its library: the run builds it again, and the notice appears once, before
    the first check's result, although every check runs in an xdist worker's kernel worker. Where this checkout
    built the cached library, its build directory is in the copy and the run only relinks (seconds); where another
    checkout with the same sources built it (the cache is keyed by content), the copy has no build directory of
    this checkout's and the run builds cold (about 2 min on 2 cores)."""
    if _cpp_build.toolchain_problem() is not None:
        pytest.skip(f"C++ CPU kernels unavailable: {_cpp_build.toolchain_problem()}")
    _cpp_build.load()
    name = _cpp_build.build_name()
    cached = _cpp_build.library_path(name).parent   # the library and this checkout's build directory
    extensions = tmp_path / "torch_extensions"
    shutil.copytree(cached, extensions / name)
    build = extensions / name / _cpp_build.build_directory(name).name
    (extensions / name / f"{name}.so").unlink()
    (build / f"{name}.so").unlink(missing_ok=True)   # absent where another checkout built the cached library
    run = run_harness(tmp_path, "cpu", "-n", "2", "-k", "rms_norm and float32 and ir_case and 128 and not 1280 and not "
                      "fused", env={"TORCH_EXTENSIONS_DIR": str(extensions)}, timeout=600)
    assert run.returncode == 0, run.output[-3000:]
    lines = run.output.splitlines()
    notice = [i for i, ln in enumerate(lines) if ln.startswith("conformance: building reference C++ CPU kernels")]
    assert len(notice) == 1 and str(extensions / name) in lines[notice[0]], run.output[-3000:]
    assert re.fullmatch(r"conformance: reference C\+\+ CPU kernels built in \d+ s", lines[notice[0] + 1])
    first_result = next(i for i, ln in enumerate(lines) if re.search(r"\[\s*\d+%\]|passed|PASSED", ln))
    assert notice[0] < first_result
    assert (extensions / name / f"{name}.so").is_file()
    assert run.doc["run"]["complete"] and {r["outcome"] for r in run.results} == {"PASS"}


def test_a_build_over_its_limit_is_one_line_and_the_run_goes_on(tmp_path):
    """An empty kernel cache and a build limit of 5 s: the run says once, on the terminal, that the kernels did not
    build, naming the limit and the build directory, and ends with results instead of waiting. Cost: about 25 s."""
    if _cpp_build.toolchain_problem() is not None:
        pytest.skip(f"C++ CPU kernels unavailable: {_cpp_build.toolchain_problem()}")
    extensions = tmp_path / "torch_extensions"
    run = run_harness(tmp_path, "cpu", "-k", "rms_norm and float32 and ir_case and 128 and not 1280 and not fused",
                      env={"TORCH_EXTENSIONS_DIR": str(extensions), _cpp_build.BUILD_TIMEOUT_ENV: "5"}, timeout=300)
    failed = [ln for ln in run.output.splitlines() if "the reference C++ CPU kernels did not build" in ln]
    assert len(failed) == 1, run.output[-3000:]
    # the controller's prebuild either builds past the limit itself or waits past it for its kernel worker's build
    # (the worker starts ahead of the first check, and whichever takes the build lock first builds): one limit error
    assert re.search(r"(took longer than its limit|has not finished within the limit) of 5 s", failed[0]), failed[0]
    assert _cpp_build.BUILD_TIMEOUT_ENV in failed[0]
    assert str(extensions / _cpp_build.build_name()) in failed[0]
    assert run.doc is not None and run.results, run.output[-3000:]
    assert not (extensions / _cpp_build.build_name() / f"{_cpp_build.build_name()}.so").exists()
