"""The sampling family's `stops` engine case (conformance/checks/sampling/stops.py): vLLM's rules for min_tokens,
stop_token_ids and bad_words, the word-level tokenizer written beside the checkpoint, and the grading of synthetic
engine answers: a correct answer passes, and each planted fault fails naming the parameter, the request and the
step (no vLLM runs here)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from conformance.checks.sampling import engine as E
from conformance.checks.sampling import stop_rules, stops, tokenizer
from conformance.results.result import Outcome

TOL = 0.0018
VOCAB = 16


# ----- the tokenizer ------------------------------------------------------------------------------------------
def test_the_written_tokenizer_reads_words_as_their_ids_in_tokenizers_and_transformers(tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tokenizer.write_tokenizer(tmp_path, 64)
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(str(tmp_path))
    for text in ("w17 w42", " w17", "w63", "w3 w3 w9"):
        want = tokenizer.encode(text, 64)
        assert raw.encode(text, add_special_tokens=False).ids == want
        assert auto.encode(text, add_special_tokens=False) == want
    assert auto.eos_token_id == tokenizer.EOS_ID and auto.bos_token_id == 1 and len(auto) == 64


def test_the_tokenizer_refuses_what_it_cannot_write_or_read():
    with pytest.raises(ValueError, match=r"token ids \[2\] are special tokens"):
        tokenizer.words([5, 2])
    with pytest.raises(ValueError, match=r"'w64' is not a word of the tokenizer \(w3 to w63\)"):
        tokenizer.encode("w5 w64", 64)
    with pytest.raises(ValueError, match="no room for words"):
        tokenizer.write_tokenizer("/nonexistent-never-written", 3)


# ----- vLLM's rules -------------------------------------------------------------------------------------------
def test_a_bad_word_bans_its_last_token_only_after_its_first_tokens_were_generated():
    bad = [[5], [7, 8], [3, 4, 9]]
    assert stop_rules.bad_word_bans(bad, []) == {5: [5]}          # two-token words cannot bite at the first step
    assert stop_rules.bad_word_bans(bad, [7]) == {5: [5], 8: [7, 8]}
    assert stop_rules.bad_word_bans(bad, [7, 6]) == {5: [5]}
    assert stop_rules.bad_word_bans(bad, [1, 3, 4]) == {5: [5], 9: [3, 4, 9]}


def test_min_tokens_masks_the_stop_tokens_and_the_models_eos_until_it_is_reached():
    r = E.Req(0, [1], 6, {"min_tokens": 2, "stop_token_ids": [7, 9]}, eos_ids=(2,))
    assert stop_rules.min_tokens_mask(r, []) == {2, 7, 9} == stop_rules.min_tokens_mask(r, [4])
    assert stop_rules.min_tokens_mask(r, [4, 5]) == set()
    bad = E.Req(0, [1], 6, {"bad_words": [" w5", "w7 w8"]})
    assert stop_rules.bad_words_ids(bad.sampling, VOCAB) == [[5], [7, 8]]
    assert stop_rules.masked(bad, [7], VOCAB) == {5, 8}


# ----- grading synthetic answers ------------------------------------------------------------------------------
def _logits(steps, favour):
    """`[steps, VOCAB]` float64 logits with token `favour[step]` (one id, or ids in order of preference) far ahead."""
    raw = torch.randn((steps, VOCAB), generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    for step, toks in favour.items():
        for rank, tok in enumerate([toks] if isinstance(toks, int) else toks):
            raw[step, tok] += 10.0 - 4 * rank
    return raw


def _answer(r, raw, masks=True, pick=None, keep_going=False):
    """A greedy engine answer: the argmax of vLLM's processed logits (without min_tokens and bad_words when `masks`
    is off; `pick(step)` overriding a step), a stop token ending it (also before min_tokens when the masks are off,
    as vLLM 0.32's check_stop does) unless `keep_going`."""
    plain = r if masks else stops._unmasked(r)
    halt = set(r.sampling.get("stop_token_ids") or ())
    tokens, steps = [], []
    for step in range(r.max_tokens):
        lp = E.processed(plain, raw[step], tokens).log_softmax(0)
        tok = (pick or {}).get(step, int(lp.argmax()))
        top = lp.topk(5)
        steps.append([[tok, float(lp[tok])]] + [[int(i), float(v)] for i, v in zip(top.indices, top.values)])
        tokens.append(tok)
        if tok in halt and not keep_going and (len(tokens) > r.sampling.get("min_tokens", 0) or not masks):
            return {"tokens": tokens, "logprobs": steps, "finish_reason": "stop", "stop_reason": tok}
    return {"tokens": tokens, "logprobs": steps, "finish_reason": "length", "stop_reason": None}


def _grade(r, raw, got):
    return stops.grade([r], {r.id: got}, {r.id: raw}, TOL)


MIN_REQ = E.Req(0, [5, 6], 6, {"temperature": 0.0, "min_tokens": 3, "stop_token_ids": [7]}, eos_ids=(2,))
MIN_RAW = _logits(6, {0: 7, 1: 7, 2: 7, 3: 7})


def test_a_correct_min_tokens_answer_passes_and_its_stop_token_ends_it_after_min_tokens():
    got = _answer(MIN_REQ, MIN_RAW)
    assert got["tokens"][-1] == 7 and len(got["tokens"]) == 4
    assert _grade(MIN_REQ, MIN_RAW, got) == []
    assert stops.bites(MIN_REQ, got["tokens"], MIN_RAW, TOL)["min_tokens"] == 3


def test_an_engine_ignoring_min_tokens_fails_naming_min_tokens_the_request_and_the_step():
    lines = _grade(MIN_REQ, MIN_RAW, _answer(MIN_REQ, MIN_RAW, masks=False))
    assert len(lines) == 1 and lines[0].startswith("min_tokens=3: request 0 (temperature=0.0, min_tokens=3")
    assert "step 0: generated stop token 7" in lines[0] and "[2, 7]" in lines[0]


def test_a_stop_token_logprob_left_finite_before_min_tokens_fails_naming_min_tokens():
    got = _answer(MIN_REQ, MIN_RAW)
    got["logprobs"][1].append([7, -0.5])
    lines = _grade(MIN_REQ, MIN_RAW, got)
    assert lines and lines[0].startswith("min_tokens=3: request 0") and "step 1" in lines[0]
    assert "the processed logprob of token 7 is -0.5000 where vLLM masks it" in lines[0]


def test_a_stop_token_that_does_not_end_the_request_fails_naming_stop_token_ids():
    lines = _grade(MIN_REQ, MIN_RAW, _answer(MIN_REQ, MIN_RAW, keep_going=True))
    assert lines and lines[0].startswith("stop_token_ids: request 0") and "step 3: generated stop token 7" in lines[0]
    assert "went on to 6 tokens" in lines[0]


def test_a_request_ending_early_without_a_stop_token_fails():
    got = _answer(MIN_REQ, MIN_RAW)
    for key in ("tokens", "logprobs"):
        got[key] = got[key][:2]
    got["finish_reason"] = "length"
    lines = _grade(MIN_REQ, MIN_RAW, got)
    assert lines and lines[0].startswith("stop_token_ids: request 0") and "ended after 2 of max_tokens 6" in lines[0]


BAD_REQ = E.Req(3, [4, 9], 5, {"temperature": 0.0, "bad_words": ["w11", "w12 w13", "w9 w10"]})
BAD_RAW = _logits(5, {0: (11, 10), 1: 12, 2: 13, 3: 11})


def test_a_correct_bad_words_answer_passes():
    got = _answer(BAD_REQ, BAD_RAW, pick={0: 10})   # the argmax after banning w11: w10, which 'w9 w10' never bans
    assert got == _answer(BAD_REQ, BAD_RAW) and got["tokens"][:2] == [10, 12] and got["tokens"][2] != 13
    assert _grade(BAD_REQ, BAD_RAW, got) == []
    assert stops.bites(BAD_REQ, got["tokens"], BAD_RAW, TOL)["bad_words"] == 3


@pytest.mark.parametrize("pick, step, says", [
    ({0: 11}, 0, "generated token 11, which is the bad word 'w11'"),
    ({2: 13}, 2, "generated token 13, which after [12] completes the bad word 'w12 w13'"),
])
def test_a_generated_bad_word_fails_naming_bad_words_the_request_and_the_step(pick, step, says):
    lines = _grade(BAD_REQ, BAD_RAW, _answer(BAD_REQ, BAD_RAW, pick=pick))
    assert lines and lines[0].startswith(f"bad_words: request 3 (temperature=0.0, bad_words=['w11', 'w12 w13', "
                                         f"'w9 w10']; prompt of 2 tokens), step {step}: {says}")


def test_a_bad_word_matched_against_the_prompt_fails_and_says_vllm_matches_generated_tokens_only():
    second = int(E.processed(BAD_REQ, BAD_RAW[0], []).topk(2).indices[1])
    lines = _grade(BAD_REQ, BAD_RAW, _answer(BAD_REQ, BAD_RAW, pick={0: second}))
    assert lines and f"greedy token {second} where the oracle's argmax" in lines[0] and "is 10" in lines[0]
    assert "bad_words: the oracle's token 10 ends a bad word" in lines[0] and "never the prompt" in lines[0]


def test_two_tokens_within_the_slack_of_the_kth_value_may_take_its_one_place_with_their_own_logprob():
    x = torch.tensor([5.0, 4.0, 3.0, 2.9995, -4.0], dtype=torch.float64)
    r = E.Req(0, [0], 1, {"temperature": 1.0, "top_k": 3, "seed": 1})
    keep, low, high = E.step_bounds(r, x, TOL)
    engine = x[:3].log_softmax(0)        # the engine kept token 2, not 3
    assert float(low[2]) - TOL <= float(engine[2]) <= float(high[2]) + TOL
    assert float(low[0]) - TOL <= float(engine[0]) <= float(high[0]) + TOL
    assert high[4] == -math.inf


# ----- the check, with an engine that is the oracle -----------------------------------------------------------
class _OracleEngine:
    """A platform lending an engine that answers every request with the oracle's choice (the argmax of vLLM's
    processed logits), or one that ignores min_tokens and bad_words."""

    device_type = "cpu"

    def __init__(self, masks: bool):
        self.masks = masks

    def conformance_sampling_engine(self, workdir):
        outer = self

        class Proc:
            def run(self, runs, timeout):
                run = runs[0]
                assert run["tokenizer"] is True
                last = stops.reference(run["model"])
                eos = stops.model_eos_ids(run["model"])
                answers = []
                for q in run["waves"][0]:
                    r = E.Req(q["id"], q["prompt"], q["max_tokens"], q["sampling"], eos)
                    answers.append(dict(_oracle_answer(r, last, outer.masks), id=r.id))
                return {"runs": [{"waves": [answers], "facts": {"platform": "Oracle"}}]}

        return contextlib.nullcontext(Proc())


def _oracle_answer(r, last, masks):
    plain = r if masks else stops._unmasked(r)
    halt = set(r.sampling.get("stop_token_ids") or ())
    tokens, steps = [], []
    while len(tokens) < r.max_tokens:
        x = E.processed(plain, last(r.prompt + tokens), tokens)
        lp = E.step_bounds(plain, x, 0.0)[1]
        tok = int(lp.argmax())
        top = lp.topk(5)
        steps.append([[tok, float(lp[tok])]] + [[int(i), float(v)] for i, v in zip(top.indices, top.values)])
        tokens.append(tok)
        if tok in halt and (len(tokens) > r.sampling.get("min_tokens", 0) or not masks):
            break
    return {"tokens": tokens, "logprobs": steps, "finish_reason": "stop" if tokens[-1] in halt else "length"}


@pytest.mark.parametrize("masks", [True, False])
def test_the_stops_unit_passes_the_oracle_and_fails_an_engine_ignoring_the_parameters(masks):
    from conformance.checks.common import CheckContext
    from conformance.checks.sampling.engine import MODEL, engine
    from conformance.collect.units import Unit

    verdict = engine(CheckContext("vllm", _OracleEngine(masks)), Unit("sampling", "engine", MODEL, None, "float32",
                                                                        "stops"))
    if masks:
        assert verdict.outcome == Outcome.PASS, verdict.message
        assert "a stop token after min_tokens ended request 0" in verdict.message
        assert "(the case did not bite)" not in verdict.message
    else:
        assert verdict.outcome == Outcome.FAIL
        assert verdict.message.startswith("min_tokens=3: request 0") and "step 0" in verdict.message
        assert "2 more requests wrong" in verdict.message
