"""Collective family: the platform's device communicator (`Platform.get_device_communicator_cls()`, vLLM 0.32's
`DeviceCommunicatorBase` contract) in a process group of spawned ranks over gloo, against a float64 reference
computed from every rank's inputs (docs/collectives.md).

A unit is one method (`op`), one dtype and one group (`case` = `"<unique_name>,world=<N>"`: `tp:0` and `dp:0`,
`ep:0` for dispatch/combine, built with `use_all2all`), so that one broken method of one group is one result. The
communicator is built as vLLM's `GroupCoordinator` builds it (a device group on the platform's backend, a gloo cpu
group, the device, `unique_name`, `use_all2all`), in rank processes kept for every unit of the run (group.py, one group
per world size); `collective.methods` grades what every call returns on every rank, `collective.aliasing` what it
writes into its inputs and whether a result the caller holds changes. Under `--platform=vllm` the class is the one
vLLM's resolved platform names, built in ranks the bridge prepares (the platform's `conformance_communicator_setup`:
the checks never import the bridge), and each result's origin is the code that ran: the method as the class resolves
it (the vendor's own, or one inherited from vLLM's base class).
"""

from __future__ import annotations

from conformance.checks.collective.cases import (ALIASING_METHODS, DATA_MOVEMENT, GROUPS, METHODS, WORLD_SIZES,
                                                 aliasing_calls, calls_of, case_name, describe, parse_unit)
from conformance.checks.common import CheckContext, Verdict
from conformance.checks.record import check
from conformance.collect.units import Unit, dtype_name, unit_seed
from conformance.results.result import Outcome

# the communicator methods behind a unit's op (their definitions decide whose code a result grades)
CODE_OF = {"send_recv": ("send", "recv"), "dispatch_combine": ("dispatch", "combine")}


def recipe_of(platform) -> dict | None:
    """How a rank builds the platform's communicator: its class qualname, the bridge's rank setup (a qualname the
    rank calls first, which may name the class, device and backend as the runtime resolves them there), the device
    type and the torch.distributed backend of the device group. None: the platform names no communicator."""
    get = getattr(platform, "get_device_communicator_cls", None)
    qualname = get() if callable(get) else None
    if not qualname:
        return None
    if not isinstance(qualname, str):     # a class, as some plugins return
        qualname = f"{qualname.__module__}.{qualname.__qualname__}"
    return {"cls": qualname, "setup": getattr(platform, "conformance_communicator_setup", None) or "",
            "device": str(platform.device_type), "backend": getattr(platform, "dist_backend", None) or "gloo"}


def collective_units(inventory, family: str, check_name: str, level: str) -> list[Unit]:
    """Per world size of the level (2; 2 and 4 at full), method, group (the unit's provider: `tp:0`, `dp:0`; `ep:0`
    for dispatch/combine) and dtype: the platform's floating dtypes for the sums, the first for the methods that only
    move data (every dtype at full), and the first only at quick and for the aliasing check. Quick grades the first
    group only."""
    if recipe_of(inventory.platform) is None:
        return []
    dtypes = [dtype_name(d) for d in inventory.platform.supported_dtypes if d.is_floating_point]
    methods = ALIASING_METHODS if check_name == "aliasing" else METHODS
    units = []
    for world in WORLD_SIZES[level]:
        for method in methods:
            groups = GROUPS[method][:1] if level == "quick" else GROUPS[method]
            one = level == "quick" or check_name == "aliasing" or (method in DATA_MOVEMENT and level != "full")
            units += [Unit(family, check_name, method, g, d, case_name(world)) for g in groups
                      for d in (dtypes[:1] if one else dtypes)]
    return units


@check("collective", "methods", units=collective_units)
def methods(ctx: CheckContext, unit: Unit) -> Verdict:
    return _run(ctx, unit, "values")


@check("collective", "aliasing", units=collective_units)
def aliasing(ctx: CheckContext, unit: Unit) -> Verdict:
    return _run(ctx, unit, "aliasing")


