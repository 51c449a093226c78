"""Few-row GEMMs on the CPU: the C++ panel GEMM against oneDNN's prepacked kernel and F.linear.

Rows: the weights of one decode step of the 125M Llama `bench_generate.py --compare` runs (12 layers of qkv
1280x768, o 768x768, gate_up 4096x768, down 768x2048, and the 32000x768 LM head: 100M weights), one GEMM
after the other as a step calls them, with 1 to 64 rows. Every weight is read from memory in each pass (400 MB
in float32, more than any cache), so GB/s is weight bytes over time, and a plain `sum` over the same weights
(one pass, every thread) is printed as the machine's read speed. Times are medians of interleaved rounds.

    .venv/bin/python benchmarks/bench_gemm.py [--dtypes float32 bfloat16] [--rows 1 8 64] [--rounds 9]

Columns: `panel` is `reference_cpu::panel_gemm` on the weight packed by `pack_gemm_panels`; `oneDNN` is
`torch.ops.mkldnn._linear_pointwise` on the weight reordered once (in float32 for a 16-bit weight on a CPU
without 16-bit arithmetic, as layers/cpu_gemm.py packs it); `F.linear` is torch's own GEMM on the weight as it
is. Before timing, every column's output is checked against float64 (max relative error printed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference_impl.kernels import _cpp_build  # noqa: E402
from reference_impl.layers import cpu_gemm  # noqa: E402

LAYER_SHAPES = [(1280, 768), (768, 768), (4096, 768), (768, 2048)]   # (out, in): qkv, o, gate_up, down
LM_HEAD = (32000, 768)


def step_weights(dtype: torch.dtype, layers: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shapes = LAYER_SHAPES * layers + [LM_HEAD]
    return [(torch.randn(shape, generator=gen) * 0.05).to(dtype) for shape in shapes]


def engines(weights: list[torch.Tensor]) -> dict[str, list]:
    """name -> one callable(x) per weight."""
    ops = _cpp_build.ops()
    out: dict[str, list] = {"panel": [], "oneDNN": [], "F.linear": []}
    for w in weights:
        panels = ops.pack_gemm_panels(w)
        onednn = cpu_gemm.PackedCpuGemm(w, panels=False)
        onednn.one_row = onednn.one_row_weight = None      # the oneDNN pack itself, for every row count
        n = w.shape[0]
        out["panel"].append(lambda x, p=panels, n=n: ops.panel_gemm(x, p, n, None))
        out["oneDNN"].append(lambda x, pack=onednn: pack(x, None))
        out["F.linear"].append(lambda x, w=w: F.linear(x, w))
    return out


def max_rel_error(calls: list, weights: list[torch.Tensor], rows: int, dtype: torch.dtype) -> float:
    worst = 0.0
    for call, w in zip(calls[:4] + calls[-1:], weights[:4] + weights[-1:]):
        x = torch.randn(rows, w.shape[1]).to(dtype)
        exact = x.double() @ w.double().T
        worst = max(worst, ((call(x).double() - exact).abs().max() / exact.abs().max()).item())
    return worst


def run(dtype: torch.dtype, rows_list: list[int], rounds: int, layers: int) -> list[list]:
    weights = step_weights(dtype, layers)
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    calls = engines(weights)
    table = []
    for rows in rows_list:
        xs = {k: torch.randn(rows, k).to(dtype) for k in {w.shape[1] for w in weights}}
        errors = {name: max_rel_error(c, weights, rows, dtype) for name, c in calls.items()}
        times: dict[str, list[float]] = {name: [] for name in ["sum", *calls]}
        for _ in range(rounds):
            start = time.perf_counter()
            for w in weights:
                w.sum()
            times["sum"].append(time.perf_counter() - start)
            for name, c in calls.items():
                start = time.perf_counter()
                for call, w in zip(c, weights):
                    call(xs[w.shape[1]])
                times[name].append(time.perf_counter() - start)
        med = {name: statistics.median(t) for name, t in times.items()}
        table.append([str(dtype).removeprefix("torch."), rows, f"{nbytes / med['sum'] / 1e9:.1f}",
                      *[f"{med[n] * 1e3:.1f} ms, {nbytes / med[n] / 1e9:.1f} GB/s (err {errors[n]:.1e})"
                        for n in calls],
                      f"{med['oneDNN'] / med['panel']:.2f}", f"{med['F.linear'] / med['panel']:.2f}"])
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16", "float16"])
    p.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--layers", type=int, default=12, help="decoder layers' weights besides the LM head (default 12)")
    args = p.parse_args()
    if any(r < 1 for r in args.rows) or args.rounds < 1 or args.layers < 0:
        p.error("--rows and --rounds must be positive, --layers not negative")
    problem = _cpp_build.toolchain_problem()
    if problem is not None or not cpu_gemm.available():
        sys.exit(f"bench_gemm.py: needs the C++ CPU kernels and oneDNN's linear ops "
                 f"({problem or 'this torch build has no oneDNN linear ops'})")
    from _isa import cpu_model   # beside this script (its folder is on sys.path when it runs)

    print(f"{cpu_model()}, torch {torch.__version__}, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads; the weights of "
          f"{args.layers} layers and the LM head of the 125M Llama, medians of {args.rounds} interleaved rounds")
    rows = []
    for name in args.dtypes:
        rows += run(getattr(torch, name), args.rows, args.rounds, args.layers)
    print(tabulate(rows, headers=["dtype", "rows", "sum GB/s", "panel", "oneDNN", "F.linear", "oneDNN/panel",
                                  "F.linear/panel"]))


if __name__ == "__main__":
    main()
