"""Run time of the conformance run itself (`pytest --platform=cpu -n 2`), cold and warm, with where the time goes.

Each round runs the harness twice in a subprocess: cold (a fresh, empty TORCHINDUCTOR_CACHE_DIR, so every graph the
compile and model checks build is compiled again) and warm (a cache directory filled by a warm-up run). It prints,
per mode, the wall time and the CPU time of every process of the run (the pytest controller, the xdist workers,
their kernel workers and the zygote they fork from), median and range over the rounds, against the targets (45 s
cold, 20 s warm on 2 cores); then the breakdown of the check time by check (the results file's durations, summed).
With `--base DIR` (another checkout of the project, run on this venv) every run is paired with one of DIR in the
same round, and the ratios are of those pairs: on a shared machine single runs swing by 10-20 %, pairs much less.
Every run's results (outcome and message of each) must equal the first run's, or the script says which differ.

    python benchmarks/bench_harness.py                      # 3 rounds, cold and warm
    python benchmarks/bench_harness.py --rounds 5 --base ../main-before
    python benchmarks/bench_harness.py --modes warm --rounds 1 --level quick --select "rms_norm and float32"  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
TARGETS_S = {"cold": 45.0, "warm": 20.0}   # issue 22: the cpu standard run on 2 cores with -n 2


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(checkout: Path, args, cache_dir: str, out: Path) -> dict:
    """One harness run in `checkout`: wall and CPU seconds (every process it started, all waited for), results."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir)
    command = [sys.executable, "-m", "pytest", f"--platform={args.platform}", "-n", str(args.workers), "-q",
               "-p", "no:cacheprovider", f"--conformance-level={args.level}", f"--conformance-json={out}",
               *(["-k", args.select] if args.select else [])]
    cpu, start = _children_cpu(), time.perf_counter()
    proc = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
    try:
        results = json.loads(out.read_text())["results"]
    except (OSError, ValueError, KeyError):
        sys.exit(f"no results file from {checkout} (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return {"wall": wall, "cpu": cpu, "results": results}


def check_time(results: list[dict]) -> Counter:
    """Summed check durations by suite body (family.check, e.g. dispatch.test_supports_args)."""
    total: Counter = Counter()
    for r in results:
        name = r["nodeid"].split("::")[-1].split("[")[0]
        total[f"{r['check']}.{name}"] += r.get("duration_s") or 0.0
    return total


def fingerprint(results: list[dict]) -> dict:
    return {r["nodeid"]: (r["outcome"], r["message"]) for r in results}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="cold,warm", help="cold, warm or both (comma-separated)")
    parser.add_argument("--workers", type=int, default=2, help="xdist workers (-n)")
    parser.add_argument("--platform", default="cpu")
    parser.add_argument("--level", default="standard")
    parser.add_argument("--base", type=Path, default=None, help="another checkout, run in pairs with this one")
    parser.add_argument("--select", default=None, metavar="EXPR",
                        help="pytest -k expression: time part of the run (the targets are for the whole run)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(TARGETS_S):
        parser.error(f"--modes: cold, warm or both, got {args.modes!r}")
    checkouts = {"this": ROOT} | ({"base": args.base.resolve()} if args.base else {})
    print(f"{sys.executable}, {os.cpu_count()} CPUs, -n {args.workers}, --platform={args.platform} "
          f"--conformance-level={args.level}{f' -k {args.select!r}' if args.select else ''}, {args.rounds} rounds; "
          "checkouts: "
          + ", ".join(f"{k} = {v}" for k, v in checkouts.items()), flush=True)
    runs: dict[tuple[str, str], list[dict]] = {(c, m): [] for c in checkouts for m in modes}
    reference = None
    with tempfile.TemporaryDirectory(prefix="bench-harness-") as tmp:
        warm_caches = {}
        if "warm" in modes:   # one run per checkout fills its cache (and builds its C++ kernels) before timing
            for name, checkout in checkouts.items():
                warm_caches[name] = os.path.join(tmp, f"warm-{name}")
                run_once(checkout, args, warm_caches[name], Path(tmp, "warmup.json"))
        for round_ in range(args.rounds):
            for mode in modes:
                for name, checkout in checkouts.items():
                    cache = warm_caches[name] if mode == "warm" else tempfile.mkdtemp(dir=tmp, prefix="cold-")
                    run = run_once(checkout, args, cache, Path(tmp, f"{name}-{mode}-{round_}.json"))
                    runs[(name, mode)].append(run)
                    print(f"round {round_ + 1} {mode:4s} {name}: {run['wall']:.1f} s wall, {run['cpu']:.1f} s CPU",
                          flush=True)
                    prints = fingerprint(run["results"])
                    reference = reference or prints
                    differ = [k for k in reference if reference[k] != prints.get(k)]
                    if differ or len(prints) != len(reference):
                        print(f"  results differ from the first run's in {len(differ)} of {len(reference)}: "
                              + ", ".join(differ[:5]))

    rows = []
    for mode in modes:
        for name in checkouts:
            walls = [r["wall"] for r in runs[(name, mode)]]
            cpus = [r["cpu"] for r in runs[(name, mode)]]
            row = [mode, name, spread(walls), spread(cpus), TARGETS_S[mode],
                   f"{statistics.median(walls) / TARGETS_S[mode]:.2f}"]
            if args.base and name == "this":
                pairs = [a["wall"] / b["wall"] for a, b in zip(runs[("this", mode)], runs[("base", mode)])]
                row.append(f"{statistics.median(pairs):.2f} ({min(pairs):.2f}-{max(pairs):.2f})")
            elif args.base:
                row.append("")
            rows.append(row)
    headers = ["mode", "checkout", "wall s, median (range)", "CPU s, median (range)", "target s", "wall / target"]
    if args.base:
        headers.append("this / base, paired")
    print()
    print(tabulate(rows, headers=headers))

    for mode in modes:
        sums = {name: check_time(runs[(name, mode)][-1]["results"]) for name in checkouts}
        keys = sorted(set().union(*sums.values()), key=lambda k: -sums["this"].get(k, 0.0))
        table = [[k, *(f"{sums[n].get(k, 0.0):.1f}" for n in checkouts)] for k in keys]
        table.append(["sum of check time", *(f"{sum(sums[n].values()):.1f}" for n in checkouts)])
        print(f"\ncheck time by check, {mode} (seconds summed over the run's results, last round):")
        print(tabulate(table, headers=["check", *checkouts]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
