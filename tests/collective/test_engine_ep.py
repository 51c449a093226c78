"""The engine family with expert parallelism (case `eager,tp=2,ep`, full level) on platforms written against our API:
the reference runtime on 2 gloo ranks with tensor parallelism and expert parallelism over the same ranks, each MoE
layer holding half the experts, their parts summed by the tensor-parallel group's one all_reduce through the
platform's device communicator (as vLLM's MoE runner sums them with data parallelism 1), the expert-parallel group's
communicator built as "ep:0".

On the cpu platform (the reference communicator) Mixtral matches the float64 oracle and both ranks agree. The planted
faults act only once the process has built an expert-parallel communicator, as a vendor communicator switches to its
expert-parallel path: one has rank 0's all_reduce drop rank 1's part, which the EP unit FAILs against the oracle (the
plugin's TP unit, with no "ep" group, would pass: the TP case cannot find it); the other has rank 1's all_gather reverse the ranks' parts, so the
ranks generate different tokens: the FAIL names rank 1 and, grading each rank on its own tokens, says rank 0 matches
the reference and rank 1 leaves it. (A communicator that reduces every sum twice is not among them: doubling every
all_reduce doubles the whole residual stream, which the RMSNorms take out, so the tokens and logprobs do not change;
vllm-ascend #6710's second reduction showed because it hit the MoE output only.) About 15 to 30 s per 2-rank unit on
a loaded 2-core machine (3 units). Under the bridge vLLM 0.32's CPU worker segfaults in its fused-MoE kernel and the
engine raises only "cancelled": the last tests check that the ERROR says the worker's death and where it segfaulted,
from the engine log's lines (no engine is started here).
"""

from __future__ import annotations

import os

import pytest

from _dist import make_distribution
from conformance.checks import engine
from conformance.checks.common import CheckContext
from conformance.collect.units import Unit
from conformance.results.result import Outcome

PLUGIN = {
    "ep_faults.__init__": "",
    "ep_faults.comm": """
        import torch
        from reference_impl.distributed.communicator import ReferenceCommunicator


        class ExpertParallelAware(ReferenceCommunicator):
            # True once this process has built its expert-parallel communicator (unique_name "ep:...")
            expert_parallel = False

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                if self.is_ep_communicator:
                    ExpertParallelAware.expert_parallel = True


        class SwappingCommunicator(ExpertParallelAware):
            # under expert parallelism rank 1's all_gather puts the ranks' parts in reverse order
            def all_gather(self, input_, dim=-1):
                if not ExpertParallelAware.expert_parallel or self.rank_in_group != 1:
                    return super().all_gather(input_, dim)
                return torch.cat(self._gather_parts(input_)[::-1], dim=dim)


        class DroppingCommunicator(ExpertParallelAware):
            # under expert parallelism rank 0 keeps its own part and drops rank 1's (rank 1 gets the sum)
            def all_reduce(self, input_):
                total = super().all_reduce(input_)
                if ExpertParallelAware.expert_parallel and self.rank_in_group == 0:
                    return input_.clone()
                return total
        """,
    "ep_faults.platforms": """
        from reference_impl.platforms.builtin import CpuPlatform


        class SwappingPlatform(CpuPlatform):
            device_name = "swapping"

            def get_device_communicator_cls(self):
                return "ep_faults.comm.SwappingCommunicator"


        class DroppingPlatform(CpuPlatform):
            device_name = "dropping"

            def get_device_communicator_cls(self):
                return "ep_faults.comm.DroppingCommunicator"


        def register_swapping():
            return "ep_faults.platforms.SwappingPlatform"


        def register_dropping():
            return "ep_faults.platforms.DroppingPlatform"
        """,
}


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    root = make_distribution(tmp_path_factory.mktemp("ep_faults"), "ep-faults", PLUGIN, {
        "reference_impl.platform_plugins": {"ep_swapping": "ep_faults.platforms:register_swapping",
                                             "ep_dropping": "ep_faults.platforms:register_dropping"}})
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    mp.delenv("REFERENCE_IMPL_PLUGINS", raising=False)
    yield root
    mp.undo()


def _run(platform_name: str, model: str = "mixtral", case: str = engine.EP_CASE):
    from reference_impl.platforms.builtin import CpuPlatform

    ctx = CheckContext(platform_name, CpuPlatform())     # the ranks activate `platform_name` themselves
    return engine.generate(ctx, Unit("engine", "generate", model, None, "float32", case))


def test_ep_on_the_cpu_platform_matches_the_oracle_and_says_who_holds_which_experts():
    v = _run("cpu")
    assert v.outcome is Outcome.PASS, v.message
    assert "all 2 ranks generated the same tokens" in v.message
    assert "tensor parallelism over 2 gloo ranks and expert parallelism over the same ranks" in v.message
    assert "the EP group's too (built as ep:0); experts held: rank 0 experts 0-1; rank 1 experts 2-3" in v.message


