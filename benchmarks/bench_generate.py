"""Generation speed of the reference decoder with its KV cache (a measurement, not a test).

    .venv/bin/python benchmarks/bench_generate.py [--preset small] [--batch 4] [--prompt-len 32]
        [--steps 16] [--inductor]

Tables: prefill and decode tokens/s on the cpu platform for native eager (every IR op on native),
the cpp providers eager, and compiled through ReferenceCompileBackend (aot_eager; `--inductor`
adds the inductor inner compiler); decode time per step by layer class (torch.profiler); peak
live tensor memory of one prefill with the residual path on `fused_add_rms_norm.maybe_inplace`
vs its functional overload; and a context-length sweep of decode time per token with the KV cache
next to a full recompute of the sequence. Timings are medians of repeats, the modes interleaved.

OMP_WAIT_POLICY defaults to PASSIVE here: on a shared, oversubscribed CPU the OpenMP threads of
the C++ kernels otherwise spin after every parallel region and slow the next matmul 10x or more.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import weakref

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before torch starts its OpenMP runtime

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from reference_impl import ir  # noqa: E402
from reference_impl.compilation import compile_module  # noqa: E402
from reference_impl.config import CompilationConfig, CompilationMode, RuntimeConfig  # noqa: E402
from reference_impl.generate import PRESETS  # noqa: E402
from reference_impl.ir.op import IrOp  # noqa: E402
from reference_impl.models import build_model, generate  # noqa: E402
from reference_impl.platforms import CpuPlatform, activate_platform  # noqa: E402


@contextlib.contextmanager
def all_native():
    """Every IR op on its native implementation inside the block."""
    with contextlib.ExitStack() as stack:
        for op in list(IrOp.registry.values()):
            stack.enter_context(op.set_priority(["native"]))
        yield


def prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (length + i,), generator=gen).tolist() for i in range(batch)]


def rate_once(model, runner, batch, steps) -> tuple[float, float]:
    """Prefill and decode tokens/s of one generation."""
    out = generate(runner, batch, steps, cache=model.allocate_kv_cache(len(batch), max(map(len, batch)) + steps))
    return out.prompt_tokens / out.prefill_seconds, len(batch) * (steps - 1) / out.decode_seconds


def rates_table(config, args) -> list[list]:
    batch = prompts(args.batch, args.prompt_len, config.vocab_size)
    model = build_model(config, torch.float32, seed=0)
    modes = {"native eager": (model, all_native), "cpp providers eager": (model, contextlib.nullcontext)}
    inners = ["aot_eager"] + (["inductor"] if args.inductor else [])
    for inner in inners:
        torch._dynamo.reset()
        compiled = compile_module(model, RuntimeConfig(CompilationConfig(mode=CompilationMode.REFERENCE_COMPILE,
                                                                         backend=inner)))
        start = time.perf_counter()
        generate(compiled, batch[:2], 2, cache=model.allocate_kv_cache(2, max(map(len, batch)) + 2))
        compile_s = time.perf_counter() - start
        modes[f"compiled ({inner}; {compile_s:.0f} s to compile)"] = (compiled, contextlib.nullcontext)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
    for i in range(args.repeats + 1):          # the first round warms up; modes interleaved
        for name, (runner, ctx) in modes.items():
            with ctx():
                rate = rate_once(model, runner, batch, args.steps)
            if i:
                samples[name].append(rate)
    rows = [[name, statistics.median(p for p, _ in got), statistics.median(d for _, d in got)]
            for name, got in samples.items()]
    base = rows[0][2]
    graphs = [r for r in modes.values() if hasattr(r[0], "backend")]
    note = [f"graphs compiled per mode: {[g[0].backend.num_compilations for g in graphs]}"]
    return [[name, f"{p:.0f}", f"{d:.1f}", f"{d / base:.2f}x"] for name, p, d in rows], note


class _LayerTimer:
    """Wraps every submodule's forward in a profiler range named after its class."""

    def __init__(self, model):
        self.handles = []
        for module in model.modules():
            if module is model:
                continue
            name = f"layer::{type(module).__qualname__}"
            self.handles.append(module.register_forward_pre_hook(self._enter(name)))
            self.handles.append(module.register_forward_hook(self._exit))

    @staticmethod
    def _enter(name):
        def hook(module, args):
            module.__dict__.setdefault("_bench_ranges", []).append(torch.autograd.profiler.record_function(name))
            module._bench_ranges[-1].__enter__()
        return hook

    @staticmethod
    def _exit(module, args, output):
        module._bench_ranges.pop().__exit__(None, None, None)

    def remove(self):
        for h in self.handles:
            h.remove()


