"""Cases at the sizes where real kernels break: row counts just past common limits, and one past 2^31 elements.

A kernel whose launch grid covers a fixed number of rows (CUDA's 65,535 blocks in a grid's y and z, a tile count
in 16 bits), whose scratch buffer is sized for a maximum batch, or which indexes in int32, drops or corrupts every
row past its limit and still passes every small case. `size_rows` gives an op's case table (rows of
`(name, shape, level, options)`, the form every op module declares its cases in) the rows that reach just past those
limits, each with a small row width so the run stays cheap; each op module builds them with its own case builder.
The last one holds more than 2^31 elements in the smallest dtype the op runs in, and runs only where the host and
the device have the memory for it (`memory_shortfall`); elsewhere the harness reports it SKIP with the reason.
"""

from __future__ import annotations

import torch

# (rows past which a limit is common, the level from which the case just past it runs)
ROW_LIMITS = ((4096, "standard"), (65536, "standard"), (1 << 20, "full"))
# Limits whose case runs in the smallest dtype only: a row limit is the launch's, not the dtype's, and the 65,537-row
# case in every dtype was most of what the size cases add to the standard run (12% with it in three dtypes).
ONE_DTYPE_LIMITS = (65536,)
INT32_ELEMENTS = 1 << 31
# The flags that name these cases (conformance.judge.hints reads them): rows past a row limit, elements past 2^31.
ROWS_FLAG = "rows_past_limit"
INT32_FLAG = "elements_past_int32"
# The >2^31-element case runs in the smallest floating dtype the catalog's ops run in (2 bytes an element).
SMALLEST_DTYPES = (torch.bfloat16,)
# Host bytes per element that judging an output in one piece takes at its peak: native's float32 intermediates, the
# float64 golden run and the oracle's float64 comparison (outputs, native, golden, differences, allowed error,
# masks). Measured: rms_norm's judgement of a failing bfloat16 output peaks at 94 tensor bytes an element
# (profiler-counted, the same at 2^16 to 2^22 elements; RSS growth of 2^24 elements gave rotary_embedding 63 per
# element of each of query and key, silu_and_mul 51 per input element); tests/ir/test_size_cases.py holds the estimate
# above a fresh measurement.
JUDGE_BYTES_PER_ELEMENT = 128
# The >2^31-element case of a row-parallel op is judged in row chunks of this many elements
# (conformance.judge.oracle.judge_in_chunks): the judgement holds one chunk's float64 copies (2 GiB at 128 bytes an
# element), not the whole output's (256 GiB in bfloat16). What the whole case holds besides, per element of each
# activation: its inputs, the provider's copy of them and its output (2 bytes each in bfloat16), the bad rows a
# failure names (at most 12 bytes a row of 8: 1.5), and up to 8.5 for a provider's own intermediates (a float32 copy
# and a float32 result, as a provider written in torch makes).
JUDGE_CHUNK_ELEMENTS = 1 << 24
RUN_BYTES_PER_ELEMENT = 16


def judge_memory(elements: int, tensors: int = 1, *, chunked: bool = True) -> int:
    """Bytes free that running and judging a case of `tensors` activations of `elements` each needs: in row chunks
    (a row-parallel op), or in one piece (`chunked=False`: a layer's judgement, an op that is not row by row)."""
    if not chunked:
        return tensors * elements * JUDGE_BYTES_PER_ELEMENT
    return tensors * (elements * RUN_BYTES_PER_ELEMENT + min(elements, JUDGE_CHUNK_ELEMENTS) * JUDGE_BYTES_PER_ELEMENT)


def size_rows(width: int, label: str, options: dict | None = None, *,
              tensors: int = 1) -> list[tuple[str, tuple[int, int], str, dict]]:
    """Case-table rows `(name, (rows, width), level, options)` just past each row limit and past 2^31 elements.

    `label` is how the op's case names spell the width (`hidden=8`, `d=4` for a gated op of width 8); `options`
    are the op's own case options, copied into every row, plus `numerics_only` (their contracts other than the
    values do not depend on size). The >2^31-element row's options add `dtypes` (the smallest dtype),
    `memory_bytes` (what running and judging it in row chunks needs free, see `memory_shortfall`) and
    `whole_memory_bytes` (judged in one piece), counted for `tensors` activations of that shape (2 for a query and a
    key, an input and a residual)."""
    if width < 1:
        raise ValueError(f"size_rows: width {width} must be positive")
    base = {**(options or {}), "numerics_only": True}
    rows = [(f"tokens={limit + 1},{label},{ROWS_FLAG}", (limit + 1, width), level,
             {**base, "dtypes": SMALLEST_DTYPES} if limit in ONE_DTYPE_LIMITS else dict(base))
            for limit, level in ROW_LIMITS]
    big = INT32_ELEMENTS // width + 1
    rows.append((f"tokens={big},{label},{INT32_FLAG}", (big, width), "full",
                 {**base, "dtypes": SMALLEST_DTYPES, "memory_bytes": judge_memory(big * width, tensors),
                  "whole_memory_bytes": judge_memory(big * width, tensors, chunked=False)}))
    return rows


def case_fields(options: dict, *, row_parallel: bool = True) -> dict:
    """The `OpCase` fields a `size_rows` row's options set (`dtypes`, `memory_bytes`, `whole_memory_bytes`,
    `numerics_only`), for `OpCase(name, make_args, level=level, **case_fields(options))`; empty for an ordinary row.
    `row_parallel=False` (an op whose result is not row by row, dynamic per-tensor quantization): judged in one
    piece, so its memory need is the whole judgement's."""
    fields = {k: options[k] for k in ("dtypes", "memory_bytes", "whole_memory_bytes", "numerics_only") if k in options}
    if not row_parallel and "whole_memory_bytes" in fields:
        fields["memory_bytes"] = fields["whole_memory_bytes"]
    return fields


def available_bytes(device: str | torch.device) -> tuple[int | None, str]:
    """(free bytes, where they were read) of `device`: the host's MemAvailable for `cpu`, the device module's
    `mem_get_info` otherwise; None where the device cannot say."""
    kind = torch.device(device).type
    if kind == "cpu":
        return _host_available(), "the host's MemAvailable (/proc/meminfo)"
    try:
        module = torch.get_device_module(kind)
        free, _total = module.mem_get_info()
    except Exception:  # noqa: BLE001 - a device module without mem_get_info (or without a device) cannot say
        return None, f"torch.{kind}.mem_get_info"
    return int(free), f"torch.{kind}.mem_get_info"


def _host_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def memory_shortfall(need: int | None, device: str | torch.device) -> str | None:
    """Why a case that needs `need` bytes free cannot run on `device` now (None: it can, or it declares no need).

    The comparison runs on the host, so the host must have `need` free; a device other than the CPU must also
    have it free (it holds the inputs, the outputs and native's runs)."""
    if not need:
        return None
    places = [("host", "cpu")] + ([] if torch.device(device).type == "cpu" else [(str(device), device)])
    for name, where in places:
        free, source = available_bytes(where)
        if free is None:
            return f"needs {_gib(need)} free on {name}, and {source} cannot say how much is free"
        if free < need:
            return f"needs {_gib(need)} free on {name} to run and judge, {source} reports {_gib(free)}"
    return None


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"
