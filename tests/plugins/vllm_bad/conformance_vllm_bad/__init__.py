"""vLLM platform plugins that the vLLM bridge must refuse, each with one clear line.

`second_cpu` is an active platform plugin: next to another active one (examples/vllm_plugin's
`my_cpu`) vLLM cannot choose. `raises_on_import` names a module whose import raises, which vLLM
itself would only log before falling back to a built-in platform.
"""


def register_second_cpu() -> str:
    return "vllm.platforms.cpu.CpuPlatform"
