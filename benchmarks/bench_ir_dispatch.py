"""Eager overhead of an IR op call, as ratios measured in one run.

Compares, for every IR op:
  direct    -- the work the call must do, called directly: the selected implementation's function
               (for the functional form of an in-place implementation, after cloning the activations)
  plain op  -- a plain torch library op (Library.define + CompositeExplicitAutograd impl) with that body
  IR        -- `ir.ops.<op>(...)` (functional) and `ir.ops.<op>.maybe_inplace(...)`, with the torch wrap
               off (the default: an eager call goes straight to the selected implementation)
The project's target: IR dispatch adds no more than torch's own dispatcher does for a plain op,
i.e. (IR - direct) <= (plain op - direct), with any provider selected, predicates included. Each
op is measured with the platform's default selection (a provider with a `supports_args`
predicate where the platform has one) and with `native` forced (no predicate).

Overhead is a difference of two times, so by default the selected implementation's function is
swapped for a stand-in that returns its inputs (`--real-kernels` keeps the kernel): selection,
its predicate and the cache run as in real calls, and a 100 us native kernel's noise does not
drown a 1 us overhead. The three calls are timed in interleaved rounds and each keeps its best
round, so load from other processes shifts all three alike. Inputs: the op's smallest quick
case with a batch (dim 0 of the first activation) of at least 2, preferring one that the
platform's first provider accepts.

Usage: python benchmarks/bench_ir_dispatch.py [--rounds N] [--number N] [--ops a,b] [--real-kernels]
                                              [--parameters] [--python-guard]
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from tabulate import tabulate
from torch.library import Library

from reference_impl import ir
from reference_impl.ir import guard
from reference_impl.ir.op import IrOp   # importing reference_impl.ir declares every op
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


def _interleaved(fns: list, args: tuple, rounds: int, number: int) -> list[float]:
    """Best round of each function, microseconds per call; the functions alternate every round."""
    best = [float("inf")] * len(fns)
    for fn in fns:
        fn(*args)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            for _ in range(number):
                fn(*args)
            best[i] = min(best[i], (time.perf_counter() - start) / number * 1e6)
    return best


def _small_case(op: IrOp) -> tuple:
    """The op's smallest quick case with a batch of at least 2 that the default selection gives to a
    provider other than native (falling back on each condition in turn)."""
    generator = torch.Generator().manual_seed(0)
    found = []
    for case in op.cases:
        if case.level != "quick" or (case.dtypes and torch.float32 not in case.dtypes):
            continue
        args = case.make_args(torch.float32, "cpu", generator)
        first = args[op.activation_indices[0]] if op.activation_indices else None
        batched = isinstance(first, torch.Tensor) and first.dim() > 0 and first.shape[0] >= 2
        numel = sum(a.numel() for a in args if isinstance(a, torch.Tensor))
        found.append((not batched, op.dispatch(*args).provider == "native", numel, case.name, args))
    if not found:
        raise SystemExit(f"op {op.name} declares no quick float32 case")
    return min(found, key=lambda f: f[:4])[3:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=300, help="calls per round")
    parser.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    parser.add_argument("--real-kernels", action="store_true", help="time the selected kernels, not a stand-in")
    parser.add_argument("--parameters", action="store_true",
                        help="pass the floating non-activation tensors after the first (weights, scales, caches) "
                             "as nn.Parameter, as layers pass their weights")
    parser.add_argument("--python-guard", action="store_true",
                        help="compare repeats with the Python fallback guard, not torch's TensorGuards")
    args = parser.parse_args()
    if args.python_guard:
        guard.set_guard_factory(None)
    platform = get_current_platform()
    torch.set_grad_enabled(False)
    names = [n for n in args.ops.split(",") if n] or sorted(IrOp.registry)
    rows = []
    for name in names:
        op = IrOp.registry[name]
        case_name, call_args = _small_case(op)
        if args.parameters:
            call_args = tuple(torch.nn.Parameter(a, requires_grad=False)
                              if isinstance(a, torch.Tensor) and a.is_floating_point() and i > 0
                              and i not in op.activation_indices else a
                              for i, a in enumerate(call_args))
        for forced in (None, ["native"]):
            with contextlib.ExitStack() as stack:
                if forced:
                    stack.enter_context(op.set_priority(forced))
                rows.extend(_measure(op, case_name, call_args, args.rounds, args.number, args.real_kernels))
    body = "the selected kernels" if args.real_kernels else "a stand-in body returning the inputs"
    print(f"platform {platform.device_name}, torch {torch.__version__}, {body}, best of {args.rounds} "
          f"interleaved rounds of {args.number} calls, "
          f"{'torch TensorGuards' if guard.uses_torch_guards() else 'the Python fallback guard'}, "
          f"torch wrap {'on' if ir.torch_wrap_enabled() else 'off'}"
          f"{', weights as nn.Parameter' if args.parameters else ''}")
    print(tabulate(rows, headers=["op", "case", "form", "provider", "predicate", "direct us", "plain op us",
                                  "IR us", "IR overhead / plain overhead", "target met"]))
    met = sum(r[-1] == "yes" for r in rows)
    print(f"target met on {met} of {len(rows)} rows")


def _measure(op, case_name: str, call_args: tuple, rounds: int, number: int, real_kernels: bool) -> list[list]:
    """One row per call form (functional, and maybe_inplace where the op allows it)."""
    rows = []
    impl = op.dispatch(*call_args)
    forms = [("functional", op)] + ([("maybe_inplace", op.maybe_inplace)] if op.allow_inplace else [])
    kernel = impl.impl_fn
    try:
        if not real_kernels:
            impl.impl_fn = _stand_in(op)
        for form, call in forms:
            body = _direct_body(op, impl, clone_activations=(form == "functional" and impl.inplace))
            plain = _plain_op(op.name, op.schema, body)
            times = _interleaved([body, plain, call], call_args, rounds, number)
            rows.append(_row(op, case_name, form, impl, *times))
    finally:
        impl.impl_fn = kernel
    return rows


def _stand_in(op: IrOp):
    """A body with the op's output arity that returns input tensors (no kernel time)."""
    n_out = len(op.torch_op._schema.returns)
    first = op.activation_indices[0]
    activations = op.activation_indices

    def body(*args):
        if n_out == 1:
            return args[first]
        outs = [args[i] for i in activations][:n_out]
        return tuple(outs + [args[first]] * (n_out - len(outs)))

    return body


def _row(op, case_name, form, impl, direct_t, plain_t, ir_t) -> list:
    ir_over, plain_over = ir_t - direct_t, plain_t - direct_t
    return [op.name, case_name, form, impl.provider, "yes" if impl.supports_args else "no",
            f"{direct_t:.2f}", f"{plain_t:.2f}", f"{ir_t:.2f}", f"{ir_over / plain_over:.2f}",
            "yes" if ir_over <= plain_over else "no"]


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
