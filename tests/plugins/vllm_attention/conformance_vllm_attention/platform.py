"""vLLM's CPU platform as an out-of-tree device that selects the vendor's attention backend."""

from vllm.platforms import PlatformEnum
from vllm.platforms.cpu import CpuPlatform


class AcmeAttnCpuPlatform(CpuPlatform):
    _enum = PlatformEnum.OOT
    device_name = "cpu"          # a torch device type: vLLM builds torch.device(f"{device_name}:{rank}")

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        if attn_selector_config.use_mla or attn_selector_config.use_sparse:
            return super().get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)
        return "conformance_vllm_attention.backend.AcmeAttentionBackend"

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        if vllm_config.parallel_config.worker_cls == "auto":   # the engine runs in the plugin's worker
            vllm_config.parallel_config.worker_cls = "conformance_vllm_attention.worker.AcmeCpuWorker"
        super().check_and_update_config(vllm_config)
