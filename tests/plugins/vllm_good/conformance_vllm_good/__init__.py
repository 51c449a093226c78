"""A correct vLLM platform plugin for a CPU "device", written only against vLLM 0.32's public API.

An out-of-tree subclass of vLLM's CpuPlatform, one `vllm.ir` implementation (`rms_norm`, provider
`good_cpu`, first in the platform's IR priorities) and three `CustomOp.register_oot` replacements
(`SiluAndMul`, `GeluAndMul`, `QuickGELU`). Every one is right, so `pytest --platform=vllm` grades it
CONFORMANT; the defects of vLLM's own layers on this platform are reported as upstream, apart.
"""


def register() -> str | None:
    """The platform class vLLM should use (vllm.platform_plugins)."""
    return "conformance_vllm_good.platform.GoodCpuPlatform"


def register_kernels() -> None:
    """Register the IR implementation and the layer replacements (vllm.general_plugins; safe to call twice)."""
    from conformance_vllm_good import kernels, layers  # noqa: F401 - importing registers them
