"""Compile cost and memory effect of the reference compile pipeline, measured in one run.

For a decoder-layer-shaped function (fused_add_rms_norm -> up proj -> silu_and_mul -> down proj ->
fused_add_rms_norm) and each configuration (maybe_inplace or functional overload; the fused-add
provider: the in-place C++ "cpp" kernel when it is available, else native), prints:
  - first-call seconds (Dynamo + AOTAutograd + our passes + inner compiler + one run), and the
    seconds spent in each of our passes;
  - buffers the inductor-generated code allocates per call (`empty_strided` calls);
  - median microseconds per call, compiled and eager.
Also the compile time of the fused rms_norm + static fp8 quant path. Inductor's on-disk kernel
cache makes second runs faster: set TORCHINDUCTOR_CACHE_DIR to a fresh directory for cold numbers.

    python benchmarks/bench_compile.py [--tokens 64] [--hidden 1024] [--inner inductor,aot_eager]
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

import torch
from tabulate import tabulate
from torch._inductor.utils import run_and_get_code

from reference_impl import ir
from reference_impl.compilation import ReferenceCompileBackend
from reference_impl.platforms import get_current_platform

EPS = 1e-6
_ALLOC = re.compile(r"\bbuf\d+ = empty_strided_\w+\(")


def decoder_layer(call):
    def layer(x, residual, w1, w2, up, down):
        h, residual = call(x, residual, w1, EPS)
        h = ir.ops.silu_and_mul(h @ up)
        h = h @ down
        return call(h, residual, w2, EPS)
    return layer


def make_inputs(tokens, hidden, inter, dtype):
    g = torch.Generator().manual_seed(0)
    x, r = torch.randn(tokens, hidden, generator=g), torch.randn(tokens, hidden, generator=g)
    w1, w2 = torch.randn(hidden, generator=g) * 0.1 + 1, torch.randn(hidden, generator=g) * 0.1 + 1
    up = torch.randn(hidden, 2 * inter, generator=g) * hidden ** -0.5
    down = torch.randn(inter, hidden, generator=g) * inter ** -0.5
    args = [t.to(dtype) for t in (x, r, w1, w2, up, down)]
    for t in args[:2]:
        torch._dynamo.mark_dynamic(t, 0)
    return args


def median_us(fn, args, iters):
    fn(*args)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def bench_layer(inner, form, provider, cfg):
    torch._dynamo.reset()
    far = ir.ops.fused_add_rms_norm
    layer = decoder_layer(far.maybe_inplace if form == "maybe_inplace" else far)
    backend = ReferenceCompileBackend(inner=inner)
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    with far.set_priority([provider]):
        args = make_inputs(cfg.tokens, cfg.hidden, cfg.inter, cfg.dtype)
        start = time.perf_counter()
        if inner == "inductor":
            _, code = run_and_get_code(compiled, *args)
            allocs = len(_ALLOC.findall("\n".join(code)))
        else:
            compiled(*args)
            allocs = None
        first = time.perf_counter() - start
        ctx = backend.pass_context
        compiled_us = median_us(compiled, make_inputs(cfg.tokens, cfg.hidden, cfg.inter, cfg.dtype), cfg.iters)
        eager_us = median_us(layer, make_inputs(cfg.tokens, cfg.hidden, cfg.inter, cfg.dtype), cfg.iters)
    passes = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in ctx.pass_seconds.items())
    return [inner, form, provider, f"{first:.2f}", passes, allocs, f"{compiled_us:.0f}", f"{eager_us:.0f}"]


def bench_fused_quant(inner, cfg):
    torch._dynamo.reset()

    def fn(x, w, scale):
        return ir.ops.static_quant_fp8(ir.ops.rms_norm(x, w, EPS), scale)

    backend = ReferenceCompileBackend(inner=inner)
    x = torch.randn(cfg.tokens, cfg.hidden).to(cfg.dtype)
    torch._dynamo.mark_dynamic(x, 0)
    w, scale = torch.ones(cfg.hidden, dtype=cfg.dtype), torch.tensor([0.01])
    start = time.perf_counter()
    torch.compile(fn, backend=backend, fullgraph=True)(x, w, scale)
    return [inner, f"{time.perf_counter() - start:.2f}", dict(backend.selected_impls)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--inter", type=int, default=2048)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--inner", default="inductor,aot_eager")
    parser.add_argument("--iters", type=int, default=50)
    cfg = parser.parse_args()
    cfg.dtype = getattr(torch, cfg.dtype)
    platform = get_current_platform()
    torch.set_grad_enabled(False)
    far = ir.ops.fused_add_rms_norm
    inplace = [p for p, impl in far.impls.items() if impl.inplace and impl.supported]
    providers = (["cpp"] if "cpp" in inplace else inplace[:1]) + ["native"]
    print(f"platform {platform.device_name}; torch {torch.__version__}; {torch.get_num_threads()} threads; "
          f"tokens={cfg.tokens} hidden={cfg.hidden} inter={cfg.inter} {cfg.dtype}")

    rows = []
    start = time.perf_counter()
    for inner in cfg.inner.split(","):
        for provider in providers:
            for form in ("maybe_inplace", "functional"):
                rows.append(bench_layer(inner, form, provider, cfg))
    print(tabulate(rows, headers=["inner", "form", "fused_add provider", "first call s", "our passes (ms)",
                                  "buffers/call", "compiled us", "eager us"]))
    print()
    print(tabulate([bench_fused_quant(inner, cfg) for inner in cfg.inner.split(",")],
                   headers=["inner", "rms_norm+quant first call s", "selected"]))
    print(f"\ntotal {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
