"""Launch shapes of the Triton kernels, chosen from the row length and element size.

Memory-bound kernels run fastest when each thread moves a few 16-byte vectors: warps follow the
bytes one program handles, short rows are batched several to a program so a program is never a
handful of elements, and long element-wise rows are cut into column blocks whose padding wastes
little. The interpreter ignores `num_warps`; the shapes still decide the programs it runs.
"""

from __future__ import annotations

from reference_impl.kernels.triton._env import next_power_of_2

# Bytes a thread should move per program: two 16-byte vectors.
_BYTES_PER_THREAD = 32
_MAX_WARPS = 16
# Elements a program should cover at least, batching short rows (norms, activations, quant).
_MIN_PROGRAM_ELEMS = 2048
_MAX_ROWS_PER_PROGRAM = 64
# Column blocks of element-wise kernels over long rows.
_MIN_COLUMN_BLOCK = 512
_MAX_COLUMN_BLOCK = 4096


def num_warps(elems: int, elem_bytes: int) -> int:
    """Warps for a program of `elems` elements of `elem_bytes` bytes: ~32 bytes per thread, 1..16."""
    threads = max(1, elems * elem_bytes // _BYTES_PER_THREAD)
    return max(1, min(_MAX_WARPS, next_power_of_2(threads) // 32))


def rows_per_program(block: int, rows: int) -> int:
    """How many rows of `block` (padded) columns one program takes: 1 for long rows, a power of two
    up to 64 for short ones (never more than the rows there are, rounded up to a power of two)."""
    want = max(1, _MIN_PROGRAM_ELEMS // max(block, 1))
    return max(1, min(want, _MAX_ROWS_PER_PROGRAM, next_power_of_2(max(rows, 1))))


def column_block(n: int) -> int:
    """Column block of an element-wise kernel over rows of `n` elements: the whole row when it is
    short, else the largest power of two in [512, 4096] whose last block pads at most 1/8 of it."""
    if n <= _MAX_COLUMN_BLOCK:
        return next_power_of_2(max(n, 1))
    block = _MAX_COLUMN_BLOCK
    while block > _MIN_COLUMN_BLOCK and (-n % block) * 8 > n:
        block //= 2
    return block
