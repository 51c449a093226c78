"""The calls the collective family makes of a communicator: per method, world size and level, a list of plain dicts
(they cross a pipe to every rank), each one call with its arguments, its input's shape on every rank and its layout.
No torch here: the runner and the units read these without building a tensor.

A call dict: `method`; `shape` (every rank's input shape; the `v` variants' rank r has `sizes[r]` along `dim`);
`dim`, `sizes`, `src`, `dst` where the method takes them; `parts` (all_gatherv: the input is a list of that many
tensors, part k `k` wider in its last dim, all gathered with the same `sizes`, as vLLM gathers hidden states and
router logits in one call); `layout` (`contiguous`, `transposed`: a transposed view of
the last two dims, `strided`: every other element of the last dim); `values` (`normal`, or `large`: positive values
whose sum over two ranks is past float16's largest finite value, for bfloat16 and float32); `index` (its place in the
unit, which seeds its inputs).
"""

from __future__ import annotations

METHODS = ("all_reduce", "all_gather", "all_gatherv", "reduce_scatter", "reduce_scatterv", "gather", "broadcast",
           "send_recv", "dispatch_combine", "destroy")
# the group each method is graded on: tensor parallel (vLLM's CpuCommunicator takes its shared-memory path there) and
# data parallel (plain torch.distributed); dispatch/combine only on the expert-parallel group, built with use_all2all
GROUPS = {m: ("tp:0", "dp:0") for m in METHODS}
GROUPS["dispatch_combine"] = ("ep:0",)
WORLD_SIZES = {"quick": (2,), "standard": (2,), "full": (2, 4)}
BIG = (1 << 20) + 3          # one size past 2^20 elements per method that moves data
BASE_SHAPES = ((5,), (3, 4), (2, 3, 5), (2, 3, 2, 5))


def case_name(world: int) -> str:
    return f"world={world}"


def parse_unit(provider: str | None, case: str | None) -> tuple[str, int]:
    """(group unique_name, world size) of a unit: its `provider` names the group ("tp:0"), its case the world size
    ("world=2"); ValueError naming the problem otherwise."""
    world = (case or "").removeprefix("world=")
    if not (case or "").startswith("world=") or not world.isdigit() or int(world) < 2:
        raise ValueError(f"collective case {case!r} is not 'world=<N>' with N >= 2 (e.g. 'world=2')")
    if not provider or ":" not in provider:
        raise ValueError(f"collective unit provider {provider!r} is not a group's unique_name (e.g. 'tp:0')")
    return provider, int(world)


# methods that only move data: one dtype at quick and standard (every dtype at full); the sums take every dtype
DATA_MOVEMENT = ("all_gather", "all_gatherv", "gather", "broadcast", "send_recv", "destroy")


def _dims(ndim: int) -> list[int]:
    return [d for d in range(-ndim, ndim)]


def _with(shape: tuple[int, ...], dim: int, size: int) -> tuple[int, ...]:
    out = list(shape)
    out[dim] = size
    return tuple(out)


def uneven_sizes(world: int, offset: int = 0) -> list[int]:
    """Per-rank sizes that differ from rank to rank (1, 3, 2, 4, ... shifted by `offset`)."""
    pattern = (1, 3, 2, 4, 5, 2, 3, 1)
    return [pattern[(r + offset) % len(pattern)] for r in range(world)]


