"""Peak memory per element of judging a failing output of `op` (bfloat16, rows x width) in this fresh process:
`python _judge_memory.py OP ROWS WIDTH` prints bytes per element. tests/ir/test_size_cases.py runs it."""

import resource
import sys

import torch

from conformance.judge.oracle import judge
from reference_impl import ir


def main(name: str, rows: int, width: int) -> None:
    torch.set_num_threads(1)
    op = getattr(ir.ops, name)
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    args = (x, torch.ones(width, dtype=torch.bfloat16), 1e-6, None)
    out = op.native_fn(*args)
    out.view(-1)[0] += 1          # not native's bit for bit: the full float64 comparison runs
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    verdict = judge(op, args, out, torch.bfloat16)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"{(peak - base) / (rows * width):.1f} bytes per element ({verdict.outcome.value})")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
