"""The project's platform-sensitive tests, rerun in a child pytest whose torch reports a CUDA device.

On a GPU machine the default platform is cuda, not cpu; tests that meant the cpu platform failed
there (the H100 run of 2026-11-23). Simulating the machine on the CPU (torch.cuda.is_available and
device_count patched by a sitecustomize in every process of the run, the harness's too) keeps
those tests honest in CI, which has no GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Tests that depend on which platform is current; each must pass whatever the machine has.
PLATFORM_SENSITIVE = (
    "tests/layers/test_layers_attention.py::test_mla_native_uses_sub_layers_native_while_forward_dispatches_them",
    "tests/layers/test_layers_moe.py::test_layer_native_path_is_native_and_platform_path_dispatches_the_method",
    "tests/kernels/test_kernels_cpu.py::test_cpu_platform_dispatches_to_cpp_by_default",
    "tests/platforms/test_plugins_and_platforms.py::test_builtin_detection_is_truthful_here",
    "tests/platforms/test_plugins_and_platforms.py::test_activate_builtin_needs_its_device",
    "tests/platforms/test_plugins_and_platforms.py::test_cpu_platform_activates_on_any_machine",
)
# Not simulated: anything that runs torch.compile (Dynamo saves the CUDA RNG state when torch reports
# a device), e.g. tests/harness/test_compile_fixture.py, which needed `--platform=cpu` to activate on a GPU
# machine: test_cpu_platform_activates_on_any_machine covers that activation here.

# Imported by every Python process of the child run (the harness starts its own), before any test code.
_SITECUSTOMIZE = """
import torch
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.version.cuda = torch.version.cuda or "13.0"
"""


def test_platform_sensitive_tests_pass_on_a_simulated_gpu_machine(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS", "REFERENCE_IMPL_PLUGINS", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "True", probe.stderr[-2000:]   # the simulation is in force
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           *PLATFORM_SENSITIVE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    # Every listed test ran (parametrized ones count once per parameter) and none was skipped.
    assert " passed" in proc.stdout and "skipped" not in proc.stdout and "deselected" not in proc.stdout, tail
