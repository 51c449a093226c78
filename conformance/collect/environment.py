"""The results file's `environment`: versions, the device and driver, and the plugin distribution tested.

Required keys are python, torch, reference_impl and seed; triton, device_name, driver and plugin are
recorded where known and null otherwise, so two files can be told apart by more than their date. A
bridged platform adds its runtime's version (`vllm` for `--platform=vllm`).
"""

from __future__ import annotations

import platform as _pyplatform
from typing import Any


def triton_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton")
    except PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip() or None
    except OSError:
        pass
    return _pyplatform.processor() or None


def _nvidia_driver() -> str | None:
    """The kernel driver's version from /proc/driver/nvidia/version ('NVRM version: ... 550.54.14 ...')."""
    try:
        with open("/proc/driver/nvidia/version") as fh:
            first = fh.readline()
    except OSError:
        return None
    words = [w for w in first.split() if w[:1].isdigit() and "." in w]
    return words[0] if words else None


def device_and_driver(device_type: str | None) -> tuple[str | None, str | None]:
    """(device name, driver version) of the platform's device type, where this process can tell."""
    import torch

    if device_type == "cpu":
        return _cpu_model(), None
    if device_type == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        if torch.version.hip:
            return name, f"hip {torch.version.hip}"
        return name, _nvidia_driver()
    return None, None


def bridged_versions(platform: Any) -> dict[str, str]:
    """The versions a bridged platform adds to the environment (the vLLM bridge: {"vllm": its release}); {} else."""
    return dict(getattr(platform, "conformance_environment", dict)())


def collect(seed: int, platform_name: str | None = None, platform: Any = None) -> dict[str, Any]:
    """The environment object; `platform_name` finds the plugin distribution, `platform` the device type."""
    import torch

    import reference_impl
    from reference_impl.plugins import platform_distribution

    device_name, driver = device_and_driver(str(getattr(platform, "device_type", "")) or None)
    bridged = getattr(platform, "conformance_plugin", None)   # a bridged platform names the distribution it tests
    extra = bridged_versions(platform)   # a bridge adds its runtime's version
    return {**extra, "python": _pyplatform.python_version(), "torch": torch.__version__.split("+")[0],
            "reference_impl": reference_impl.__version__, "seed": seed, "triton": triton_version(),
            "device_name": device_name, "driver": driver,
            "plugin": bridged or (platform_distribution(platform_name) if platform_name else None)}
