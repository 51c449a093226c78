"""Every rank's inputs of a call (deterministic from the seed, the call and the rank), the float64 reference of what
each rank must get back, and the comparison that names what is wrong. Runs in each rank process: every rank rebuilds
every rank's inputs, so the reference needs no tensor to cross a process.

A sum (all_reduce, reduce_scatter, reduce_scatterv, combine) is within `world * eps(dtype) * sum(|x_r|)` (plus the
dtype's smallest normal) of the float64 sum of the inputs as given in their dtype: every correct order of additions in
the dtype stays within that (each of the world - 1 additions rounds by half an ulp of a partial sum, the conversion
once more). Everything else (gathers, broadcast, send/recv, dispatch) moves data and must be bit-exact.
"""

from __future__ import annotations

import torch

from conformance.collect.units import dtype_from_name, unit_seed

SUMS = ("all_reduce", "reduce_scatter", "reduce_scatterv", "combine")


def rank_shape(call: dict, rank: int, part: int = 0) -> tuple[int, ...]:
    """Rank `rank`'s input shape: the `v` variants and all_gatherv's ranks differ along `dim` by `sizes`; part `k`
    of a list input is `k` wider in its last dim."""
    shape = list(call["shape"])
    if call["method"] == "all_gatherv" and call.get("sizes") is not None:
        shape[call["dim"]] = call["sizes"][rank]
    shape[-1] += part
    return tuple(shape)


def make_input(call: dict, rank: int, dtype: torch.dtype, seed: int, device, part: str = "x",
               part_index: int = 0) -> torch.Tensor:
    """Rank `rank`'s input `part` of `call`, in `call`'s layout, on `device`."""
    gen = torch.Generator().manual_seed(unit_seed(seed, call["method"], call["index"], call.get("again", 0), rank,
                                                  part))
    shape = rank_shape(call, rank, part_index)
    layout = call.get("layout", "contiguous")
    if layout == "transposed" and len(shape) >= 2:
        base_shape = (*shape[:-2], shape[-1], shape[-2])
    elif layout == "strided":
        base_shape = (*shape[:-1], shape[-1] * 2)
    else:
        base_shape = shape
    if call.get("values") == "large":
        values = 33000.0 + 7000.0 * torch.rand(base_shape, generator=gen)   # any two sum past 65504
    else:
        values = torch.randn(base_shape, generator=gen)
    x = values.to(dtype).to(device)
    if layout == "transposed" and len(shape) >= 2:
        x = x.transpose(-1, -2)
    elif layout == "strided":
        x = x[..., ::2]
    assert tuple(x.shape) == shape, (x.shape, shape)
    return x


def moe_inputs(call: dict, rank: int, dtype: torch.dtype, seed: int, device) -> dict[str, torch.Tensor]:
    """Rank `rank`'s dispatch inputs (its own number of tokens) and its combine input (all tokens)."""
    tokens, hidden, topk = call["sizes"][rank], call["shape"][1], call["topk"]
    total = sum(call["sizes"])
    gen = torch.Generator().manual_seed(unit_seed(seed, "dispatch_combine", call["index"], call.get("again", 0), rank))
    return {
        "hidden_states": torch.randn(tokens, hidden, generator=gen).to(dtype).to(device),
        "topk_weights": torch.rand(tokens, topk, generator=gen).to(device),
        "topk_ids": torch.randint(0, 8, (tokens, topk), generator=gen, dtype=torch.int32).to(device),
        "combine_in": torch.randn(total, hidden, generator=gen).to(dtype).to(device),
    }


def all_inputs(call: dict, world: int, dtype: torch.dtype, seed: int, device) -> list:
    if call["method"] == "dispatch_combine":
        return [moe_inputs(call, r, dtype, seed, device) for r in range(world)]
    if call.get("parts"):
        return [[make_input(call, r, dtype, seed, device, f"x{k}", k) for k in range(call["parts"])]
                for r in range(world)]
    return [make_input(call, r, dtype, seed, device) for r in range(world)]


def part_name(k: int) -> str:
    """The output name of part `k` of a list input's result."""
    return f"out[{k}]"