# ----- running a unit --------------------------------------------------------------------------------
def _run(ctx: CheckContext, unit: Unit, mode: str) -> Verdict:
    from conformance.checks.collective.group import GroupFailed, group_for

    known = ALIASING_METHODS if mode == "aliasing" else METHODS
    if unit.op not in known:
        return Verdict(Outcome.ERROR, f"collective unit op {unit.op!r} is not one of {known}")
    group_name, world = parse_unit(unit.provider, unit.case)
    recipe = recipe_of(ctx.platform)
    if recipe is None:
        return Verdict(Outcome.NOT_IMPLEMENTED, "the platform names no device communicator "
                       "(get_device_communicator_cls)")
    dtype = unit.dtype or "float32"
    calls = aliasing_calls(unit.op, world) if mode == "aliasing" else calls_of(unit.op, world, ctx.level, dtype)
    origin, code = _origin(ctx, recipe["cls"], unit.op)
    try:
        group = group_for(world, recipe)
    except GroupFailed as exc:
        return Verdict(Outcome.ERROR, f"{exc} [{_where(recipe, group_name, world, None)}]", origin=origin)
    spec = {"cls": recipe["cls"], "group": group_name, "use_all2all": group_name.startswith("ep"), "calls": calls,
            "dtype": dtype,
            "seed": unit_seed(ctx.seed, "collective", unit.op, dtype, world), "mode": mode}
    result = group.run(spec)
    where = f"{_where(recipe, group_name, world, group)}; {code}"
    return _verdict(result, calls, dtype, where, group.timeout + group.grace, origin, unit.op, mode)


def _where(recipe: dict, group_name: str, world: int, group) -> str:
    cls = recipe["cls"]
    device = (group.info.get("device") if group is not None else None) or recipe["device"]
    return (f"{cls} built as vLLM's GroupCoordinator builds it: unique_name {group_name!r}, {world} ranks over "
            f"gloo, device {device}" + (", use_all2all=True" if group_name.startswith("ep") else ""))


def _origin(ctx: CheckContext, qualname: str, op: str) -> tuple[dict | None, str]:
    """The origin of the code a unit of `op` runs (the method as the class resolves it) and how the message says it."""
    from conformance.checks.collective.ranks import resolve
    from conformance.collect.origin import REFERENCE_DISTRIBUTION, Attribution, code_of, distribution_of_module

    try:
        cls = resolve(qualname)
    except Exception as exc:  # noqa: BLE001 - the ranks report it too, as the unit's ERROR
        return None, f"class {qualname} does not import here ({type(exc).__name__}: {exc})"
    platform = ctx.platform
    bridged = getattr(platform, "conformance_plugin", None)
    under_test = (bridged or {}).get("distribution")
    if under_test is None:
        from reference_impl.plugins import platform_distribution

        under_test = (platform_distribution(ctx.platform_name) or {}).get("distribution")
    if under_test is None:
        code = code_of(getattr(platform, "conformance_code", None) or type(platform))
        found = distribution_of_module(code.__module__)
        under_test = found[0] if found else None
    table = Attribution(under_test, {REFERENCE_DISTRIBUTION, *(getattr(platform, "conformance_upstream", None) or ())})
    names = CODE_OF.get(op, (op,))
    found_origins = []
    for name in names:
        definer = next((k for k in cls.__mro__ if name in vars(k)), None)
        if definer is None:
            continue
        found_origins.append((name, definer, table.origin(vars(definer)[name])))
    if not found_origins:
        return table.origin(cls).to_json(), f"{cls.__qualname__} defines none of {', '.join(names)}"
    name, definer, origin = next(((n, d, o) for n, d, o in found_origins if not o.upstream), found_origins[0])
    said = []
    for n, d, o in found_origins:
        whose = "its own" if d is cls else f"inherited from {d.__module__}.{d.__qualname__}"
        said.append(f"{n}: {whose}" + (f" ({o.distribution} {o.version}, upstream)" if o.upstream else ""))
    return origin.to_json(), f"code: {'; '.join(said)}"


def _calls(n: int) -> str:
    return f"{n} call" if n == 1 else f"{n} calls"