def test_a_rank_that_drops_the_other_ranks_part_fails_against_the_oracle(plugin_path):
    v = _run("ep_dropping")
    assert v.outcome is Outcome.FAIL, v.message
    assert v.message.startswith("the runtime with tensor and expert parallelism leaves the float64 reference"), \
        v.message
    assert "every rank generated the same tokens): mixtral: request " in v.message    # the logits are gathered
    assert "the TP group's communicator: ep_faults.comm.DroppingCommunicator" in v.message


def test_ranks_that_disagree_are_named_with_the_one_that_leaves_the_reference(plugin_path):
    v = _run("ep_swapping")
    assert v.outcome is Outcome.FAIL, v.message
    assert v.message.startswith("the ranks disagree: rank 1 generated other tokens than rank 0 for request "), \
        v.message
    # once the tokens differ the collectives mix the ranks' states, so rank 0 follows a step later: the first is named
    assert "each rank against the float64 reference (logprob tolerance 0.0018): rank 0 leaves it: request " in v.message
    assert "; the first to leave it on request 0: rank 1, at step 0 [" in v.message, v.message
    assert "ep_faults.comm.SwappingCommunicator" in v.message


def test_the_ep_case_needs_a_moe_model():
    v = _run("cpu", "llama")
    assert v.outcome is Outcome.ERROR
    assert v.message == ("engine case 'eager,tp=2,ep' is expert parallelism: model 'llama' has no experts (the MoE "
                         "models: gpt_oss, mixtral)")


# ----- under the bridge: a rank's worker that dies ----------------------------------------------------
# vLLM 0.32's CPU engine with tensor_parallel_size=2 and enable_expert_parallel on Mixtral: a worker segfaults in the
# CPU fused-MoE kernel and the engine raises only "RuntimeError: cancelled" (engine log, abridged)
VLLM_032_EP_LOG = """\
(MainProcess pid=400) WARNING 12-06 13:42:58 [base.py:413] Using None for EOS token id
!!!!!!! Segfault encountered !!!!!!!
  File "./signal/../sysdeps/unix/sysv/linux/x86_64/libc_sigaction.c", line 0, in 0x00007f371388b04f
  File "/tmp/vllm/csrc/cpu/cpu_fused_moe.cpp", line 242, in fused_moe_impl<float, float, cpu_micro_gemm::MicroGemm>
  File "/tmp/vllm/csrc/cpu/cpu_fused_moe.cpp", line 709, in operator()
(MainProcess pid=400) ERROR 12-06 13:43:06 [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly \
(exit code: -11), shutting down executor.
"""


def test_a_dead_worker_is_said_with_where_it_segfaulted():
    from conformance.vllm.worker_deaths import describe

    assert describe(VLLM_032_EP_LOG) == (
        "VllmWorker-0 died (exit code -11, SIGSEGV); a segfault, innermost frame: /tmp/vllm/csrc/cpu/"
        "cpu_fused_moe.cpp line 242, in fused_moe_impl<float, float, cpu_micro_gemm::MicroGemm>")
    assert describe("(MainProcess) ERROR Worker proc VllmWorker-1 died unexpectedly (exit code: 3), shutting down") \
        == "VllmWorker-1 died (exit code 3)"
    assert describe(VLLM_032_EP_LOG.split("(MainProcess pid=400) ERROR")[0]) == (   # logged before vLLM's line
        "a segfault, innermost frame: /tmp/vllm/csrc/cpu/cpu_fused_moe.cpp line 242, in fused_moe_impl<float, float, "
        "cpu_micro_gemm::MicroGemm>")
    assert describe("an engine that raised for another reason") is None


def test_a_dead_worker_reaches_the_verdict():
    """The engine's own raise ("cancelled", in vLLM's message queue) is the ERROR; the worker's death is said too."""
    import torch

    from conformance.checks.engine import ModelResult, _verdict

    report = {"name": "mixtral", "error": "RuntimeError: cancelled", "error_type": "RuntimeError",
              "error_message": "cancelled", "frames": [["vllm.distributed.device_communicators.shm_broadcast",
                                                        "MessageQueue.acquire_read"]],
              "platform": {"class": "vllm.platforms.cpu.CpuPlatform"},
              "worker_deaths": "VllmWorker-0 died (exit code -11, SIGSEGV); a segfault, innermost frame: x.cpp"}
    result = ModelResult("mixtral", {}, error="RuntimeError: cancelled\n", report=report)
    v = _verdict(None, result, {"vllm": "0.32.0"}, torch.float32,
                 Unit("engine", "generate", "mixtral", None, "float32", engine.EP_CASE))
    assert v.outcome is Outcome.ERROR
    assert v.message.startswith("vLLM's engine raised on model mixtral: RuntimeError: cancelled ("), v.message
    assert "; a worker process died: VllmWorker-0 died (exit code -11, SIGSEGV); a segfault, innermost frame: " \
           "x.cpp)" in v.message
    assert "enable_expert_parallel=True" in v.message