def expected(call: dict, inputs: list, rank: int, world: int):
    """{name: float64 tensor or None} this rank must get back, and {name: bound tensor} of the sums' tolerances."""
    m = call["method"]
    if call.get("parts"):    # a list input: each part gathered on its own
        return {part_name(k): torch.cat([x[k].double() for x in inputs], dim=call["dim"])
                for k in range(call["parts"])}, {}
    f64 = [x.double() if isinstance(x, torch.Tensor) else {k: v.double() for k, v in x.items()} for x in inputs]
    if m in ("all_reduce", "reduce_scatter", "reduce_scatterv"):
        total = sum(f64[1:], f64[0])
        mag = sum((x.abs() for x in f64[1:]), f64[0].abs())
        if m == "all_reduce":
            return {"out": total}, {"out": mag}
        dim = call["dim"] % len(call["shape"])
        sizes = call.get("sizes") or [call["shape"][dim] // world] * world
        start = sum(sizes[:rank])
        return ({"out": total.narrow(dim, start, sizes[rank])}, {"out": mag.narrow(dim, start, sizes[rank])})
    if m in ("all_gather", "all_gatherv"):
        return {"out": torch.cat(f64, dim=call["dim"])}, {}
    if m == "gather":
        return {"out": torch.cat(f64, dim=call["dim"]) if rank == call["dst"] else None}, {}
    if m == "broadcast":
        return {"out": f64[call["src"]]}, {}
    if m == "send_recv":
        src = call.get("src", (rank - 1) % world)
        if "dst" in call:    # explicit peers: only the last rank receives (from rank 0)
            return {"out": f64[src] if rank == call["dst"] else None}, {}
        return {"out": f64[src]}, {}
    if m == "dispatch_combine":
        out = {k: torch.cat([x[k] for x in f64]) for k in ("hidden_states", "topk_weights", "topk_ids")}
        sizes = call["sizes"]
        start = sum(sizes[:rank])
        total = sum((x["combine_in"] for x in f64[1:]), f64[0]["combine_in"])
        mag = sum((x["combine_in"].abs() for x in f64[1:]), f64[0]["combine_in"].abs())
        out["combine"] = total.narrow(0, start, sizes[rank])
        return out, {"combine": mag.narrow(0, start, sizes[rank])}
    if m == "destroy":
        return {}, {}
    raise ValueError(f"no reference for collective method {m!r}")


def _index(flat: int, shape) -> tuple[int, ...]:
    idx = []
    for size in reversed(tuple(shape)):
        idx.append(flat % size if size else 0)
        flat //= size if size else 1
    return tuple(reversed(idx))


def compare(got, want: torch.Tensor | None, mag: torch.Tensor | None, world: int, dtype: torch.dtype,
            others: dict[str, torch.Tensor] | None = None) -> str | None:
    """None when `got` is what `want` says; otherwise what is wrong, in words. `mag`: a sum's bound (sum of |x_r|).
    `others`: named float64 tensors a wrong result may be instead ("rank 0's chunk"), named in the message."""
    if want is None:
        if got is not None:
            return (f"returned a {type(got).__name__} of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor)
                    else f"returned {type(got).__name__}") + " where None is right (not the destination rank)"
        return None
    if not isinstance(got, torch.Tensor):
        return f"returned {got!r:.60} where a tensor of shape {tuple(want.shape)} is right"
    if tuple(got.shape) != tuple(want.shape):
        return f"returned shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if got.dtype != dtype:
        return f"returned dtype {str(got.dtype).removeprefix('torch.')}, expected {str(dtype).removeprefix('torch.')}"
    g = got.detach().to("cpu", torch.float64)
    if mag is None:
        bad = ~((g == want) | (g.isnan() & want.isnan()))
    else:
        eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
        tiny = torch.finfo(dtype).tiny if dtype.is_floating_point else 0.0
        bound = world * eps * mag + tiny
        bad = ~((g - want).abs() <= bound)
    n_bad = int(bad.sum())
    if not n_bad:
        return None
    flat = bad.flatten().nonzero()[0].item()
    first = _index(flat, want.shape)
    said = (f"{n_bad} of {want.numel()} elements wrong, first at {first}: {g[first].item():.6g} where "
            f"{want[first].item():.6g} is right")
    if mag is not None:
        said += " (to within the sum's rounding bound)"
    bad_idx = bad.flatten().nonzero().flatten()
    first_bad, last_bad = int(bad_idx[0]), int(bad_idx[-1])
    if n_bad < want.numel() and last_bad - first_bad + 1 == n_bad and last_bad == want.numel() - 1:
        said += f"; the wrong elements are the last {n_bad} (flat {int(bad_idx[0])}..{int(bad_idx[-1])})"
    for name, other in (others or {}).items():
        if tuple(other.shape) == tuple(want.shape) and _matches(g, other, mag, world, dtype):
            said += f"; it is {name}" + (" (src ignored?)" if ", not src " in name else "")
            break
        if tuple(other.shape) == tuple(want.shape) and n_bad < want.numel():
            sub = bad
            if _matches(g[sub], other[sub], None if mag is None else mag[sub], world, dtype):
                said += f"; the wrong elements hold {name}"
                break
    return said


def _matches(g, other, mag, world, dtype) -> bool:
    if mag is None:
        return bool(((g == other) | (g.isnan() & other.isnan())).all())
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return bool(((g - other).abs() <= world * eps * mag + torch.finfo(dtype).tiny).all())


def alternatives(call: dict, inputs: list, rank: int, world: int) -> dict[str, torch.Tensor]:
    """What a wrong result may be instead, by name: another rank's chunk, another rank's tensor, this rank's own input,
    the parts in another order."""
    m = call["method"]
    if m == "dispatch_combine" or call.get("parts"):
        return {}
    f64 = [x.double() for x in inputs]
    alt: dict[str, torch.Tensor] = {}
    if m in ("reduce_scatter", "reduce_scatterv"):
        total = sum(f64[1:], f64[0])
        dim = call["dim"] % len(call["shape"])
        sizes = call.get("sizes") or [call["shape"][dim] // world] * world
        for r in range(world):
            if r != rank:
                alt[f"rank {r}'s chunk (the wrong rank's chunk)"] = total.narrow(dim, sum(sizes[:r]), sizes[r])
        alt["this rank's own input, unreduced"] = f64[rank].narrow(dim, sum(sizes[:rank]), sizes[rank])
    elif m == "all_reduce":
        alt["this rank's own input, unreduced"] = f64[rank]
    elif m == "broadcast":
        for r in range(world):
            if r != call["src"]:
                alt[f"rank {r}'s tensor, not src {call['src']}'s"] = f64[r]
    elif m in ("all_gather", "all_gatherv", "gather"):
        alt["the ranks' parts in reverse rank order"] = torch.cat(f64[::-1], dim=call["dim"])
    elif m == "send_recv":
        for r in range(world):
            alt[f"rank {r}'s tensor"] = f64[r]
    return alt
