"""The worker vLLM's engine runs the platform in: vLLM's CPU worker, fit for an out-of-tree platform.

vLLM 0.32's `CPUWorker` inherits the GPU worker's weights and KV-cache allocation, which takes a sleep-mode
memory pool on every platform that is not CUDA, ROCm, XPU or `CpuPlatform` itself (`is_cpu()` is false out of
tree), and there is none for a CPU device: this worker allocates from the ordinary heap instead.
"""

from contextlib import nullcontext

from vllm.v1.worker.cpu_worker import CPUWorker


class MyCpuWorker(CPUWorker):
    def _maybe_get_memory_pool_context(self, tag: str):
        return nullcontext()
