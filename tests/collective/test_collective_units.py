"""The collective family's parts that need no process group: its units, its cases, what a bad unit or setting says,
the float64 reference's comparison and diagnoses, the reference communicator's argument checks, the aliasing rule
set, and the platform hooks (docs/collectives.md)."""

from __future__ import annotations

import types

import pytest
import torch

from conformance.checks import collective
from conformance.checks.collective import cases, group, reference
from conformance.checks.common import CheckContext
from conformance.collect.units import Unit
from conformance.results.result import Outcome
from reference_impl.distributed.communicator import CommunicatorError, ReferenceCommunicator
from reference_impl.platforms.builtin import CpuPlatform, CudaPlatform


def _inventory(platform):
    return types.SimpleNamespace(platform=platform)


def test_reference_platforms_name_the_reference_communicator_and_their_backend():
    assert CpuPlatform().get_device_communicator_cls() == \
        "reference_impl.distributed.communicator.ReferenceCommunicator"
    assert (CpuPlatform.dist_backend, CudaPlatform.dist_backend) == ("gloo", "nccl")
    recipe = collective.recipe_of(CpuPlatform())
    assert recipe == {"cls": "reference_impl.distributed.communicator.ReferenceCommunicator", "setup": "",
                      "device": "cpu", "backend": "gloo"}


def test_units_per_level():
    standard = collective.collective_units(_inventory(CpuPlatform()), "collective", "methods", "standard")
    ids = {u.id for u in standard}
    # the sums in every dtype on tp and dp; the data moves in the first dtype; dispatch/combine on ep only
    assert "all_reduce-tp:0-bfloat16-world=2" in ids and "reduce_scatter-dp:0-float16-world=2" in ids
    assert "all_gather-tp:0-float32-world=2" in ids and "all_gather-tp:0-bfloat16-world=2" not in ids
    assert "dispatch_combine-ep:0-float16-world=2" in ids and not any("dispatch_combine-tp" in i for i in ids)
    assert {u.case for u in standard} == {"world=2"}
    full = collective.collective_units(_inventory(CpuPlatform()), "collective", "methods", "full")
    assert {u.case for u in full} == {"world=2", "world=4"}
    assert "all_gather-tp:0-bfloat16-world=4" in {u.id for u in full}
    quick = collective.collective_units(_inventory(CpuPlatform()), "collective", "methods", "quick")
    assert {u.provider for u in quick} == {"tp:0", "ep:0"} and {u.dtype for u in quick} == {"float32"}
    aliasing = collective.collective_units(_inventory(CpuPlatform()), "collective", "aliasing", "standard")
    assert {u.dtype for u in aliasing} == {"float32"} and "destroy" not in {u.op for u in aliasing}
    nothing = types.SimpleNamespace(device_type="cpu", supported_dtypes=[torch.float32],
                                    get_device_communicator_cls=lambda: None)
    assert collective.collective_units(_inventory(nothing), "collective", "methods", "standard") == []


def test_cases_cover_what_the_issue_asks():
    rs = cases.calls_of("reduce_scatter", 2, "standard", "bfloat16")
    dims = {(len(c["shape"]), c["dim"]) for c in rs}
    assert {(n, d) for n in (1, 2, 3, 4) for d in range(-n, n)} <= dims           # every dim, negative too, 1-D..4-D
    assert any(c["shape"] == (2, 4, 6) and c["dim"] == -1 for c in rs)            # vLLM 0.32's wrong case
    assert any(c["values"] == "large" for c in rs)                                # bf16 sums past fp16's range
    assert max(c["shape"][0] for c in rs) > 1 << 20                                # one size past 2^20
    assert all(c["shape"][c["dim"]] % 2 == 0 for c in rs)                          # valid calls only
    ar = cases.calls_of("all_reduce", 2, "standard", "float16")
    assert any(c["shape"] == (1,) for c in ar) and any(c["shape"][0] % 2 for c in ar)
    assert {c["layout"] for c in ar} == {"contiguous", "transposed", "strided"}
    assert not any(c["values"] == "large" for c in ar)                            # float16 cannot hold the sum
    assert {c["dst"] for c in cases.calls_of("gather", 4, "full", "float32")} == {0, 1, 2, 3}
    assert {c["src"] for c in cases.calls_of("broadcast", 2, "quick", "float32")} == {0, 1}
    rsv = cases.calls_of("reduce_scatterv", 4, "full", "float32")
    assert any(c["sizes"] and len(set(c["sizes"])) > 1 for c in rsv)
    assert all(c["sizes"] is None or sum(c["sizes"]) == c["shape"][c["dim"]] for c in rsv)
    assert cases.describe(rs[0], "float32") == "reduce_scatter(dim=-1) on (4,) float32"


