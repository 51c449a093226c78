"""Eager overhead of an IR op call, as ratios measured in one run.

Compares, on tiny tensors (so call overhead dominates):
  direct    -- calling the selected implementation's function directly
  plain op  -- a plain torch library op (Library.define + CompositeExplicitAutograd impl) with the same body
  IR        -- `ir.ops.<op>(...)` (functional) and `ir.ops.<op>.maybe_inplace(...)`
The DESIGN.md target: IR dispatch adds no more than torch's own dispatcher does for a plain op,
i.e. (IR - direct) <= (plain op - direct).

Usage: python benchmarks/bench_ir_dispatch.py [--iters N]
"""

from __future__ import annotations

import argparse
import timeit

import torch
from tabulate import tabulate
from torch.library import Library, infer_schema

from reference_impl import ir
from reference_impl.platforms import get_current_platform


def _plain_op(name: str, fn):
    lib = Library(f"bench_plain_{name}", "DEF")
    lib.define(name + infer_schema(fn, mutates_args=()))
    lib.impl(name, fn, "CompositeExplicitAutograd")
    _plain_op.libs.append(lib)
    return getattr(getattr(torch.ops, f"bench_plain_{name}"), name).default


_plain_op.libs = []


def _time(fn, iters: int) -> float:
    """Best of 5 repeats, microseconds per call."""
    fn()
    return min(timeit.repeat(fn, number=iters, repeat=5)) / iters * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20000)
    args = parser.parse_args()
    get_current_platform()
    torch.set_grad_enabled(False)

    x, r, w = torch.randn(1, 8), torch.randn(1, 8), torch.randn(8)
    rows = []
    for op, call_args in ((ir.ops.rms_norm, (x, w, 1e-6)), (ir.ops.fused_add_rms_norm, (x, r, w, 1e-6))):
        impl = op.dispatch(*call_args)
        plain = _plain_op(op.name, op.native_fn)
        direct_t = _time(lambda: impl.impl_fn(*call_args), args.iters)
        plain_t = _time(lambda: plain(*call_args), args.iters)
        ir_t = _time(lambda: op(*call_args), args.iters)
        variants = [("functional", ir_t)]
        if op.allow_inplace:
            variants.append(("maybe_inplace", _time(lambda: op.maybe_inplace(*call_args), args.iters)))
        for form, t in variants:
            ir_over, plain_over = t - direct_t, plain_t - direct_t
            rows.append([op.name, form, impl.provider, f"{direct_t:.2f}", f"{plain_t:.2f}", f"{t:.2f}",
                         f"{t / direct_t:.2f}", f"{t / plain_t:.2f}", f"{ir_over / plain_over:.2f}",
                         "yes" if ir_over <= plain_over else "no"])
    print(tabulate(rows, headers=["op", "form", "provider", "direct us", "plain op us", "IR us",
                                  "IR/direct", "IR/plain", "IR overhead / plain overhead", "target met"]))


if __name__ == "__main__":
    main()
