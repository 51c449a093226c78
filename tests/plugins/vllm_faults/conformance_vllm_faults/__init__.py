"""A vLLM platform plugin, written only against vLLM 0.32's public API, whose layer replacements are
wrong in ways that compute the right values yet never run the vendor's code, or that skip saturation.

`faults_cpu` (group `vllm.platform_plugins`) is vLLM's CPU platform as an out-of-tree device, so
vLLM's CustomOps dispatch to `forward_oot`; `faults_layers` (group `vllm.general_plugins`) registers
the replacements of `conformance_vllm_faults.layers`, one fault each.
"""


def register() -> str:
    return "conformance_vllm_faults.platform.FaultsCpuPlatform"


def register_layers() -> None:
    from conformance_vllm_faults import layers  # noqa: F401 - importing registers them
