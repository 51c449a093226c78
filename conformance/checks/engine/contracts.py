"""What of vLLM's contract for a platform an engine ERROR points to: a small table of the ways vLLM 0.32's own code
raises when a platform plugin leaves out something the engine needs, each tied to the code in vLLM that raises it.

The engine process (conformance/vllm/engine_runner.py) reports a run that raised as the exception, every frame of the
raise ([module, qualified name], outermost first) and facts about the platform vLLM resolved (out of tree or not,
whether its device name is a torch device type, the layers it registered out of tree). `contract_of` matches that
report against `CONTRACTS`, in order; a match names the contract in the ERROR's message with what vLLM does and
what the platform must do, and makes the result the platform's (conformance/checks/engine/whose.py), whichever code
raised. The table holds only what vLLM 0.32 was seen to raise (the frames in tests/engine/test_engine_contracts.py
were recorded from vLLM 0.32.0's CPU build on platforms that leave each piece out), and the frames it names are
vLLM's own, so a vLLM release that moves the code makes an entry miss, never match something else: the ERROR then
carries vLLM's exception without a contract.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class EngineError:
    """A run that raised, as the engine process reported it (engine_runner.error_report)."""

    type: str
    message: str
    frames: tuple[tuple[str, str], ...]      # (module, qualified name), outermost first
    platform: dict                           # engine_runner.platform_facts(); empty where it could not be read

    @classmethod
    def from_report(cls, run: dict) -> EngineError:
        return cls(str(run.get("error_type", "")), str(run.get("error_message", "")),
                   tuple((str(m), str(q)) for m, q in run.get("frames", [])), dict(run.get("platform") or {}))

    def vllm_frames(self) -> list[tuple[str, str]]:
        """The frames in vLLM's own modules, outermost first."""
        return [f for f in self.frames if f[0] == "vllm" or f[0].startswith("vllm.")]

    def innermost_vllm(self) -> tuple[str, str] | None:
        frames = self.vllm_frames()
        return frames[-1] if frames else None

    def on_stack(self, module: str, qualname: str) -> bool:
        return (module, qualname) in self.frames


@dataclasses.dataclass(frozen=True)
class Contract:
    """One part of vLLM's contract for a platform: its name, what vLLM 0.32 does there (and where), what the platform
    must do, and how a raise that breaks it looks."""

    name: str
    vllm_does: str
    platform_must: str
    matches: Callable[[EngineError], bool]

    def describe(self, error: EngineError) -> str:
        return (f"the platform's contract with vLLM's engine: {self.name}: {self.vllm_does.format(**_fields(error))}; "
                f"{self.platform_must.format(**_fields(error))}")


def _fields(error: EngineError) -> dict:
    innermost = error.innermost_vllm() or ("", "")
    return {"device_name": error.platform.get("device_name", "?"), "method": innermost[1]}


def _moe_out_of_tree(e: EngineError) -> bool:
    # select_unquantized_moe_backend (vllm/model_executor/layers/fused_moe/oracle/unquantized.py) returns
    # UnquantizedMoeBackend.OOT for every out-of-tree platform; process_weights_after_loading then builds no kernel
    # ("OOT handles internally"), and MoERunner._apply_quant_method's first question, `quant_method.is_monolithic`,
    # raises AttributeError ('UnquantizedFusedMoEMethod' object has no attribute 'is_monolithic', through
    # torch.nn.Module.__getattr__, as the property reads `self.experts_cls.is_monolithic()` of None)
    return (bool(e.platform.get("out_of_tree")) and "UnquantizedFusedMoEMethod" not in e.platform.get("oot_layers", ())
            and any(m.startswith("vllm.model_executor.layers.fused_moe") for m, _ in e.vllm_frames()))


def _device_name(e: EngineError) -> bool:
    # vllm/v1/worker: an out-of-tree platform's device is torch.device(f"{device_name}:{rank}"); torch raises
    # "Expected one of cpu, cuda, ... device type at start of device string: <name>" for any other name
    return bool(e.platform.get("out_of_tree")) and e.platform.get("device_name_is_torch_device") is False


def _memory_pool(e: EngineError) -> bool:
    # vllm/device_allocator/__init__.py get_mem_allocator_instance, reached from Worker.load_model's
    # _maybe_get_memory_pool_context on every platform but CUDA, ROCm, XPU and CpuPlatform: "Sleep mode allocator is
    # not available on platform X (device_type=...)"
    return e.on_stack("vllm.device_allocator", "get_mem_allocator_instance")


