"""The built wheel is the product: it ships csrc/, so the `cpp` provider works from an installed
package, and its `conformance` script and pytest plugin work from a directory outside the checkout.
The installed sources hash to the checkout's build name (the same bytes of every source and header,
the same flags, compiler and torch), so the installed package loads the library the checkout built:
what a cold build from the wheel's sources would make, without building it a second time.

The wheel is built without build isolation and installed with --no-deps into a fresh virtual
environment that reaches this interpreter's packages (torch, pytest, ...) through a .pth file, so
nothing is downloaded. Marked `packaging` (deselect with `-m "not packaging"`); CI runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]
# What a wheel is built from (a copy, so the build leaves no build/ or egg-info in the checkout).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "reference_impl", "conformance", "suites", "csrc")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info", "build")


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=IGNORED)
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-build-isolation", "--no-deps", "-q", "-w", str(out)])
    (built,) = out.glob("reference_impl_conformance-*.whl")
    return built


def test_wheel_ships_every_kernel_source_and_the_entry_points(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = sorted(p.relative_to(ROOT / "csrc").as_posix() for p in (ROOT / "csrc").rglob("*") if p.is_file())
    assert sources, "the checkout has no csrc/ files"
    missing = [s for s in sources if f"reference_impl/_csrc/{s}" not in names]
    assert not missing, f"kernel sources missing from the wheel: {missing}"
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "conformance = conformance.cli:main" in text
    assert "conformance = conformance.pytest_plugin" in text
    assert not [n for n in names if n.startswith("tests/")], "the project's own tests must not ship"


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed (--no-deps), then given this interpreter's packages."""
    venv = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)])
    # Only after the install, so pip never sees (or touches) this interpreter's own copy of the project.
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    (site / "_reuse_outer_packages.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "REFERENCE_IMPL_PLUGINS", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}


def test_installed_wheel_runs_the_harness_outside_the_checkout_with_cpp_kernels(installed, tmp_path):
    from reference_impl.kernels import _cpp_build

    _cpp_build.load()   # the checkout's library (built here if no test has yet)
    python, script = installed / "bin" / "python", installed / "bin" / "conformance"
    env = _env()
    where = _run([str(python), "-c", "import conformance, reference_impl; from reference_impl.kernels import _cpp_build;"
                  "print(conformance.__file__); print(reference_impl.__file__); print(_cpp_build.CSRC_DIR);"
                  "print(_cpp_build.build_name())"],
                 cwd=tmp_path, env=env).stdout.split()
    assert all(Path(p).is_relative_to(installed) for p in where[:3]), f"not imported from the installed wheel: {where}"
    assert Path(where[2]).parts[-3:] == ("reference_impl", "_csrc", "cpu")
    assert where[3] == _cpp_build.build_name(), "the packaged kernel sources differ from the checkout's"

    assert "repro" in _run([str(script), "--help"], cwd=tmp_path, env=env).stdout

    results = tmp_path / "results.json"
    run = subprocess.run([str(python), "-m", "pytest", "--platform=cpu", "--conformance-level=quick",
                          "-k", "test_numerics and test_ir_case and rms_norm-cpp", f"--conformance-json={results}",
                          "-p", "no:cacheprovider", "-q"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    doc = json.loads(results.read_text())
    cpp = [r for r in doc["results"] if r["provider"] == "cpp" and r["op"] == "rms_norm"]
    passed = [r for r in cpp if r["outcome"] == "PASS"]
    # Without the packaged sources the provider registers supported=False: every result NOT_SUPPORTED.
    assert len(passed) >= len(cpp) * 3 // 4, sorted((r["case"], r["outcome"], r["message"]) for r in cpp)
    assert {r["outcome"] for r in cpp} <= {"PASS", "NOT_SUPPORTED"}
    assert "building reference C++ CPU kernels" not in run.stdout + run.stderr, "the checkout's build was not reused"

    selected = _run([str(python), "-c",
                     "import torch\n"
                     "from reference_impl import ir\n"
                     "from reference_impl.platforms import activate_platform\n"
                     "with activate_platform('cpu'):\n"
                     "    x = torch.randn(4, 64, dtype=torch.bfloat16); w = torch.ones(64, dtype=torch.bfloat16)\n"
                     "    print(ir.ops.rms_norm.dispatch(x, w, 1e-6).provider)\n"], cwd=tmp_path, env=env).stdout
    assert selected.split()[-1] == "cpp"
    assert _run([str(script), "validate", str(results)], cwd=tmp_path, env=env).returncode == 0
