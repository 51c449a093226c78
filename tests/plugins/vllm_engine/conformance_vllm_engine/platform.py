"""vLLM's CPU platform with the plugin's attention backend (stale or fresh builder), and as an out-of-tree device that
brings no MoE (nomoe).

vLLM imports this module while it resolves `current_platform`: nothing here may need `current_platform` at import.
"""

from vllm.platforms import PlatformEnum
from vllm.platforms.cpu import CpuPlatform


class StaleCpuPlatform(CpuPlatform):
    # CpuPlatform's enum (CPU) and device name ("cpu") are kept: vLLM 0.32's engine asks `is_cpu()` before it reaches
    # for a GPU sleep-mode allocator, and builds torch.device(f"{device_name}:{rank}"), so a CPU subclass that
    # declares itself OOT or renames its device cannot start an engine (docs/vllm.md, the engine family)
    backend = "conformance_vllm_engine.attention.StaleCpuAttentionBackend"

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        if attn_selector_config.use_mla or attn_selector_config.use_sparse:
            return super().get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)
        return cls.backend


class FreshCpuPlatform(StaleCpuPlatform):
    backend = "conformance_vllm_engine.attention.FreshCpuAttentionBackend"


class NoMoeCpuPlatform(CpuPlatform):
    """A vendor's out-of-tree platform that brings no MoE of its own: vLLM's CPU platform declared out of tree (so
    vLLM's CustomOps dispatch to `forward_oot`), on the `cpu` device with its own worker (no sleep-mode memory pool),
    with vLLM's CPU attention and layers. vLLM 0.32 leaves an out-of-tree platform's unquantized MoE to the platform
    (`UnquantizedMoeBackend.OOT`), so the engine runs Llama and Gemma-2 and raises on gpt-oss's MoE."""

    _enum = PlatformEnum.OOT
    device_name = "cpu"          # a torch device type: vLLM builds torch.device(f"{device_name}:{rank}")

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        if vllm_config.parallel_config.worker_cls == "auto":   # the engine runs in the plugin's worker
            vllm_config.parallel_config.worker_cls = "conformance_vllm_engine.worker.OotCpuWorker"
        super().check_and_update_config(vllm_config)