def _worker_class(e: EngineError) -> bool:
    # vllm/v1/worker/worker_base.py WorkerWrapperBase.init_worker imports parallel_config.worker_cls with
    # resolve_obj_by_qualname; vLLM's Platform base leaves it "auto" ("not enough values to unpack")
    return (e.on_stack("vllm.v1.worker.worker_base", "WorkerWrapperBase.init_worker")
            and e.on_stack("vllm.utils.import_utils", "resolve_obj_by_qualname"))


def _attention_backend(e: EngineError) -> bool:
    # vllm/v1/attention/selector.py _cached_get_attn_backend: "Invalid attention backend for <device>" when the
    # platform's get_attn_backend_cls returns nothing, or resolve_obj_by_qualname's import of what it returned fails
    return e.innermost_vllm() in (("vllm.v1.attention.selector", "_cached_get_attn_backend"),
                                  ("vllm.utils.import_utils", "resolve_obj_by_qualname")) and \
        e.on_stack("vllm.v1.attention.selector", "_cached_get_attn_backend")


def _platform_method(e: EngineError) -> bool:
    # vllm/platforms/interface.py: Platform's device methods (manual_seed_all, get_device_name, get_device_total_memory,
    # get_current_memory_usage for memory profiling, set_device, ...) raise a bare NotImplementedError
    innermost = e.innermost_vllm()
    return e.type == "NotImplementedError" and innermost is not None and innermost[0] == "vllm.platforms.interface"


def _ir_priority(e: EngineError) -> bool:
    # vllm/ir/op.py IrOp.dispatch: "Implementation P for op X not supported. All implementations in priority list must
    # be supported." for an unsupported implementation in the platform's IR priorities
    return e.innermost_vllm() == ("vllm.ir.op", "IrOp.dispatch") and "not supported" in e.message


CONTRACTS = (
    Contract("MoE on an out-of-tree platform",
             "vLLM 0.32 hands every out-of-tree platform's unquantized MoE to the platform "
             "(UnquantizedMoeBackend.OOT: it builds no MoE kernel, 'OOT handles internally')",
             "the platform must bring its own MoE: a subclass of vLLM's UnquantizedFusedMoEMethod registered with "
             "UnquantizedFusedMoEMethod.register_oot, preparing its kernel in process_weights_after_loading and "
             "computing in forward_oot (vLLM's MoE runner first asks its is_monolithic)",
             _moe_out_of_tree),
    Contract("device name",
             "vLLM 0.32 builds an out-of-tree platform's devices as torch.device(f'{{device_name}}:{{rank}}')",
             "the platform's device_name '{device_name}' must be a torch device type ('cpu', or the privateuseone "
             "name its device registers)",
             _device_name),
    Contract("memory pool",
             "vLLM 0.32's worker allocates weights and the KV cache in a sleep-mode memory pool on every platform but "
             "CUDA, ROCm, XPU and CpuPlatform itself (Worker._maybe_get_memory_pool_context), and has none for this "
             "one",
             "a platform without one names a worker of its own in check_and_update_config "
             "(parallel_config.worker_cls), a subclass whose _maybe_get_memory_pool_context returns a null context",
             _memory_pool),
    Contract("worker class",
             "vLLM 0.32's WorkerWrapperBase.init_worker imports parallel_config.worker_cls, which vLLM's Platform base "
             "leaves 'auto' (only vLLM's built-in platforms resolve it)",
             "the platform's check_and_update_config must set it to the qualified name of an importable worker class "
             "(e.g. a subclass of vllm.v1.worker.cpu_worker.CPUWorker)",
             _worker_class),
    Contract("attention backend selection",
             "vLLM 0.32 imports the qualified name the platform's get_attn_backend_cls returns for each attention "
             "layer (vllm.v1.attention.selector)",
             "get_attn_backend_cls must return the qualified name of an importable AttentionBackend class for every "
             "selector config the models ask for",
             _attention_backend),
    Contract("platform method",
             "vLLM 0.32's engine calls {method}, which vLLM's Platform base leaves raising NotImplementedError",
             "the platform must implement it (device set-up, seeding and the memory queries of memory profiling are "
             "the platform's; vLLM's CpuPlatform implements them for a CPU-like device)",
             _platform_method),
    Contract("IR priorities",
             "vLLM 0.32's IrOp.dispatch raises on an implementation the platform's IR priorities list that is not "
             "supported here",
             "get_default_ir_op_priority must list only implementations that are supported on the platform",
             _ir_priority),
)


def contract_of(error: EngineError) -> Contract | None:
    """The first contract in CONTRACTS whose signature the raise matches, or None."""
    for contract in CONTRACTS:
        if contract.matches(error):
            return contract
    return None
