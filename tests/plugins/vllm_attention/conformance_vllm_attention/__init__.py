"""A vLLM platform plugin, written only against vLLM 0.32's public API, that ships its own attention backend.

`acme_attn_cpu` (group `vllm.platform_plugins`) is vLLM's CPU platform as an out-of-tree device whose
`get_attn_backend_cls` returns `conformance_vllm_attention.backend.AcmeAttentionBackend`: vLLM's CPU kernels behind
the vendor's own backend, impl and builder classes, with one planted fault: the impl drops `logits_soft_cap` (a soft
cap hard-coded to 0, a bug public trackers report). Everything else it computes is vLLM's, so the harness must grade
the vendor's backend, attribute its results to this distribution, and FAIL exactly the soft-capped cases.
"""


def register() -> str:
    return "conformance_vllm_attention.platform.AcmeAttnCpuPlatform"
