"""Bandwidth of the reference C++ CPU kernels against eager native, inductor and a plain copy.

For each kernel, dtype and one large shape this prints the effective bandwidth (bytes the op
must read and write / best time) of: the "cpp" provider, the native function in eager mode,
the native function compiled by torch.compile (inductor), and a plain copy of the same number of
bytes; then the ratios kernel/copy, kernel/inductor and kernel/eager (ratios of times), all
measured interleaved in one run on this machine. The copy allocates its destination (`clone`)
when the kernel allocates its output and is `copy_` into an existing tensor for in-place kernels.
Targets: >= 0.8 of copy, >= inductor, >= 3x eager.

By default the script runs with glibc malloc set to reuse freed memory (`--allocator reuse`), so
the numbers measure the kernels rather than the kernel's page faults: with glibc defaults every
output above 32 MB is fresh pages, and on small VMs faulting them in (~1 us per 4 KB page) costs
more than the kernel itself for every implementation alike (`--allocator system` shows that).

    python benchmarks/bench_kernels.py              # every kernel, fp32/fp16/bf16
    python benchmarks/bench_kernels.py --quick      # bf16, the main memory-bound kernels, short timing
    python benchmarks/bench_kernels.py --ops rms_norm,silu_and_mul --dtypes bfloat16
"""

from __future__ import annotations

import argparse
import os
import dataclasses
import sys
import time
from collections.abc import Callable

import torch

from reference_impl import ir
from reference_impl.ir.ops.rotary import compute_cos_sin_cache
from reference_impl.kernels import _cpp_build
from reference_impl.kernels import cpu as cpu_kernels

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
    make_args: Callable[[torch.dtype], tuple]
    nbytes: Callable[[tuple], int]


def _randn(*shape, dtype):
    return torch.randn(*shape, dtype=torch.float32).to(dtype)