def _raise_text(info: dict) -> str:
    return f"{info['type']}: {info['line']}" if info.get("line") else info["type"]


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _verdict(result, calls: list[dict], dtype: str, where: str, limit: float, origin, op: str,
             mode: str = "values") -> Verdict:
    by_index = {c["index"]: c for c in calls}

    def call_text(at: int) -> str:
        if at == -1:
            return "constructing the communicator"
        return describe(by_index[at], dtype)

    if result.ended == "timeout":
        others = []
        for r, info in sorted(result.raises.get(result.at, {}).items()):
            others.append(f"rank {r} raised {_raise_text(info)} (waiting on the hung rank)")
        returned = [r for r, what in result.others.items() if what == "returned"]
        if returned:
            others.append(f"{_ranks(returned)} returned")
        return Verdict(Outcome.TIMEOUT, f"{call_text(result.at)} did not return on {_ranks(result.silent)} within "
                       f"{limit:g} s" + (f"; {'; '.join(others)}" if others else "") + f" [{where}]", origin=origin)
    if result.ended == "crash":
        died = "; ".join(f"rank {r} died ({how})" for r, how in sorted(result.died.items()))
        return Verdict(Outcome.CRASH, f"{died} during {call_text(result.at)} [{where}]", origin=origin)
    if result.ended == "split":
        raised = result.raises.get(result.at, {})
        said = "; ".join(f"rank {r} raised {_raise_text(i)} at {i['where']}" for r, i in sorted(raised.items()))
        returned = [r for r, what in result.others.items() if what == "returned"]
        rest = (f"; {_ranks(returned)} returned" if returned else "") + " (the ranks disagreed: the group's " \
            "communicator is built afresh for the next unit)"
        return Verdict(Outcome.ERROR, f"{call_text(result.at)}: {said}{rest} [{where}]", origin=origin)
    if -1 in result.raises:
        info = next(iter(result.raises[-1].values()))
        if "parallel_state.py" in info["where"] and "is not initialized" in info["line"]:
            # vLLM's all2all managers read vLLM's own process groups (get_dp_group), which only vLLM's
            # initialize_model_parallel builds: not the communicator's fault, and not graded here
            return Verdict(Outcome.SKIP, f"constructing the communicator reads vLLM's own process groups "
                           f"({_raise_text(info)} at {info['where']}): its expert-parallel all2all needs vLLM's "
                           f"parallel state, which the family does not build, so it is not graded [{where}]",
                           origin=origin)
        return Verdict(Outcome.ERROR, f"constructing the communicator raised {_raise_text(info)} on every rank "
                       f"(at {info['where']}) [{where}]\n{info.get('traceback', '')}", origin=origin)
    wrong = [(at, f) for at, f in sorted(result.findings.items()) if at >= 0 and any(f.values())]
    raised = sorted((at, i) for at, i in result.raises.items() if at >= 0)
    refused = [(at, i) for at, i in raised if next(iter(i.values()))["type"] == "NotImplementedError"]
    errors = [(at, i) for at, i in raised if (at, i) not in refused]
    n = len(calls)
    if refused and len(refused) == n:
        info = next(iter(refused[0][1].values()))
        return Verdict(Outcome.NOT_SUPPORTED, f"{op} raises NotImplementedError on every call "
                       f"({_raise_text(info)} at {info['where']}): the communicator does not implement it [{where}]",
                       origin=origin)
    parts = []
    for at, findings in wrong[:3]:
        parts.append(f"{call_text(at)}: " + "; ".join(f for _, f in sorted(findings.items()) if f))
    raise_parts = [f"{call_text(at)} raised {_raise_text(next(iter(i.values())))} on every rank "
                   f"(at {next(iter(i.values()))['where']})" for at, i in errors[:3]]
    refusal = (f"; {len(refused)} calls raised NotImplementedError (not supported), first "
               f"{call_text(refused[0][0])}" if refused else "")
    if mode == "aliasing" and errors and len(errors) < n:
        # a call that raised wrote and returned nothing to grade here; collective.methods reports the raise
        refusal += (f"; {len(errors)} calls raised and are not graded here (collective.methods reports them): first "
                    f"{raise_parts[0]}")
        errors = []
    if wrong:
        more = f"; {len(wrong) - 3} more wrong calls" if len(wrong) > 3 else ""
        also = f"; also {len(errors)} calls raised: {'; '.join(raise_parts)}" if errors else ""
        return Verdict(Outcome.FAIL, f"{len(wrong)} of {_calls(n)} wrong: {' | '.join(parts)}{more}{also}{refusal} "
                       f"[{where}]", origin=origin)
    if errors:
        more = f"; {len(errors) - 3} more" if len(errors) > 3 else ""
        return Verdict(Outcome.ERROR, f"{len(errors)} of {_calls(n)} raised: {'; '.join(raise_parts)}{more}{refusal} "
                       f"[{where}]", origin=origin)
    graded = n - len(raised) if mode == "aliasing" else n - len(refused)
    said = ("on every rank: inputs written only as the contract allows, results of their own, a held result "
            "unchanged by the next call") if mode == "aliasing" else "right on every rank"
    return Verdict(Outcome.PASS, f"{_calls(graded)} {said}{refusal} [{where}]", origin=origin)
