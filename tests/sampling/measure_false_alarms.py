"""Measure the sampling family's false-alarm rate: its statistical units (sampling.sample, sampling.seeded,
sampling.rejection_distribution) rerun on one platform under many seeds, in this process.

    .venv/bin/python tests/sampling/measure_false_alarms.py --platform cpu --seeds 100 [--level quick]

Prints each non-PASS result and the totals; docs/sampling.md records the runs. A correct sampler fails a unit with
probability at most 1e-6 (the test's bound), so any FAIL here on a correct platform is a defect of the check.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    from conformance.checks import run_unit, units
    from conformance.checks.common import CheckContext
    from conformance.collect.inventory import activate

    parser = argparse.ArgumentParser()
    parser.add_argument("--platform", default="cpu")
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--level", default="quick")
    args = parser.parse_args(argv)
    inventory = activate(args.platform)
    checks = ("sample", "seeded", "rejection_distribution")
    todo = [u for c in checks for u in units(inventory, "sampling", c, args.level)]
    counts: dict[str, int] = {}
    start = time.monotonic()
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        ctx = CheckContext(args.platform, inventory.platform, seed=seed, level=args.level)
        for unit in todo:
            verdict, _ = run_unit(ctx, unit)
            counts[verdict.outcome.value] = counts.get(verdict.outcome.value, 0) + 1
            if verdict.outcome.value != "PASS":
                print(f"seed {seed} {unit.check}.{unit.case}: {verdict.outcome.value} {verdict.message}", flush=True)
    total = sum(counts.values())
    print(f"{args.platform} {args.level}: {args.seeds} seeds x {len(todo)} units = {total} results: {counts} "
          f"in {time.monotonic() - start:.0f} s")
    return 0 if counts.get("PASS", 0) == total else 1


if __name__ == "__main__":
    sys.exit(main())
