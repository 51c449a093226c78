"""all_reduce and all_gather on 2 CPU ranks: the reference communicator against torch.distributed's gloo and vLLM's
CpuCommunicator (its shared-memory path on a `tp` group), sizes from 4 KB to 64 MB of float32 (issue 46 item 4).

Each rank is a spawned process in one gloo group; for every size the implementations take turns (interleaved rounds,
best round kept), each timed over a number of calls agreed beforehand (nothing else in the timed loop) and the
slowest rank's time counted. The reference communicator's all_reduce is out of place (its contract: it never writes
its input): on one host through shared memory (reference_impl/distributed/shared_memory.py); with
REFERENCE_COMM_SHM=0 gloo on a copy below 8 MB and a ring of point-to-point messages from 8 MB. Either way it writes
a fresh output each call (with `--allocator system`, at 64 MB new pages every time), which gloo's in-place call
does not, so the table also times gloo on a copy of its input (`gloo+copy`, the same contract as the reference's).
Each round starts with the next implementation (no column always runs first). Ratios are the other's time over the
reference's (above 1.0: the reference is faster).

    python benchmarks/bench_collectives.py                  # every size, gloo and (where installed) vLLM
    python benchmarks/bench_collectives.py --quick          # 4 KB, 1 MB, 64 MB; three rounds
    python benchmarks/bench_collectives.py --no-vllm

By default every rank keeps freed host memory for reuse (`--allocator reuse`, glibc's mmap and trimming off, as the
reference runtime's `generate` runs and as `bench_kernels.py` times), so an out-of-place call's fresh 64 MB output
reuses the last call's pages instead of faulting 16384 new ones in: the table then times the collectives, not the
allocator. `--allocator system` keeps glibc's defaults (every output above 32 MB is fresh pages).

vLLM's column needs vLLM's CPU build (`torch.ops._C`'s `init_shm_manager` and `shm_*` ops); without it, "-".
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = (4 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20)          # bytes of float32 per rank
QUICK_SIZES = (4 << 10, 1 << 20, 64 << 20)
WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vllm_communicator(group):
    """vLLM's CpuCommunicator on a `tp` group (its shared-memory path), or None with why."""
    try:
        from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
        from vllm.platforms import current_platform

        current_platform.import_kernels()
        return CpuCommunicator(cpu_group=group, device=torch.device("cpu"), device_group=group,
                               unique_name="tp:0"), None
    except Exception as exc:  # noqa: BLE001 - the column shows why it is missing
        return None, f"{type(exc).__name__}: {exc}"


def _timed(fn, group, min_time: float) -> float:
    """Seconds per call, the slowest rank's (a collective ends when its last rank does).

    The number of calls is agreed before the timed loop (from the slowest rank's time for one call), so the loop
    runs nothing but `fn`: a per-call check of whether to stop would itself be a gloo collective, about as long as
    a small call."""
    fn()   # warm-up (and vLLM's shared-memory buffers)
    dist.barrier(group=group)
    start = time.perf_counter()
    fn()
    one = torch.tensor([time.perf_counter() - start])
    dist.all_reduce(one, op=dist.ReduceOp.MAX, group=group)
    calls = max(1, min(100_000, int(min_time / max(one.item(), 1e-6))))
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    per_call = torch.tensor([(time.perf_counter() - start) / calls])
    dist.all_reduce(per_call, op=dist.ReduceOp.MAX, group=group)
    return per_call.item()


