"""The engine units' oracle (conformance/checks/sampling/engine.py): vLLM's order of processing on float64 logits,
judged on synthetic engine answers (no engine runs here)."""

from __future__ import annotations

import math

import pytest
import torch

from conformance.checks.sampling import engine as E
from conformance.results.result import Outcome


def req(**sampling):
    return E.Req(0, [1, 2, 2], 3, sampling)


def test_processed_applies_allowed_tokens_bias_and_penalties_in_vllms_order():
    raw = torch.tensor([2.0, -1.0, 0.5, 3.0, 1.0], dtype=torch.float64)
    r = req(temperature=0.0, allowed_token_ids=[0, 1, 2, 3], logit_bias={"3": -1.0}, repetition_penalty=2.0,
            frequency_penalty=0.5, presence_penalty=0.25)
    x = E.processed(r, raw, so_far=[1, 1])
    # token 4 not allowed; token 3 biased to 2.0; tokens 1, 2 seen (prompt 1, 2; output 1 twice): 1 -> -1*2 - 1 - .25,
    # 2 -> 0.5 / 2; token 0 unseen
    assert x.tolist() == pytest.approx([2.0, -3.25, 0.25, 2.0, -math.inf])


def answer(r, raw, temperature_first=True):
    """An engine answer for one step computed like vLLM (or with the temperature after top-p)."""
    x = E.processed(r, raw, [])
    s = r.sampling
    t = x / s["temperature"] if temperature_first else x
    probs = t.softmax(0)
    order = probs.argsort(descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    mass = 0.0
    for i in order.tolist():
        keep[i] = True
        mass += float(probs[i])
        if mass >= s["top_p"]:
            break
    t = t if temperature_first else t / s["temperature"]
    lp = t.masked_fill(~keep, -math.inf).log_softmax(0)
    top = lp.topk(3)
    tok = int(top.indices[0])
    return {"tokens": [tok], "logprobs": [[[int(i), float(v)] for i, v in zip(top.indices, top.values)]]}


def test_grade_batch_passes_vllms_order_and_fails_temperature_after_top_p():
    gen = torch.Generator().manual_seed(0)
    raw = torch.randn(64, generator=gen, dtype=torch.float64) * 2
    r = E.Req(0, [5], 1, {"temperature": 0.5, "top_p": 0.6, "seed": 1})
    assert E.grade_batch([r], {0: answer(r, raw)}, {0: raw.unsqueeze(0)}, 0.0018) == []
    wrong = E.grade_batch([r], {0: answer(r, raw, temperature_first=False)}, {0: raw.unsqueeze(0)}, 0.0018)
    assert len(wrong) == 1 and wrong[0].startswith("request 0 (temperature=0.5, top_p=0.6, seed=1;")
    assert "step 0" in wrong[0]


def test_a_sampled_token_outside_the_kept_set_fails_naming_it():
    raw = torch.tensor([5.0, 4.0, -3.0, -4.0], dtype=torch.float64)
    r = E.Req(2, [0], 1, {"temperature": 1.0, "top_k": 2, "seed": 3})
    got = {"tokens": [3], "logprobs": [[[3, -2.0]]]}
    lines = E.grade_batch([r], {2: got}, {2: raw.unsqueeze(0)}, 0.0018)
    assert lines and "sampled token 3, which vLLM's order of processing drops" in lines[0]


def test_a_token_within_the_tolerance_of_the_kth_value_may_go_either_way():
    raw = torch.tensor([5.0, 4.0, 3.9995, -4.0], dtype=torch.float64)
    r = E.Req(0, [0], 1, {"temperature": 1.0, "top_k": 2, "seed": 3})
    keep, low, high = E.step_bounds(r, E.processed(r, raw[:], []), 0.0018)
    assert keep.state.tolist()[1:3] == [-1, -1] and keep.state.tolist()[3] == 0


class _EngineRaisingAtWave:
    """A platform lending an engine whose n-gram run raises at the given wave (0: the greedy requests)."""

    device_type = "cpu"

    def __init__(self, wave: int):
        self.wave = wave

    def conformance_sampling_engine(self, workdir):
        import contextlib

        outer = self

        class Proc:
            def run(self, runs, timeout):
                waves = [[{"id": r["id"], "tokens": [], "logprobs": []} for r in w] for w in runs[0]["waves"]]
                return {"runs": [{"waves": waves[:outer.wave], "facts": {"platform": "Fake"},
                                  "wave_error": {"error": "TypeError: boom", "traceback": "", "wave": outer.wave}}]}

        return contextlib.nullcontext(Proc())


@pytest.mark.parametrize("wave, names", [(0, "before any answer, with the greedy requests (0, 1, 2)"),
                                         (1, "; then, with the sampled request (3)")])
def test_an_ngram_engine_that_raises_names_the_wave_that_raised(wave, names):
    from conformance.checks.common import CheckContext
    from conformance.checks.sampling.engine import MODEL, engine
    from conformance.collect.units import Unit

    verdict = engine(CheckContext("vllm", _EngineRaisingAtWave(wave)),
                     Unit("sampling", "engine", MODEL, None, "float32", "ngram"))
    assert verdict.outcome == Outcome.ERROR
    assert names in verdict.message and "TypeError: boom" in verdict.message
