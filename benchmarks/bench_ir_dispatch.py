"""Eager overhead of an IR op call, as ratios measured in one run.

Compares, on tiny tensors (so call overhead dominates):
  direct    -- the work the call must do, called directly: the selected implementation's function
               (for the functional form of an in-place implementation, after cloning the activations)
  plain op  -- a plain torch library op (Library.define + CompositeExplicitAutograd impl) with that body
  IR        -- `ir.ops.<op>(...)` (functional) and `ir.ops.<op>.maybe_inplace(...)`
The project's target: IR dispatch adds no more than torch's own dispatcher does for a plain op,
i.e. (IR - direct) <= (plain op - direct). Each op is measured with the platform's default
selection and with `native` forced: a provider's `supports_args` predicate runs on every eager
call, so the difference between the two rows is that predicate's own cost.

Usage: python benchmarks/bench_ir_dispatch.py [--iters N]
"""

from __future__ import annotations

import argparse
import contextlib
import timeit

import torch
from tabulate import tabulate
from torch.library import Library

from reference_impl import ir
from reference_impl.platforms import get_current_platform


def _plain_op(name: str, schema: str, body):
    """A plain torch library op with the IR op's schema whose kernel is `body`."""
    ns = f"bench_plain_{len(_plain_op.libs)}"
    lib = Library(ns, "DEF")
    lib.define(name + schema)
    lib.impl(name, body, "CompositeExplicitAutograd")
    _plain_op.libs.append(lib)
    return getattr(getattr(torch.ops, ns), name).default


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
    cases = [(op, call_args, forced) for op, call_args in ((ir.ops.rms_norm, (x, w, 1e-6)),
                                                           (ir.ops.fused_add_rms_norm, (x, r, w, 1e-6)))
             for forced in (None, ["native"])]
    for op, call_args, forced in cases:
        with contextlib.ExitStack() as stack:
            if forced:
                stack.enter_context(op.set_priority(forced))
            rows.extend(_measure(op, call_args, args.iters))
    print(tabulate(rows, headers=["op", "form", "provider", "supports_args", "direct us", "plain op us",
                                  "IR us", "IR/direct", "IR/plain", "IR overhead / plain overhead",
                                  "target met"]))


def _measure(op, call_args, iters: int) -> list[list]:
    """One row per call form (functional, and maybe_inplace where the op allows it)."""
    rows = []
    impl = op.dispatch(*call_args)
    forms = [("functional", op)] + ([("maybe_inplace", op.maybe_inplace)] if op.allow_inplace else [])
    for form, call in forms:
        body = _direct_body(op, impl, clone_activations=(form == "functional" and impl.inplace))
        plain = _plain_op(op.name, op.schema, body)
        direct_t = _time(lambda: body(*call_args), iters)
        plain_t = _time(lambda: plain(*call_args), iters)
        t = _time(lambda: call(*call_args), iters)
        ir_over, plain_over = t - direct_t, plain_t - direct_t
        rows.append([op.name, form, impl.provider, "yes" if impl.supports_args else "no",
                     f"{direct_t:.2f}", f"{plain_t:.2f}", f"{t:.2f}", f"{t / direct_t:.2f}",
                     f"{t / plain_t:.2f}", f"{ir_over / plain_over:.2f}",
                     "yes" if ir_over <= plain_over else "no"])
    return rows


def _direct_body(op, impl, clone_activations: bool):
    """The work a call must do: the impl, after cloning activations for a functional in-place call."""
    if not clone_activations:
        return impl.impl_fn

    def body(*args):
        args = list(args)
        for i in op.activation_indices:
            args[i] = args[i].clone()
        return impl.impl_fn(*args)

    return body


if __name__ == "__main__":
    main()