def calls_of(method: str, world: int, level: str, dtype: str) -> list[dict]:
    """The calls a unit of `method` makes at `world` ranks and `level`, in order; `dtype` adds the bfloat16 /
    float32 sums past float16's range."""
    calls: list[dict] = []

    def add(**call):
        call.setdefault("layout", "contiguous")
        call.setdefault("values", "normal")
        call["method"] = method
        call["index"] = len(calls)
        calls.append(call)

    big = level != "quick"
    if method == "all_reduce":
        for shape in ((1,), (world * 3 + 1,), *BASE_SHAPES):
            add(shape=shape)
        add(shape=(6, 7), layout="transposed")
        add(shape=(3, 9), layout="strided")
        add(shape=(world * 3 + 1,))       # a repeated call: same shape, new values
        if dtype in ("bfloat16", "float32"):
            add(shape=(4, 33), values="large")
        if big:
            add(shape=(BIG,))
    elif method == "all_gather":
        for shape in BASE_SHAPES:
            for dim in _dims(len(shape)):
                add(shape=shape, dim=dim)
        add(shape=(1,), dim=0)
        add(shape=(6, 7), dim=-1, layout="transposed")
        add(shape=(3, 9), dim=0, layout="strided")
        add(shape=(2, 3, 5), dim=1)       # repeated
        if big:
            add(shape=(BIG,), dim=-1)
    elif method == "all_gatherv":
        for shape in BASE_SHAPES:
            for dim in (0, -1) if len(shape) > 1 else (0,):
                add(shape=shape, dim=dim, sizes=uneven_sizes(world, len(calls)))
        add(shape=(5, 6), dim=0, sizes=[2] * world)              # equal sizes given
        add(shape=(6, 7), dim=0, sizes=uneven_sizes(world), layout="transposed")
        add(shape=(3, 4), dim=0, sizes=None)                      # sizes=None: every rank the same
        add(shape=(2, 3, 5), dim=1, sizes=uneven_sizes(world, 1))  # repeated
        add(shape=(4, 6), dim=0, sizes=uneven_sizes(world, 2), parts=2)   # a list (hidden states and router logits)
        if big:
            add(shape=(BIG // world, 2), dim=0, sizes=uneven_sizes(world))
    elif method == "reduce_scatter":
        for shape in BASE_SHAPES:
            for dim in _dims(len(shape)):
                add(shape=_with(shape, dim, world * (2 if len(shape) % 2 else 1)), dim=dim)
        add(shape=(world * 3, 7), dim=0, layout="transposed")
        add(shape=(5, world * 2), dim=-1, layout="strided")
        add(shape=(2, 4, world * 3), dim=-1)       # repeated, the shape vLLM 0.32's base gets wrong at world 2
        if dtype in ("bfloat16", "float32"):
            add(shape=(world * 2, 9), dim=0, values="large")
        if big:
            add(shape=(world * ((BIG // world) + 1),), dim=0)
    elif method == "reduce_scatterv":
        for shape in BASE_SHAPES:
            for dim in (0, -1) if len(shape) > 1 else (0,):
                sizes = uneven_sizes(world, len(calls))
                add(shape=_with(shape, dim, sum(sizes)), dim=dim, sizes=sizes)
        add(shape=(world * 2, 5), dim=0, sizes=None)
        sizes = uneven_sizes(world)
        add(shape=(sum(sizes), 7), dim=0, sizes=sizes, layout="transposed")
        if big:
            sizes = [BIG // world + r for r in range(world)]
            add(shape=(sum(sizes),), dim=0, sizes=sizes)
    elif method == "gather":
        for dst in range(world):
            for shape in BASE_SHAPES:
                for dim in (0, -1):
                    add(shape=shape, dim=dim, dst=dst)
        add(shape=(2, 3, 5), dim=1, dst=world - 1)
        add(shape=(6, 7), dim=0, dst=world - 1, layout="transposed")
        if big:
            add(shape=(BIG,), dim=0, dst=world - 1)
    elif method == "broadcast":
        for src in range(world):
            for shape in ((1,), *BASE_SHAPES):
                add(shape=shape, src=src)
        add(shape=(6, 7), src=world - 1, layout="transposed")
        add(shape=(3, 9), src=world - 1, layout="strided")
        if big:
            add(shape=(BIG,), src=world - 1)
    elif method == "send_recv":
        for shape in ((1,), *BASE_SHAPES):
            add(shape=shape)                # default peers: the next rank, the previous rank
        add(shape=(6, 7), layout="transposed")
        add(shape=(3, 4), dst=world - 1, src=0)   # explicit peers: rank 0 sends to the last rank
        if big:
            add(shape=(BIG,))
    elif method == "dispatch_combine":
        for hidden in (8, 33):
            add(shape=(0, hidden), sizes=uneven_sizes(world, hidden), topk=2)
        add(shape=(0, 16), sizes=[1] * world, topk=1)
    elif method == "destroy":
        add(shape=(1,))
    else:
        raise ValueError(f"collective method {method!r} is not one of {METHODS}")
    return calls


ALIASING_METHODS = ("all_reduce", "all_gather", "all_gatherv", "reduce_scatter", "reduce_scatterv", "gather",
                    "broadcast", "send_recv", "dispatch_combine")


def aliasing_calls(method: str, world: int) -> list[dict]:
    """The aliasing check's calls: a contiguous and a non-contiguous input, each called twice with new values (the
    first result is kept and must not change)."""
    first = calls_of(method, world, "quick", "float32")
    picked = [c for c in first if c["layout"] == "contiguous" and len(c["shape"]) == 2][:1] or first[:1]
    if method != "send_recv":   # a send that refuses a strided tensor leaves its peer waiting out the call timeout:
        picked += [c for c in first if c["layout"] != "contiguous"][:1]   # collective.methods already grades that
    out = []
    for call in picked:
        for again in (0, 1):
            out.append(dict(call, index=len(out), again=again))
    return out


def describe(call: dict, dtype: str) -> str:
    """`reduce_scatter(dim=-1) on (2, 4, 6) float32, transposed` (the `v` variants: each rank's sizes)."""
    method = call["method"]
    args = []
    for key in ("dim", "sizes", "src", "dst"):
        if key in call and not (method == "send_recv" and key in ("src", "dst")):
            args.append(f"{key}={call[key]}")
    if method == "send_recv":
        args = [f"dst={call['dst']}", f"src={call['src']}"] if "dst" in call else ["default peers"]
    shape = tuple(call["shape"])
    if call.get("parts"):
        args.append(f"a list of {call['parts']} tensors")
    if method == "dispatch_combine":
        what = f"{call['sizes']} tokens per rank, hidden {shape[1]}, top-{call['topk']}"
    else:
        what = f"{shape}"
    extra = "" if call.get("layout", "contiguous") == "contiguous" else f", {call['layout']}"
    if call.get("values") == "large":
        extra += ", values near 3.5e4 (the sum is past float16's range)"
    name = {"send_recv": "send/recv", "dispatch_combine": "dispatch/combine"}.get(method, method)
    return f"{name}({', '.join(args)}) on {what} {dtype}{extra}"