def _rank(rank: int, port: int, ident: str, args, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), VLLM_DIST_IDENT=ident)
    torch.set_num_threads(1)
    if args.allocator == "reuse":
        from reference_impl.models.host_memory import keep_freed_memory

        keep_freed_memory()
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    group = dist.new_group(list(range(WORLD)), backend="gloo")
    from reference_impl.distributed.communicator import ReferenceCommunicator

    ours = ReferenceCommunicator(cpu_group=group, device=torch.device("cpu"), device_group=group,
                                 unique_name="tp:0")
    theirs, why = (None, "skipped (--no-vllm)") if args.no_vllm else _vllm_communicator(group)
    rows = []
    for size in args.sizes:
        x = torch.full((size // 4,), float(rank + 1))
        impls = {"all_reduce": {"reference": lambda: ours.all_reduce(x),
                                "gloo": lambda: dist.all_reduce(x, group=group),
                                "gloo+copy": lambda: dist.all_reduce(x.clone(), group=group)},
                 "all_gather": {"reference": lambda: ours.all_gather(x, 0),
                                "gloo": lambda: dist.all_gather_into_tensor(torch.empty(WORLD * x.numel()), x,
                                                                            group=group)}}
        if theirs is not None:
            impls["all_reduce"]["vllm"] = lambda: theirs.all_reduce(x)
            impls["all_gather"]["vllm"] = lambda: theirs.all_gather(x, 0)
        for op, fns in impls.items():
            best = {name: float("inf") for name in fns}
            names = list(fns)
            for i in range(args.rounds):     # each round starts with the next one: no column always runs first
                for name in names[i % len(names):] + names[:i % len(names)]:
                    best[name] = min(best[name], _timed(fns[name], group, args.min_time))
            rows.append((op, size, best))
    if rank == 0:
        queue.put((rows, why))
    dist.barrier(group=group)
    dist.destroy_process_group()


def _size(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 KB, 1 MB and 64 MB, three rounds")
    parser.add_argument("--no-vllm", action="store_true", help="leave vLLM's CpuCommunicator out")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5, 3 with --quick)")
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per implementation per round")
    parser.add_argument("--allocator", choices=("reuse", "system"), default="reuse",
                        help="reuse (default): each rank keeps freed memory (no page faults for a fresh output); "
                             "system: glibc malloc's defaults")
    parser.add_argument("--sizes", help="comma-separated bytes per rank, multiples of 4 (default: 4 KB to 64 MB)")
    args = parser.parse_args(argv)
    if args.sizes:
        try:
            args.sizes = tuple(int(v) for v in args.sizes.split(","))
        except ValueError:
            parser.error(f"--sizes: comma-separated numbers of bytes, got {args.sizes!r}")
        if any(v <= 0 or v % 4 for v in args.sizes):
            parser.error(f"--sizes: each size is a positive multiple of 4 bytes (float32), got {args.sizes}")
    else:
        args.sizes = QUICK_SIZES if args.quick else SIZES
    args.rounds = args.rounds or (3 if args.quick else 5)
    from _isa import cpu_model   # beside this script (its folder is on sys.path when it runs)

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    from conformance import shm_files

    ident = shm_files.new_ident()     # vLLM's shared-memory files carry it; removed when the ranks are done
    procs = [ctx.Process(target=_rank, args=(r, port, ident, args, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        rows, why = queue.get(timeout=1800)
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        shm_files.remove_ident(ident)
    print(f"machine: {cpu_model()}; {os.cpu_count()} cores; {WORLD} ranks, 1 thread each; gloo over loopback; "
          f"torch {torch.__version__}; allocator {args.allocator}")
    if why:
        print(f"vLLM's CpuCommunicator: {why}")
    header = (f"{'op':>10} | {'size':>6} | {'reference':>10} | {'gloo':>10} | {'vs gloo':>8} | {'gloo+copy':>10} | "
              f"{'vs g+c':>8} | {'vllm':>10} | {'vs vllm':>8}")
    print(header)
    print("-" * len(header))
    for op, size, best in rows:
        vllm = best.get("vllm")
        print(f"{op:>10} | {_size(size):>6} | {best['reference'] * 1e3:8.3f}ms | {best['gloo'] * 1e3:8.3f}ms | "
              f"{best['gloo'] / best['reference']:7.2f}x | "
              + (f"{best['gloo+copy'] * 1e3:8.3f}ms | {best['gloo+copy'] / best['reference']:7.2f}x | "
                 if "gloo+copy" in best else f"{'-':>10} | {'-':>8} | ")
              + (f"{vllm * 1e3:8.3f}ms | {vllm / best['reference']:7.2f}x" if vllm is not None else f"{'-':>10} | {'-':>8}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
