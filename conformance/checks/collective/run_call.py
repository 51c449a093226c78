"""One call of a communicator method on one rank, and what this rank finds wrong with it (None: nothing). Runs in the
rank processes (ranks.py). `mode` "values" grades what comes back against the float64 reference; "aliasing" grades
what the call writes into its input and returns (docs/collectives.md, the aliasing contract):

- all_reduce may write the sum into its input, or leave the input alone; nothing else;
- broadcast may write src's tensor into its input on the other ranks; src's input is left alone; both may return
  their input itself;
- every other method leaves its inputs byte-identical and returns tensors that share no storage with them;
- a result the caller still holds does not change when the method is called again (no reused output buffer).
"""

from __future__ import annotations

import torch

from conformance.checks.collective.reference import all_inputs, alternatives, compare, expected, part_name


class CallRaised(Exception):
    def __init__(self, exc: BaseException):
        super().__init__(str(exc))
        self.exc = exc


def _call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the implementation's raise is the result
        raise CallRaised(exc) from exc


def perform(comm, call: dict, rank: int, world: int, inputs: list) -> dict:
    """{output name: what came back} of `call` on this rank (its input is `inputs[rank]`)."""
    m = call["method"]
    x = inputs[rank]
    if m == "all_reduce":
        return {"out": _call(comm.all_reduce, x)}
    if m == "all_gather":
        return {"out": _call(comm.all_gather, x, dim=call["dim"])}
    if m == "all_gatherv":
        got = _call(comm.all_gatherv, x, dim=call["dim"], sizes=call["sizes"])
        if call.get("parts"):     # a list in, a list of as many gathered tensors out
            if not isinstance(got, (list, tuple)) or len(got) != call["parts"]:
                return {"list": got}
            return {part_name(k): t for k, t in enumerate(got)}
        return {"out": got}
    if m == "reduce_scatter":
        return {"out": _call(comm.reduce_scatter, x, dim=call["dim"])}
    if m == "reduce_scatterv":
        return {"out": _call(comm.reduce_scatterv, x, dim=call["dim"], sizes=call["sizes"])}
    if m == "gather":
        return {"out": _call(comm.gather, x, dst=call["dst"], dim=call["dim"])}
    if m == "broadcast":
        return {"out": _call(comm.broadcast, x, src=call["src"])}
    if m == "send_recv":
        if "dst" in call:     # explicit peers: rank 0 sends to call["dst"], which receives from call["src"]
            if rank == call["src"]:
                _call(comm.send, x, dst=call["dst"])
            if rank == call["dst"]:
                return {"out": _call(comm.recv, x.shape, x.dtype, src=call["src"])}
            return {"out": None}
        if rank % 2 == 0:
            _call(comm.send, x)
            got = _call(comm.recv, x.shape, x.dtype)
        else:
            got = _call(comm.recv, x.shape, x.dtype)
            _call(comm.send, x)
        return {"out": got}
    if m == "dispatch_combine":
        got = _call(comm.dispatch, x["hidden_states"], x["topk_weights"], x["topk_ids"])
        if not isinstance(got, (tuple, list)) or len(got) < 3:
            return {"dispatch": got}
        out = {"hidden_states": got[0], "topk_weights": got[1], "topk_ids": got[2]}
        out["combine"] = _call(comm.combine, x["combine_in"])
        return out
    if m == "destroy":
        _call(comm.destroy)
        return {}
    raise ValueError(f"collective method {m!r} has no call form")


NAMES = {"hidden_states": "dispatch's hidden_states", "topk_weights": "dispatch's topk_weights",
         "topk_ids": "dispatch's topk_ids", "combine": "combine's result", "out": "the result",
         **{part_name(k): f"the result's tensor {k}" for k in range(8)}}


