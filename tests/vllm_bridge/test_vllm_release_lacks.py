"""What an older vLLM release lacks is NOT_SUPPORTED naming the release, never dropped or ERROR (issue 43).

The attention adapter passes vLLM's validate_configuration only the selector flags the installed release takes (a
flag it lacks that a case sets answers a reason naming the release), and `within_vllm` grades the bridge's
`ReleaseLacks` (a layer an older release cannot build) NOT_SUPPORTED. Tested with stand-in backends and signatures
and a patched installed version, so any vLLM (or none, for the checks' part) will do.
"""

from __future__ import annotations

import collections
import types

import pytest
import torch

from conformance.checks.common import KernelRaised, Verdict, within_vllm
from conformance.collect.releases import ReleaseLacks, release_lacks
from conformance.results.result import Outcome
from conformance.vllm import attention_bridge, discover
from conformance.vllm.attention_bridge import BridgedBackend, split_flags, validate_parameters


class Backend029:
    """validate_configuration as vLLM 0.29 has it: use_dcp, no use_rswa."""

    calls: list = []

    @classmethod
    def validate_configuration(cls, head_size, dtype, kv_cache_dtype, block_size, use_mla, has_sink, use_sparse,
                               use_mm_prefix, use_per_head_quant_scales, device_capability, attn_type,
                               use_dcp=False):
        cls.calls.append({"head_size": head_size, "use_dcp": use_dcp})
        return []


class BackendAnyFlags:
    @classmethod
    def validate_configuration(cls, *args, **flags):
        return [f"saw {sorted(flags)}"]


@pytest.fixture
def release_029(monkeypatch):
    monkeypatch.setattr(discover, "installed_version", lambda: "0.29.0")
    Backend029.calls = []
    return type("Bridged029", (BridgedBackend,), {"vllm_backend": Backend029})


def ask(adapter, **flags):
    return adapter.validate_configuration(64, torch.float32, "auto", 16, device_capability=(0, 0), **flags)


def test_a_flag_the_release_lacks_and_the_case_sets_is_a_reason_naming_the_release(release_029):
    reasons = ask(release_029, use_dcp=False, use_rswa=True)
    assert len(reasons) == 1
    assert "vLLM 0.29.0 lacks the attention selector flag use_rswa" in reasons[0]
    assert "vLLM 0.30 added it" in reasons[0]
    assert Backend029.calls == []   # never asked as if the flag were off


def test_a_flag_the_release_lacks_left_off_is_not_passed(release_029):
    assert ask(release_029, use_dcp=True, use_rswa=False) == []
    assert Backend029.calls == [{"head_size": 64, "use_dcp": True}]


def test_a_flag_no_release_table_knows_is_named_as_a_later_release(release_029):
    (reason,) = ask(release_029, use_future=True)
    assert "use_future" in reason and "a later vLLM release has it" in reason


def test_signature_read_once_and_var_keyword_takes_every_flag():
    assert validate_parameters(Backend029) is validate_parameters(Backend029)
    assert "use_dcp" in validate_parameters(Backend029) and "use_rswa" not in validate_parameters(Backend029)
    assert validate_parameters(BackendAnyFlags) is None
    assert split_flags(BackendAnyFlags, {"use_rswa": True}) == ({"use_rswa": True}, [])


def test_selector_config_with_a_set_flag_the_release_lacks_raises_naming_it(monkeypatch):
    import vllm.v1.attention.selector as selector

    fields = [f for f in selector.AttentionSelectorConfig._fields if f not in ("use_dcp", "use_rswa")]
    old = collections.namedtuple("AttentionSelectorConfig", fields, defaults=[None] * len(fields))
    monkeypatch.setattr(selector, "AttentionSelectorConfig", old)
    monkeypatch.setattr(discover, "installed_version", lambda: "0.28.0")
    from reference_impl.attention.backend import AttentionSelectorConfig as Ours

    base = dict(head_size=64, dtype=torch.float32, kv_cache_dtype="auto", block_size=16)
    converted = attention_bridge.vllm_selector_config(Ours(**base))
    assert "use_dcp" not in converted._fields
    with pytest.raises(ReleaseLacks, match=r"vLLM 0\.28\.0 lacks the attention selector flag use_dcp .*0\.29"):
        attention_bridge.vllm_selector_config(Ours(**base, use_dcp=True))


# ----- within_vllm -----------------------------------------------------------------------------------------------
CASE = types.SimpleNamespace(name="bf16_weight", beyond_vllm=None)


def raising(exc):
    def body():
        raise KernelRaised("constructing vllm:LayerNorm", exc)
    return body


def test_within_vllm_grades_release_lacks_not_supported_naming_the_release():
    lacks = ReleaseLacks("vLLM", "0.31.0", "dtype=torch.bfloat16 in LayerNorm", "0.32")
    verdict = within_vllm(CASE, raising(lacks))
    assert verdict.outcome is Outcome.NOT_SUPPORTED
    assert "vLLM 0.31.0 lacks dtype=torch.bfloat16" in verdict.message and "bf16_weight" in verdict.message


def test_within_vllm_finds_release_lacks_raised_from_inside_another_exception():
    try:
        try:
            raise ReleaseLacks("vLLM", "0.30.0", "x", "0.32")
        except ReleaseLacks as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        wrapped = outer
    assert release_lacks(wrapped) is wrapped.__cause__
    assert within_vllm(CASE, raising(wrapped)).outcome is Outcome.NOT_SUPPORTED


def test_within_vllm_leaves_other_raises_to_the_harness_as_errors():
    with pytest.raises(KernelRaised):
        within_vllm(CASE, raising(NotImplementedError("the kernel refuses bf16")))


def test_within_vllm_keeps_a_body_verdict():
    verdict = Verdict(Outcome.PASS, None)
    assert within_vllm(CASE, lambda: verdict) is verdict


def test_every_family_grades_release_lacks_not_supported(monkeypatch):
    """run_unit, the one place a check's raise becomes a verdict: a ReleaseLacks out of any family's check (the compile
    family building vLLM 0.28's LayerNorm in float16, which does not go through within_vllm) is NOT_SUPPORTED naming
    the release, not ERROR; any other raise stays an ERROR."""
    import conformance.checks as checks
    from conformance.collect.units import Unit

    lacks = ReleaseLacks("vLLM", "0.28.0", "dtype=torch.float16 in LayerNorm", "0.32")
    unit = Unit("compile", "layer_compile", "layer_norm", "vllm:LayerNorm", "float16", None)
    monkeypatch.setattr(checks, "registry", lambda: {"compile.layer_compile": lambda ctx, u: raising(lacks)()})
    verdict, _ = checks.run_unit(None, unit)
    assert verdict.outcome is Outcome.NOT_SUPPORTED and "vLLM 0.28.0 lacks dtype=torch.float16" in verdict.message
    monkeypatch.setattr(checks, "registry",
                        lambda: {"compile.layer_compile": lambda ctx, u: raising(RuntimeError("broken"))()})
    assert checks.run_unit(None, unit)[0].outcome is Outcome.ERROR
