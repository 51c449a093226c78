"""Peak tensor memory per element of judging a failing output of `op` (bfloat16, rows x width):
`python _judge_memory.py OP ROWS WIDTH [CHUNK]` prints bytes per element (with CHUNK: judged in row chunks of CHUNK
elements, conformance.judge.oracle.judge_in_chunks). tests/ir/test_size_cases.py runs it.

The peak is of the bytes tensors hold, counted from the profiler's allocation and free events in the order they
happened: the same on every run and machine (the process's RSS is not: what the allocator already holds, and what an
earlier peak left mapped, moved an RSS measurement between 7 and 144 bytes an element)."""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from conformance.judge.oracle import judge
from reference_impl import ir


def peak_tensor_bytes(events) -> int:
    """The highest sum of live tensor bytes over the profiler's `[memory]` events (+ alloc, - free), in time order."""
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def main(name: str, rows: int, width: int, chunk: int | None = None) -> None:
    torch.set_num_threads(1)
    op = getattr(ir.ops, name)
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    args = (x, torch.ones(width, dtype=torch.bfloat16), 1e-6, None)
    out = op.native_fn(*args)
    out.view(-1)[0] += 1          # not native's bit for bit: the full float64 comparison runs
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        verdict = judge(op, args, out, torch.bfloat16, chunk_elements=chunk)
    memory = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    print(f"{peak_tensor_bytes(memory) / (rows * width):.1f} bytes per element ({verdict.outcome.value})")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else None)
