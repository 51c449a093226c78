"""Interleaved best-of timing shared by the CPU benchmarks (bench_kernels.py, bench_attention.py).

Every round times one block of calls of each function, in a new order each round, and each block starts with one
untimed call of its own function; a function's time is its best block. Interleaving keeps a shared machine's slow
drifts from favouring one function, the best block drops the blocks in which other processes took the cores, and
the changing order keeps any one function from always following the same one: on a 300 MB-L3 Xeon an in-place
kernel timed right after a plain copy (whose 268 MB evicted its buffers) ran 25% slower than one timed after another
kernel on the same buffers, so with a fixed order the first kernel lost, whichever it was (0.78 of vLLM's in-place
fp32 rows where both run at parity). A rotated order would keep every function's predecessor. `ratio_spread` gives
the rounds' ratios of two functions (each round's two blocks timed back to back): their median and quartiles say how
far one run's best-block ratio can be trusted on a machine whose speed drifts.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable


def round_times(fns: dict[str, Callable[[], object]], rounds: int, block_s: float,
                clock: Callable[[], float] = time.perf_counter, min_total_s: float = 0.0) -> dict[str, list[float]]:
    """Seconds per call of each function in each of at least `rounds` interleaved blocks of about `block_s` seconds,
    more rounds until about `min_total_s` seconds per function have passed (`clock`: the wall clock, or
    time.thread_time for CPU time). Round r's times of two functions were taken back to back."""
    reps = {}
    for name, fn in fns.items():  # warm up and size the blocks
        fn()
        fn()
        start = clock()
        fn()
        reps[name] = max(1, int(block_s / max(clock() - start, 1e-7)))
    times: dict[str, list[float]] = {name: [] for name in fns}
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
            times[name].append((clock() - start) / reps[name])
        done += 1
    return times


def cold_round_times(fns: dict[str, Callable[[], object]], rounds: int, calls: int, evict: Callable[[], object],
                     clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """round_times for data that comes from memory: every call timed alone right after `evict()` (which pushes the
    functions' inputs out of the caches, untimed); a round's time of a function is the median of its `calls` calls.
    A hot block of repeated calls keeps a few-MB input in L2 or L3, which a model's step (one layer after another)
    never finds there."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    order, shuffle = list(fns), random.Random(0).shuffle
    for fn in fns.values():   # warm up: first-call allocations and code out of the timings
        fn()
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            fn, took = fns[name], []
            for _ in range(calls):
                evict()
                start = clock()
                fn()
                took.append(clock() - start)
            times[name].append(statistics.median(took))
    return times


def best_times(fns: dict[str, Callable[[], object]], rounds: int, block_s: float,
               clock: Callable[[], float] = time.perf_counter, min_total_s: float = 0.0) -> dict[str, float]:
    """Seconds per call of each function: the best of its blocks in round_times."""
    return {name: min(ts) for name, ts in round_times(fns, rounds, block_s, clock, min_total_s).items()}


def ratio_spread(times: dict[str, list[float]], name: str, base: str) -> tuple[float, float, float]:
    """Median, lower and upper quartile over the rounds of name's time / base's time in the same round. On a
    shared VM whose speed drifts by tens of percent between minutes, the ratio of two best blocks moved by +-10%
    between runs; each round's ratio compares two blocks timed back to back, and the quartiles show the spread."""
    ratios = sorted(t / b for t, b in zip(times[name], times[base]))
    if len(ratios) < 2:
        return ratios[0], ratios[0], ratios[0]
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return median, q1, q3
