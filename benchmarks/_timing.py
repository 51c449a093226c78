"""Interleaved best-of timing shared by the CPU benchmarks (bench_kernels.py, bench_attention.py).

Every round times one block of calls of each function, in a new order each round, and each block starts with one
untimed call of its own function; a function's time is its best block. Interleaving keeps a shared machine's slow
drifts from favouring one function, the best block drops the blocks in which other processes took the cores, and
the changing order keeps any one function from always following the same one: on a 300 MB-L3 Xeon an in-place
kernel timed right after a plain copy (whose 268 MB evicted its buffers) ran 25% slower than one timed after another
kernel on the same buffers, so with a fixed order the first kernel lost, whichever it was (0.78 of vLLM's in-place
fp32 rows where both run at parity). A rotated order would keep every function's predecessor.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable


def best_times(fns: dict[str, Callable[[], object]], rounds: int, block_s: float,
               clock: Callable[[], float] = time.perf_counter, min_total_s: float = 0.0) -> dict[str, float]:
    """Seconds per call of each function: the best of at least `rounds` interleaved blocks of about `block_s`
    seconds each, more rounds until about `min_total_s` seconds per function have passed (`clock`: the wall clock,
    or time.thread_time for CPU time)."""
    reps = {}
    for name, fn in fns.items():  # warm up and size the blocks
        fn()
        fn()
        start = clock()
        fn()
        reps[name] = max(1, int(block_s / max(clock() - start, 1e-7)))
    best = {name: math.inf for name in fns}
    order, shuffle = list(fns), random.Random(0).shuffle
    deadline = time.perf_counter() + min_total_s * len(fns)
    done = 0
    while done < rounds or time.perf_counter() < deadline:
        shuffle(order)
        for name in order:
            fn = fns[name]
            fn()  # untimed: the block starts where the function's own calls leave the caches
            start = clock()
            for _ in range(reps[name]):
                fn()
            best[name] = min(best[name], (clock() - start) / reps[name])
        done += 1
    return best
