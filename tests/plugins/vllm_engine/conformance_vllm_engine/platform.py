"""vLLM's CPU platform as an out-of-tree device whose attention backend is the plugin's (stale or fresh builder).

vLLM imports this module while it resolves `current_platform`: nothing here may need `current_platform` at import.
"""

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