def layer_table(config, args) -> list[list]:
    """Self-inclusive time per layer class over decode steps (cpp providers, eager)."""
    batch = prompts(args.batch, args.prompt_len, config.vocab_size)
    model = build_model(config, torch.float32, seed=0)
    generate(model, batch, 3, cache=model.allocate_kv_cache(len(batch), max(map(len, batch)) + 3))   # warm-up
    timer = _LayerTimer(model)
    steps = args.steps
    cache = model.allocate_kv_cache(len(batch), max(map(len, batch)) + steps)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])

    def after_step(i):   # profile the decode steps only: start once the prefill is done
        if i == 0:
            prof.start()

    try:
        generate(model, batch, steps, cache=cache, on_step=after_step)
    finally:
        prof.stop()
        timer.remove()
    per_step = steps - 1
    rows = []
    for evt in prof.key_averages():
        if evt.key.startswith("layer::"):
            rows.append([evt.key.removeprefix("layer::"), evt.count // per_step, evt.cpu_time_total / 1e3 / per_step])
    rows.sort(key=lambda r: -r[2])
    return [[n, c, f"{ms:.2f}"] for n, c, ms in rows]


class _PeakLive(TorchDispatchMode):
    """Peak bytes of tensor storages created inside the block and still alive (CPU has no allocator stats)."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.seen: set[int] = set()

    def _free(self, key: int, size: int):
        self.seen.discard(key)
        self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.seen:
                    self.seen.add(key)
                    size = storage.nbytes()
                    self.live += size
                    weakref.finalize(t, self._free, key, size)
                    self.peak = max(self.peak, self.live)
        return out


@contextlib.contextmanager
def functional_residual():
    """The residual path through `fused_add_rms_norm`'s functional overload instead of maybe_inplace."""
    op = ir.ops.fused_add_rms_norm
    saved = op.maybe_inplace
    op.maybe_inplace = op
    try:
        yield
    finally:
        op.maybe_inplace = saved


def memory_table(config, args) -> list[list]:
    """Peak live bytes of the decoder stack (no LM head) over one prompt of 4 x prompt-len tokens."""
    from reference_impl.models import using_kv_cache

    length = args.prompt_len * 4
    ids = torch.tensor(prompts(1, length, config.vocab_size)[0])
    model = build_model(config, torch.float32, seed=0)
    rows = []
    for name, ctx in (("maybe_inplace (donated)", contextlib.nullcontext()), ("functional", functional_residual())):
        for runner_name, forward in (("eager", model.model),):   # a dispatch mode cannot watch compiled code
            with ctx, torch.no_grad(), using_kv_cache(model.allocate_kv_cache(1, length)):
                args_ = (ids, torch.arange(length), (torch.tensor([0, length]), torch.tensor([length])))
                forward(*args_)   # warm-up / compile outside the measurement
                tracker = _PeakLive()
                with tracker:
                    forward(*args_)
            rows.append([name, runner_name, length, f"{tracker.peak / 2 ** 20:.2f}"])
    return rows


def context_table(config, args) -> list[list]:
    """Decode ms per token against context length: KV cache vs recomputing the sequence."""
    model = build_model(config, torch.float32, seed=0)
    rows = []
    base_kv = base_re = None
    for length in args.contexts:
        batch = prompts(1, length, config.vocab_size)
        kv = []
        for _ in range(args.repeats):
            out = generate(model, batch, args.sweep_steps + 1,
                           cache=model.allocate_kv_cache(1, length + args.sweep_steps + 1))
            kv.append(out.decode_seconds / args.sweep_steps * 1e3)
        ids = torch.tensor(batch[0])
        recompute = []
        with torch.no_grad():
            for _ in range(args.repeats):
                start = time.perf_counter()
                model(ids, torch.arange(ids.numel()))
                recompute.append((time.perf_counter() - start) * 1e3)
        kv_ms, re_ms = statistics.median(kv), statistics.median(recompute)
        base_kv, base_re = base_kv or kv_ms, base_re or re_ms
        rows.append([length, f"{kv_ms:.2f}", f"{kv_ms / base_kv:.2f}x", f"{re_ms:.2f}", f"{re_ms / base_re:.2f}x",
                     f"{length / args.contexts[0]:.0f}x"])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="small")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--contexts", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    p.add_argument("--sweep-steps", type=int, default=8)
    p.add_argument("--inductor", action="store_true", help="also compile with the inductor inner compiler")
    args = p.parse_args()
    config = PRESETS[args.preset]
    with activate_platform(CpuPlatform()):
        print(f"model {args.preset}: {config.num_layers} layers, hidden {config.hidden_size}, vocab "
              f"{config.vocab_size}, float32, cpu platform, {torch.get_num_threads()} threads, OMP_WAIT_POLICY="
              f"{os.environ['OMP_WAIT_POLICY']}, load average {os.getloadavg()[0]:.1f}; batch {args.batch} "
              f"prompts of {args.prompt_len}..{args.prompt_len + args.batch - 1} tokens, {args.steps} new tokens")
        print("\nprefill / decode throughput (median of repeats)")
        table, note = rates_table(config, args)
        print(tabulate(table, headers=["mode", "prefill tok/s", "decode tok/s", "decode vs native"]))
        print(*note)
        print("\ndecode time per step by layer class (cpp providers, eager; includes nested layers)")
        print(tabulate(layer_table(config, args), headers=["layer", "calls/step", "ms/step"]))
        print("\npeak live tensor memory of one prefill, residual path")
        print(tabulate(memory_table(config, args), headers=["fused_add_rms_norm", "run", "tokens", "peak MiB"]))
        print("\ncontext sweep: decode ms per token, batch 1")
        print(tabulate(context_table(config, args), headers=["context", "KV cache ms", "growth", "recompute ms",
                                                              "growth", "context growth"]))


if __name__ == "__main__":
    main()
