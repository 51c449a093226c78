"""The engine family with tensor parallelism on platforms written against our API: the reference runtime on 2 gloo
ranks, its tensor-parallel group's collectives through the platform's device communicator. On the cpu platform
(the reference communicator) Llama matches the float64 oracle and both ranks agree; a plugin whose communicator
leaves all_reduce's remainder unreduced FAILs against the oracle, and one whose rank 1 gathers the ranks' parts in
reverse order FAILs naming rank 1 (the ranks then generate different tokens)."""

from __future__ import annotations

import os

import pytest

from _dist import make_distribution
from conformance.checks import engine
from conformance.checks.common import CheckContext
from conformance.collect.units import Unit
from conformance.results.result import Outcome

PLUGIN = {
    "tp_faults.__init__": "",
    "tp_faults.comm": """
        import torch
        import torch.distributed as dist
        from reference_impl.distributed.communicator import ReferenceCommunicator


        class RemainderCommunicator(ReferenceCommunicator):
            # all_reduce leaves the last numel % world elements of each row block unreduced
            def all_reduce(self, input_):
                flat = input_.contiguous().flatten().clone()
                whole = flat.numel() - flat.numel() % (self.world_size * 3)
                if whole:
                    head = flat[:whole]
                    dist.all_reduce(head, group=self.device_group)
                return flat.view(input_.shape)


        class SwappingCommunicator(ReferenceCommunicator):
            # rank 1's all_gather puts the ranks' parts in reverse order
            def all_gather(self, input_, dim=-1):
                if self.rank_in_group != 1:
                    return super().all_gather(input_, dim)
                return torch.cat(self._gather_parts(input_)[::-1], dim=dim)
        """,
    "tp_faults.platforms": """
        from reference_impl.platforms.builtin import CpuPlatform


        class RemainderPlatform(CpuPlatform):
            device_name = "remainder"

            def get_device_communicator_cls(self):
                return "tp_faults.comm.RemainderCommunicator"


        class SwappingPlatform(CpuPlatform):
            device_name = "swapping"

            def get_device_communicator_cls(self):
                return "tp_faults.comm.SwappingCommunicator"


        def register_remainder():
            return "tp_faults.platforms.RemainderPlatform"


        def register_swapping():
            return "tp_faults.platforms.SwappingPlatform"
        """,
}


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    root = make_distribution(tmp_path_factory.mktemp("tp_faults"), "tp-faults", PLUGIN, {
        "reference_impl.platform_plugins": {"tp_remainder": "tp_faults.platforms:register_remainder",
                                             "tp_swapping": "tp_faults.platforms:register_swapping"}})
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    mp.delenv("REFERENCE_IMPL_PLUGINS", raising=False)
    yield root
    mp.undo()


def _tp(platform_name: str):
    from reference_impl.platforms.builtin import CpuPlatform

    ctx = CheckContext(platform_name, CpuPlatform())     # the ranks activate `platform_name` themselves
    return engine.generate(ctx, Unit("engine", "generate", "llama", None, "float32", engine.TP_CASE))


def test_tp2_on_the_cpu_platform_matches_the_oracle_and_the_ranks_agree():
    v = _tp("cpu")
    assert v.outcome is Outcome.PASS, v.message
    assert "all 2 ranks generated the same tokens" in v.message
    assert "tensor parallelism over 2 gloo ranks" in v.message
    assert "the TP group's communicator: reference_impl.distributed.communicator.ReferenceCommunicator" in v.message


def test_a_communicator_that_leaves_sums_unreduced_fails_against_the_oracle(plugin_path):
    v = _tp("tp_remainder")
    assert v.outcome is Outcome.FAIL, v.message
    assert v.message.startswith("the runtime with tensor parallelism leaves the float64 reference"), v.message
    assert "the TP group's communicator: tp_faults.comm.RemainderCommunicator" in v.message


def test_ranks_that_disagree_are_named(plugin_path):
    v = _tp("tp_swapping")
    assert v.outcome is Outcome.FAIL, v.message
    assert v.message.startswith("the ranks disagree: rank 1 generated other tokens than rank 0 for request "), v.message
    assert "tp_faults.comm.SwappingCommunicator" in v.message
