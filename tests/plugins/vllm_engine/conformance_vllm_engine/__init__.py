"""Two vLLM platform plugins (vLLM 0.32's public API only) that differ in one line of their attention backend.

`stale_cpu`: its metadata builder, on a decode-only step whose batch is no larger than the previous step's, takes
the previous step's `seq_lens` plus one instead of the batch's own (it "saves a copy"). That holds while the batch
keeps its rows, and goes wrong once a request finishes and vLLM moves another into its row: the moved request
attends over another request's length. Every single-batch attention case passes; vLLM's engine, whose batch shrinks
and reorders, FAILs the `engine` family. `fresh_cpu` is its corrected twin: the batch's own `seq_lens` every step.
Choose one with `VLLM_PLUGINS=stale_cpu` or `VLLM_PLUGINS=fresh_cpu` (both active is an error, as in vLLM).
"""


def register_stale() -> str | None:
    """The platform whose attention builder keeps the previous batch's seq_lens (vllm.platform_plugins)."""
    return "conformance_vllm_engine.platform.StaleCpuPlatform"


def register_fresh() -> str | None:
    """The corrected twin (vllm.platform_plugins)."""
    return "conformance_vllm_engine.platform.FreshCpuPlatform"


def register_nomoe() -> str | None:
    """An out-of-tree platform that brings no MoE (vllm.platform_plugins)."""
    return "conformance_vllm_engine.platform.NoMoeCpuPlatform"
