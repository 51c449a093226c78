"""What a vLLM worker sets up before it builds a model, done once per process for the bridge.

One `VllmConfig` with `compilation_config.custom_ops=["all"]` (so every CustomOp takes the path
vLLM runs on this platform with custom ops enabled; everything else is vLLM's default), and vLLM's
IR priorities, which vLLM fills from the platform's `get_default_ir_op_priority`, installed as the
process default as a vLLM worker does at start (`kernel_config.ir_op_priority.set_default()`).
"""

from __future__ import annotations

from typing import Any

from conformance.vllm.discover import VllmBridgeError, _line

_config: Any = None


def vllm_config():
    """The VllmConfig every bridged vLLM layer is built under (built on first use)."""
    global _config
    if _config is None:
        from vllm.config import CompilationConfig, VllmConfig

        try:
            _config = VllmConfig(compilation_config=CompilationConfig(custom_ops=["all"]))
        except Exception as exc:  # noqa: BLE001 - vLLM would fail to start the same way
            raise VllmBridgeError(f"vLLM cannot build its config on this platform: {_line(exc)}") from exc
    return _config


def install_ir_priorities() -> str | None:
    """Make vLLM's IR priorities the process default; a line saying why vLLM refused them, else None.

    A refusal (a default naming a provider nobody registered) is left to the dispatch checks, which
    grade the same defaults: vLLM's IR ops then keep running native."""
    try:
        vllm_config().kernel_config.ir_op_priority.set_default()
    except Exception as exc:  # noqa: BLE001
        return f"vLLM refused the platform's IR priorities ({_line(exc)}); vLLM's IR ops run native"
    return None


def platform_ir_priorities(platform) -> dict[str, list[str]]:
    """The vLLM platform's `get_default_ir_op_priority(vllm_config)`, as op name -> provider list."""
    from dataclasses import asdict

    return {op: list(providers) for op, providers in asdict(platform.get_default_ir_op_priority(vllm_config())).items()}
