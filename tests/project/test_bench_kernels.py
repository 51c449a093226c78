"""benchmarks/bench_kernels.py: the CUDA mode refuses with one line where no CUDA device exists, and its
table code runs on the CPU with stand-ins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_kernels.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device: the refusal path cannot occur")
def test_cuda_mode_without_a_cuda_device_fails_with_one_line():
    proc = _run("--device", "cuda", "--ops", "rms_norm")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("bench_kernels.py --device cuda: torch ")
    assert "CUDA" in lines[0] and "run it on a machine with a CUDA GPU" in lines[0]



def test_cuda_table_code_runs_on_the_cpu_with_stand_ins(monkeypatch):
    """The GPU table's own code (specs, copy, providers' predicates, GB/s and ratios) on the CPU,
    with the cpp kernels standing in for cuda and triton and a stand-in for CUDA events, so a mistake
    in it shows here and not first on a GPU machine. The stand-in runs every function (so the kernels
    really run) and reports a fixed time per function, so the cells are exact and no assertion depends
    on how fast the machine is (a wall-clock timer printed 0 GB/s on a loaded machine)."""
    import importlib.util

    from reference_impl import ir
    from reference_impl.kernels import _cpp_build
    from reference_impl.kernels import cpu as _registers_cpp  # noqa: F401  (registers the "cpp" provider)

    if _cpp_build.toolchain_problem():
        pytest.skip(f"the cpp kernels stand in for the GPU ones: {_cpp_build.toolchain_problem()}")
    spec = importlib.util.spec_from_file_location("bench_kernels_under_test", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)      # dataclasses look their module up there
    spec.loader.exec_module(bench)

    calls = []

    def fixed_ms(fn, quick):
        """1 us per call, whatever the machine: the copy and every provider 'move' bytes at 1000 GB/s per MB."""
        fn()
        calls.append(fn)
        return 1e-3

    monkeypatch.setattr(bench, "cuda_ms", fixed_ms)
    monkeypatch.setattr(bench, "_cuda_impls", lambda op: {p: op.impls["cpp"] for p in bench.CUDA_PROVIDERS})
    ops = ["rms_norm", "dynamic_group_quant_fp8"]
    rows = bench.run_cuda(ops, [torch.bfloat16], quick=True, inductor=False, device="cpu")
    assert [r[0] for r in rows] == ops
    assert len(calls) == len(ops) * (2 + len(bench.CUDA_PROVIDERS))   # copy, eager and each provider timed
    for row in rows:
        assert len(row) == len(bench.CUDA_HEADERS)
        cells = dict(zip(bench.CUDA_HEADERS, row))
        assert cells["dtype"] == "bfloat16" and cells["inductor GB/s"] == "-"
        megabytes = float(cells["MB moved"])
        assert megabytes > 0
        for column in ("copy GB/s", "eager GB/s", "cuda GB/s", "triton GB/s"):   # MB per 1 us, as GB/s
            assert float(cells[column]) == pytest.approx(megabytes * 1000, abs=500), (column, cells)   # MB cell rounded
        assert cells["cuda/copy"] == cells["triton/copy"] == cells["cuda/triton"] == "1.00"
        assert cells["inductor/copy"] == cells["cuda/inductor"] == "-"
    assert ir.ops.rms_norm.impls["cpp"].supported


def test_cpu_timing_varies_each_functions_predecessor_and_warms_each_block():
    """benchmarks/_timing.best_times (bench_kernels' and bench_attention's CPU timing): every block is preceded by one
    untimed call of its own function, and over the rounds a function follows different functions (a fixed or
    rotated order kept the copy right before the first kernel, which then always ran from a cold L3: 0.78 of vLLM's
    in-place fp32 rows where both are at parity)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_timing_under_test", SCRIPT.parent / "_timing.py")
    timing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timing)
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("cpp", "vllm", "eager", "copy")}
    times = timing.best_times(fns, rounds=12, block_s=1e-4)
    assert set(times) == set(fns) and all(t >= 0 for t in times.values())
    # a block is its function's calls in a row: the untimed first call plus the timed ones (at least 1)
    blocks = []
    for name in calls:
        if blocks and blocks[-1][0] == name:
            blocks[-1][1] += 1
        else:
            blocks.append([name, 1])
    timed = blocks[len(fns):]  # after the sizing blocks (3 calls each, one function after another)
    assert all(n >= 2 for _, n in timed), timed[:8]
    predecessors = {name: {before for (before, _), (after, _) in zip(timed, timed[1:]) if after == name}
                    for name in fns}
    assert all(len(p) >= 2 for p in predecessors.values()), predecessors


def test_ratio_spread_compares_each_rounds_blocks():
    """_timing.ratio_spread: the median and quartiles of the rounds' own ratios, not the ratio of the best blocks
    (which can come from different rounds, minutes apart on a drifting VM)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_timing_under_test", SCRIPT.parent / "_timing.py")
    timing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timing)
    # the machine slows by 2x half-way; "b" is 10% slower than "a" in every round
    times = {"a": [1.0, 1.0, 2.0, 2.0, 2.0], "b": [1.1, 1.1, 2.2, 2.2, 2.2]}
    median, q1, q3 = timing.ratio_spread(times, "b", "a")
    assert median == pytest.approx(1.1) and q1 == pytest.approx(1.1) and q3 == pytest.approx(1.1)
    times = {"a": [1.0, 1.0, 1.0, 1.0], "b": [0.9, 1.0, 1.2, 1.3]}
    assert timing.ratio_spread(times, "b", "a") == pytest.approx((1.1, 0.975, 1.225))
    assert timing.ratio_spread({"a": [2.0], "b": [3.0]}, "b", "a") == (1.5, 1.5, 1.5)


def test_cold_timing_evicts_before_every_call_and_times_only_the_call():
    """_timing.cold_round_times (bench_attention --cold-cache): each timed call follows an eviction, the eviction's
    time is not counted, and a round's time is the median of its calls."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_timing_under_test", SCRIPT.parent / "_timing.py")
    timing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timing)
    now, events = [0.0], []

    def tick(seconds, what):
        def step():
            events.append(what)
            now[0] += seconds
        return step

    fns = {"a": tick(1.0, "a"), "b": tick(3.0, "b")}
    times = timing.cold_round_times(fns, rounds=3, calls=4, evict=tick(100.0, "evict"), clock=lambda: now[0])
    assert times == {"a": [1.0] * 3, "b": [3.0] * 3}
    timed = events[2:]   # after one warm-up call of each
    assert timed.count("a") == timed.count("b") == 12 and timed.count("evict") == 24
    assert all(before == "evict" for before, after in zip(timed, timed[1:]) if after in fns)