def test_bad_units_and_settings_say_what_is_wrong(monkeypatch):
    with pytest.raises(ValueError, match=r"collective case 'world=1' is not 'world=<N>' with N >= 2"):
        cases.parse_unit("tp:0", "world=1")
    with pytest.raises(ValueError, match=r"provider 'tp' is not a group's unique_name"):
        cases.parse_unit("tp", "world=2")
    with pytest.raises(ValueError, match="collective method 'all_to_all' is not one of"):
        cases.calls_of("all_to_all", 2, "standard", "float32")
    monkeypatch.setenv(group.CALL_TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=r"CONFORMANCE_COLLECTIVE_CALL_TIMEOUT='soon': give a number of seconds"):
        group.call_timeout()
    monkeypatch.setenv(group.CALL_TIMEOUT_ENV, "0")
    with pytest.raises(ValueError, match="greater than 0"):
        group.call_timeout()
    monkeypatch.setenv(group.CALL_TIMEOUT_ENV, "2.5")
    assert group.call_timeout() == 2.5
    ctx = CheckContext("cpu", CpuPlatform())
    verdict = collective.methods(ctx, Unit("collective", "methods", "all_to_all", "tp:0", "float32", "world=2"))
    assert verdict.outcome is Outcome.ERROR and "op 'all_to_all' is not one of" in verdict.message


def _call(method, **kw):
    call = {"method": method, "index": 0, "layout": "contiguous", "values": "normal"}
    call.update(kw)
    return call


def test_reference_and_its_diagnoses():
    world, dtype = 2, torch.float32
    call = _call("reduce_scatter", shape=(2, 4, 6), dim=-1)
    inputs = reference.all_inputs(call, world, dtype, 7, "cpu")
    want, mags = reference.expected(call, inputs, 0, world)
    assert want["out"].shape == (2, 4, 3) and want["out"].dtype == torch.float64
    others = reference.alternatives(call, inputs, 0, world)
    wrong_chunk = (inputs[0] + inputs[1])[..., 3:]
    said = reference.compare(wrong_chunk, want["out"], mags["out"], world, dtype, others)
    assert said.startswith("18 of 24 elements wrong") or "elements wrong" in said
    assert "it is rank 1's chunk (the wrong rank's chunk)" in said
    assert reference.compare((inputs[0] + inputs[1])[..., :3], want["out"], mags["out"], world, dtype) is None
    assert reference.compare(torch.zeros(6, 2, 2), want["out"], mags["out"], world, dtype) == \
        "returned shape (6, 2, 2), expected (2, 4, 3)"
    # a remainder left unreduced: the last element holds this rank's own input
    call = _call("all_reduce", shape=(7,))
    inputs = reference.all_inputs(call, world, dtype, 7, "cpu")
    want, mags = reference.expected(call, inputs, 0, world)
    got = inputs[0] + inputs[1]
    got[6] = inputs[0][6]
    others = reference.alternatives(call, inputs, 0, world)
    said = reference.compare(got, want["out"], mags["out"], world, dtype, others)
    assert "1 of 7 elements wrong, first at (6,)" in said and "the wrong elements are the last 1 (flat 6..6)" in said
    assert "the wrong elements hold this rank's own input, unreduced" in said
    # a bfloat16 sum past float16's range is finite and within the bound
    call = _call("all_reduce", shape=(4, 33), values="large")
    inputs = reference.all_inputs(call, world, torch.bfloat16, 7, "cpu")
    want, mags = reference.expected(call, inputs, 0, world)
    assert want["out"].min() > 65504
    assert reference.compare(inputs[0] + inputs[1], want["out"], mags["out"], world, torch.bfloat16) is None
    assert "inf" in reference.compare((inputs[0].half() + inputs[1].half()).bfloat16(), want["out"], mags["out"],
                                      world, torch.bfloat16)
    # None off dst, a tensor on dst
    call = _call("gather", shape=(3,), dim=0, dst=1)
    inputs = reference.all_inputs(call, world, dtype, 7, "cpu")
    assert reference.expected(call, inputs, 0, world)[0]["out"] is None
    assert "where None is right" in reference.compare(torch.zeros(6), None, None, world, dtype)
    assert "returned None where a tensor of shape (6,) is right" in \
        reference.compare(None, reference.expected(call, inputs, 1, world)[0]["out"], None, world, dtype)


