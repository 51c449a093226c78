"""A plugin module whose import fails, as one built against a missing vendor library does."""

raise ImportError("libmydevice.so: cannot open shared object file")


def register() -> str:  # pragma: no cover - never reached
    return "vllm.platforms.cpu.CpuPlatform"
