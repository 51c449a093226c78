"""vLLM's CPU worker for the out-of-tree platform: vLLM 0.32's `CPUWorker` takes a sleep-mode memory pool on every
platform but CUDA, ROCm, XPU and `CpuPlatform` itself, and there is none for a CPU device (docs/vllm.md)."""

from contextlib import nullcontext

from vllm.v1.worker.cpu_worker import CPUWorker


class OotCpuWorker(CPUWorker):
    def _maybe_get_memory_pool_context(self, tag: str):
        return nullcontext()