def test_inputs_are_deterministic_per_rank_and_laid_out_as_asked():
    call = _call("all_gather", shape=(6, 7), dim=-1, layout="transposed")
    a = reference.make_input(call, 1, torch.float16, 3, "cpu")
    b = reference.make_input(call, 1, torch.float16, 3, "cpu")
    assert torch.equal(a, b) and not a.is_contiguous() and a.shape == (6, 7)
    assert not torch.equal(a, reference.make_input(call, 0, torch.float16, 3, "cpu"))
    strided = reference.make_input(_call("all_reduce", shape=(3, 9), layout="strided"), 0, torch.float32, 3, "cpu")
    assert strided.shape == (3, 9) and strided.stride() == (18, 2)
    v = _call("all_gatherv", shape=(5, 4), dim=0, sizes=[1, 3])
    assert [reference.make_input(v, r, torch.float32, 3, "cpu").shape[0] for r in (0, 1)] == [1, 3]


def test_reference_communicator_refuses_bad_arguments_by_name():
    with pytest.raises(CommunicatorError, match=r"all_gather: dim=3 is out of range for a tensor of shape \(2, 3\)"):
        ReferenceCommunicator._dim(torch.zeros(2, 3), 3, "all_gather")
    comm = object.__new__(ReferenceCommunicator)
    comm.world_size, comm.rank_in_group = 2, 0
    with pytest.raises(CommunicatorError, match=r"reduce_scatter: size 5 along dim 0 is not divisible by the world"):
        comm._sizes(torch.zeros(5), 0, None, "reduce_scatter", total=5)
    with pytest.raises(CommunicatorError, match=r"reduce_scatterv: sizes=\[1, 2\] add up to 3, not the input's size 5"):
        comm._sizes(torch.zeros(5), 0, [1, 2], "reduce_scatterv", total=5)
    with pytest.raises(CommunicatorError, match=r"all_gatherv: sizes\[0\]=2 is not this rank's size 3"):
        comm._sizes(torch.zeros(3), 0, [2, 2], "all_gatherv")
    comm._destroyed = True
    comm.unique_name = "tp:0"
    with pytest.raises(RuntimeError, match=r"ReferenceCommunicator.all_reduce on group 'tp:0' after destroy\(\)"):
        comm.all_reduce(torch.zeros(2))


class _ListGather:
    """An in-process stand-in for one rank's communicator: all_gatherv over every rank's inputs, with a fault."""

    def __init__(self, inputs, fault=None):
        self.inputs, self.fault = inputs, fault

    def all_gatherv(self, input_, dim=0, sizes=None):
        parts = [torch.cat([x[k] for x in self.inputs], dim=dim) for k in range(len(input_))]
        if self.fault == "first only":
            return parts[0]
        if self.fault == "swapped":
            return parts[::-1]
        return parts


@pytest.mark.parametrize("fault, said", [
    (None, None),
    ("first only", "rank 1: given a list of 2 tensors, returned a Tensor where a list of 2 gathered tensors is right"),
    ("swapped", "rank 1: the result's tensor 0: returned shape (6, 7), expected (6, 6)"),
])
def test_all_gatherv_of_a_list_gathers_each_tensor(fault, said):
    from conformance.checks.collective import run_call

    call = next(c for c in cases.calls_of("all_gatherv", 2, "standard", "float32") if c.get("parts"))
    assert "a list of 2 tensors" in cases.describe(call, "float32")
    spec = {"dtype": "float32", "seed": 7, "mode": "values"}
    inputs = reference.all_inputs(call, 2, torch.float32, 7, "cpu")
    got = run_call.run(_ListGather(inputs, fault), call, 1, 2, spec, "cpu", {})
    assert got == said if said is None else got.startswith(said)