def _size(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def specs() -> list[Spec]:
    t, h, d = TOKENS, HIDDEN, INTERMEDIATE
    norm = lambda dt: (_randn(t, h, dtype=dt), _randn(h, dtype=dt), 1e-6, None)  # noqa: E731
    fused = lambda dt: (_randn(t, h, dtype=dt), _randn(t, h, dtype=dt), _randn(h, dtype=dt), 1e-6, None)  # noqa: E731
    gated = lambda dt: (_randn(t, 2 * d, dtype=dt),)  # noqa: E731
    unary = lambda dt: (_randn(t, d, dtype=dt),)  # noqa: E731

    def rope(dt):
        positions = torch.randint(0, 8192, (t,))
        cache = compute_cos_sin_cache(HEAD_SIZE, HEAD_SIZE, 8192, 10000.0, dt)
        return (positions, _randn(t, Q_HEADS * HEAD_SIZE, dtype=dt), _randn(t, KV_HEADS * HEAD_SIZE, dtype=dt),
                HEAD_SIZE, cache, True)

    def static_quant(dt):
        x = _randn(t, h, dtype=dt)
        return x, (x.float().abs().amax(dim=-1, keepdim=True) / 448.0)

    gated_bytes = lambda a: _size(a[0]) * 3 // 2  # noqa: E731
    out = [
        Spec("rms_norm", f"{t}x{h}", norm, lambda a: 2 * _size(a[0]) + _size(a[1])),
        Spec("fused_add_rms_norm", f"{t}x{h}", fused, lambda a: 4 * _size(a[0]) + _size(a[2])),
    ]
    for op in ("silu_and_mul", "mul_and_silu", "gelu_and_mul", "fatrelu_and_mul", "swigluoai_and_mul"):
        out.append(Spec(op, f"{t}x{2 * d}", gated, gated_bytes))
    for op in ("gelu_new", "gelu_fast", "quick_gelu", "relu2"):
        out.append(Spec(op, f"{t}x{d}", unary, lambda a: 2 * _size(a[0])))
    out.append(Spec("rotary_embedding", f"{t} tok, {Q_HEADS}/{KV_HEADS}x{HEAD_SIZE} neox", rope,
                    lambda a: 2 * (_size(a[1]) + _size(a[2])) + _size(a[0]) + t * a[4].shape[1] * a[4].element_size()))
    out += [
        Spec("static_quant_fp8", f"{t}x{h} per-token", static_quant,
             lambda a: _size(a[0]) + a[0].numel() + _size(a[1])),
        Spec("dynamic_quant_fp8", f"{t}x{h} per-token", lambda dt: (_randn(t, h, dtype=dt), True, None),
             lambda a: _size(a[0]) + a[0].numel() + 4 * t),
        Spec("dynamic_group_quant_fp8", f"{t}x{h} group=128", lambda dt: (_randn(t, h, dtype=dt), 128),
             lambda a: _size(a[0]) + a[0].numel() + 4 * t * h // 128),
    ]
    return out


def best_times(fns: dict[str, Callable[[], object]], min_time: float, rounds: int = 10) -> dict[str, float]:
    """Seconds per call of each function: the best block of calls, blocks interleaved in rounds.

    Interleaving (a block of each function per round) keeps slow drifts of a shared machine from
    favouring one function; taking each function's best block (as timeit does) discards blocks
    in which other processes took the cores, which otherwise dominate the spread on small VMs.
    """
    per_block = {}
    for name, fn in fns.items():
        for _ in range(2):
            fn()
        start = time.perf_counter()
        fn()
        per_block[name] = max(1, int(0.02 / max(time.perf_counter() - start, 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    deadline = time.perf_counter() + min_time * len(fns)
    while min(len(v) for v in samples.values()) < rounds or time.perf_counter() < deadline:
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(per_block[name]):
                fn()
            samples[name].append((time.perf_counter() - start) / per_block[name])
    return {name: min(v) for name, v in samples.items()}


def copy_fn(nbytes: int, allocate: bool) -> Callable[[], object]:
    """A plain copy moving `nbytes` in total (half read, half written): `src.clone()` when the
    kernel allocates its output (so both pay for fresh pages), else `dst.copy_(src)`."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8).random_(0, 255)
    if allocate:
        return src.clone
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def run(ops: list[str], dtypes: list[torch.dtype], min_time: float, inductor: bool) -> list[list]:
    rows = []
    for spec in specs():
        if spec.op not in ops:
            continue
        op = getattr(ir.ops, spec.op)
        impl = op.impls[cpu_kernels.PROVIDER]
        for dtype in dtypes:
            args = spec.make_args(dtype)
            if not impl.accepts(args):
                print(f"skip {spec.op} {dtype}: the cpp provider declines these arguments", file=sys.stderr)
                continue
            nbytes = spec.nbytes(args)
            kernel_args = list(args)  # in-place kernels keep rewriting the same buffers
            fns = {"cpp": lambda: impl.impl_fn(*kernel_args), "eager": lambda: op.native_fn(*args),
                   "copy": copy_fn(nbytes, allocate=not impl.inplace)}
            if inductor:
                torch._dynamo.reset()
                compiled = torch.compile(op.native_fn, backend="inductor", dynamic=False)
                fns["inductor"] = lambda: compiled(*args)
            t = best_times(fns, min_time)
            t.setdefault("inductor", float("nan"))
            gbs = {name: nbytes / seconds / 1e9 for name, seconds in t.items()}
            rows.append([spec.op, str(dtype).removeprefix("torch."), spec.shape, f"{nbytes / 1e6:.0f}",
                         f"{gbs['cpp']:.2f}", f"{gbs['eager']:.2f}", f"{gbs['inductor']:.2f}",
                         f"{gbs['copy']:.2f}", "copy_" if impl.inplace else "clone",
                         f"{t['copy'] / t['cpp']:.2f}", f"{t['inductor'] / t['cpp']:.2f}",
                         f"{t['eager'] / t['cpp']:.2f}"])
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    return rows


HEADERS = ["op", "dtype", "shape", "MB moved", "cpp GB/s", "eager GB/s", "inductor GB/s", "copy GB/s",
           "copy kind", "cpp/copy", "cpp/inductor", "cpp/eager"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="bf16 only, main kernels, short timing")
    parser.add_argument("--ops", help="comma-separated op names (default: all)")
    parser.add_argument("--dtypes", help="comma-separated dtypes: float32,float16,bfloat16")
    parser.add_argument("--min-time", type=float, help="seconds of timing per measurement")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile (inductor) timings")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's default)")
    parser.add_argument("--allocator", choices=("reuse", "system"), default="reuse",
                        help="reuse (default): glibc keeps freed outputs for the next allocation, as a "
                             "caching allocator would, so timings exclude page faults; system: glibc "
                             "defaults, every output above 32 MB is fresh pages (faulted in by the op)")
    args = parser.parse_args(argv)
    if args.allocator == "reuse" and os.environ.get("MALLOC_MMAP_MAX_") != "0":
        # glibc reads these at start-up: run this script again with them set.
        env = {**os.environ, **REUSE_ENV}
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *(argv or sys.argv[1:])], env)

    all_ops = [s.op for s in specs()]
    ops = args.ops.split(",") if args.ops else (list(QUICK_OPS) if args.quick else all_ops)
    unknown = [o for o in ops if o not in all_ops]
    if unknown:
        parser.error(f"unknown ops {unknown}; choose from {all_ops}")
    dtype_names = args.dtypes.split(",") if args.dtypes else (["bfloat16"] if args.quick else list(DTYPES))
    if any(n not in DTYPES for n in dtype_names):
        parser.error(f"dtypes must be among {list(DTYPES)}")
    min_time = args.min_time or (0.3 if args.quick else 1.0)

    if args.threads:
        torch.set_num_threads(args.threads)
    _cpp_build.load()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, ISA {_cpp_build.isa()}, "
          f"allocator {args.allocator}", file=sys.stderr)
    rows = run(ops, [DTYPES[n] for n in dtype_names], min_time, not args.no_inductor)
    try:
        from tabulate import tabulate

        print(tabulate(rows, headers=HEADERS, tablefmt="github"))
    except ImportError:
        print("\t".join(HEADERS))
        for row in rows:
            print("\t".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
