"""A small vLLM platform plugin for a CPU "device", written only against vLLM 0.32's public API.

vLLM calls `register()` while it resolves its platform (entry point group `vllm.platform_plugins`)
and `register_kernels()` in every process it starts (group `vllm.general_plugins`).
"""


def register() -> str | None:
    """The platform class vLLM should use, or None when the device is absent (a CPU is always there)."""
    return "my_vllm_plugin.platform.MyCpuPlatform"


def register_kernels() -> None:
    """Register the plugin's IR implementation and its CustomOp replacement (safe to call twice)."""
    from my_vllm_plugin import kernels, layers  # noqa: F401 - importing registers them