def run(comm, call: dict, rank: int, world: int, spec: dict, device, held: dict) -> str | None:
    """Run `call` on this rank; None when right, else what is wrong (naming this rank). `held` keeps the aliasing
    mode's first results across the unit's calls."""
    from conformance.collect.units import dtype_from_name

    dtype = dtype_from_name(spec["dtype"])
    inputs = all_inputs(call, world, dtype, spec["seed"], device)
    want, mags = expected(call, inputs, rank, world)
    others = alternatives(call, inputs, rank, world)
    if spec["mode"] == "aliasing":
        return _aliasing(comm, call, rank, world, inputs, want, mags, dtype, held)
    got = perform(comm, call, rank, world, inputs)
    if "dispatch" in got:
        return f"rank {rank}: dispatch returned {type(got['dispatch']).__name__}, not (hidden_states, topk_weights, " \
               "topk_ids)"
    if "list" in got:
        what = f"a {type(got['list']).__name__}" + (f" of {len(got['list'])}" if isinstance(got["list"], (list, tuple))
                                                     else "")
        return f"rank {rank}: given a list of {call['parts']} tensors, returned {what} where a list of " \
               f"{call['parts']} gathered tensors is right"
    problems = []
    for name, w in want.items():
        want_dtype = dtype if name not in ("topk_weights", "topk_ids") else inputs[rank][name].dtype
        said = compare(got.get(name), w, mags.get(name), world, want_dtype, others if name == "out" else None)
        if said:
            problems.append(f"{NAMES[name]}: {said}" if len(want) > 1 else said)
    return f"rank {rank}: {'; '.join(problems)}" if problems else None


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.numel() == 0 or b.numel() == 0:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return sa.data_ptr() == sb.data_ptr()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all()) if a.is_floating_point() else \
        bool((a == b).all())


def _aliasing(comm, call, rank, world, inputs, want, mags, dtype, held: dict) -> str | None:
    m = call["method"]
    mine = inputs[rank]
    if isinstance(mine, list):
        mine = {f"[{k}]": t for k, t in enumerate(mine)}
    tensors = mine if isinstance(mine, dict) else {"input": mine}
    before = {k: v.clone() for k, v in tensors.items()}
    got = perform(comm, call, rank, world, inputs)
    problems = []
    for name, x in tensors.items():
        if _same(x, before[name]):
            continue
        allowed = None
        if m == "all_reduce":
            allowed = ("the sum", want["out"])
        elif m == "broadcast" and rank != call["src"]:
            allowed = (f"src {call['src']}'s tensor", want["out"])
        if allowed is not None and compare(x, allowed[1], mags.get("out"), world, dtype) is None:
            continue
        where = "" if name == "input" else f" {name}"
        what = f"neither its own values nor {allowed[0]}" if allowed else "something (it must be left unchanged)"
        problems.append(f"wrote {what} into its input{where}")
    for out_name, out in got.items():
        if not isinstance(out, torch.Tensor):
            continue
        for name, x in tensors.items():
            if not _overlaps(out, x):
                continue
            in_place_ok = m in ("all_reduce", "broadcast")     # vLLM's base returns the input itself (src's too)
            if in_place_ok and out.data_ptr() == x.data_ptr() and out.shape == x.shape and out.stride() == x.stride():
                continue     # the documented in-place form: the input itself comes back
            which = "" if name == "input" else f" {name}"
            problems.append(f"{NAMES.get(out_name, out_name)} shares storage with its input{which} (a functional "
                            "collective returns a tensor of its own)")
    key = (m, call["shape"] if not isinstance(call["shape"], list) else tuple(call["shape"]), call.get("layout"))
    if call.get("again", 0) == 0:
        held[key] = {k: (v, v.clone()) for k, v in got.items() if isinstance(v, torch.Tensor)}
    else:
        for name, (kept, copy) in held.pop(key, {}).items():
            if not _same(kept, copy):
                problems.append(f"{NAMES.get(name, name)} of the previous call (still held by the caller) changed when "
                                "the method was called again (a reused output buffer)")
    return f"rank {rank}: {'; '.join(problems)}" if problems else None
