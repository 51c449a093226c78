"""The sampling family's engine units: vLLM's engine on the platform (under `--platform=vllm`; the bridge's platform
lends `conformance_sampling_engine`, conformance/vllm/sampling_engine.py), the engine family's tiny Llama checkpoint
in float32, graded against the reference decoder in float64 teacher-forced on the engine's tokens.

- `batch`: one batch mixing greedy requests with requests that set temperature, top_k, top_p, min_p, repetition /
  frequency / presence penalties, logit_bias, allowed_token_ids and a seed, in `processed_logprobs` mode: at every
  generated position the returned logprobs (the sampled token's and the top 5) must be the oracle's after vLLM's order
  of processing (allowed tokens, logit bias, penalties on the prompt and the tokens so far, temperature, min-p, top-k,
  top-p), the sampled token inside the oracle's kept set and a greedy token the argmax where the margin binds; then a
  seeded request must draw the same tokens alone and in another batch.
- `stops` (stops.py, its own engine run so that one defect does not hide another): min_tokens with stop_token_ids
  and bad_words, with a word-level tokenizer written beside the checkpoint (tokenizer.py) so that vLLM tokenizes the
  bad words. Requests built from the oracle so the parameters bite; the same logprob grading with vLLM's masks
  (stop_rules.py: min_tokens masks the stop tokens and the model's EOS for the first min_tokens tokens, a bad word
  bans its last token only right after its other tokens were generated), then a generated stop token must end the
  request. A stop token before min_tokens, a generated bad word or a stop token the request goes on after FAILs
  naming the parameter, the request and the step.
- `ngram`: n-gram speculative decoding (prompt lookup, 3 draft tokens) on repetitive prompts: greedy requests must
  give the oracle's argmax wherever its margin binds (the non-speculative greedy output), and a sampled request only
  tokens of its kept set.

Every request runs with ignore_eos (the random checkpoint's EOS would end requests at random); min_tokens still masks
the EOS, as vLLM's all_stop_token_ids holds it either way. Not graded: stop strings (they need detokenization) and
a bad word whose space-prefixed encoding differs (the word-level tokenizer gives one encoding). On a platform
without vLLM's engine the family has no engine units.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from conformance.checks.common import CheckContext, Verdict, failed, passed
from conformance.checks.record import check
from conformance.checks.sampling.engine_oracle import (Req, _step_problem, grade_batch, oracle_logits, processed,
                                                       step_bounds)
from conformance.collect.units import Unit
from conformance.results.result import Outcome
from conformance import scratch_dirs

ENGINE_CASES = ("batch", "stops", "ngram")
MODEL = "llama"
JOB_TIMEOUT_S = 240.0


def engine_units(inventory, family: str, check_name: str, level: str) -> list[Unit]:
    if level == "quick" or getattr(inventory.platform, "conformance_sampling_engine", None) is None:
        return []
    return [Unit(family, check_name, MODEL, None, "float32", case) for case in ENGINE_CASES]


def batch_requests(vocab: int, seed: int) -> list[Req]:
    gen = torch.Generator().manual_seed(seed)

    def prompt(n):
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    allowed = sorted(torch.randperm(vocab, generator=gen)[:40].tolist())
    bias_tokens = torch.randperm(vocab, generator=gen)[:3].tolist()
    return [
        Req(0, prompt(23), 6, {"temperature": 0.0}),
        Req(1, prompt(31), 6, {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 11}),
        Req(2, prompt(17), 6, {"temperature": 1.2, "min_p": 0.05, "seed": 12}),
        Req(3, prompt(40), 6, {"temperature": 0.0, "repetition_penalty": 1.3, "frequency_penalty": 0.4,
                               "presence_penalty": 0.2}),
        Req(4, prompt(28), 6, {"temperature": 0.7, "top_p": 0.8, "presence_penalty": 0.3, "seed": 13,
                               "logit_bias": {bias_tokens[0]: 2.0, bias_tokens[1]: -3.0, bias_tokens[2]: 1.5}}),
        Req(5, prompt(19), 6, {"temperature": 1.0, "top_k": 5, "repetition_penalty": 1.1, "seed": 14}),
        Req(6, prompt(25), 6, {"temperature": 0.9, "allowed_token_ids": allowed, "seed": 15}),
    ]


def ngram_requests(vocab: int, seed: int) -> list[Req]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, (period, reps) in enumerate(((4, 8), (7, 5), (5, 6))):
        unit = torch.randint(0, vocab, (period,), generator=gen).tolist()
        out.append(Req(i, unit * reps, 24, {"temperature": 0.0}))
    unit = torch.randint(0, vocab, (6,), generator=gen).tolist()
    out.append(Req(3, unit * 5, 16, {"temperature": 0.8, "top_k": 10, "seed": 21}))
    return out


# ----- the check ----------------------------------------------------------------------------------------------
@check("sampling", "engine", units=engine_units)
def engine(ctx: CheckContext, unit: Unit) -> Verdict:
    from conformance.checks.engine import models as engine_models
    from conformance.checks.engine.oracle import logprob_tolerance

    lend = getattr(ctx.platform, "conformance_sampling_engine", None)
    if lend is None:
        return Verdict(Outcome.NOT_IMPLEMENTED, "the platform lends no vLLM engine (the engine units run under "
                       "--platform=vllm)")
    if unit.case not in ENGINE_CASES:
        return Verdict(Outcome.ERROR, f"sampling engine case {unit.case!r} is not one of {ENGINE_CASES}")
    tol = logprob_tolerance(torch.float32, MODEL)
    vocab = engine_models.VOCAB
    reqs = batch_requests(vocab, ctx.seed) if unit.case == "batch" else ngram_requests(vocab, ctx.seed)
    with scratch_dirs.directory("sampling-engine") as tmp:
        checkpoint = engine_models.write_checkpoint(engine_models.MODELS[MODEL], torch.float32, Path(tmp) / MODEL)
        run = dict(name=f"sampling-{unit.case}", model=str(checkpoint), dtype="float32", max_model_len=512,
                   max_num_seqs=8, logprobs_mode="processed_logprobs", speculative=None)
        if unit.case == "stops":    # bad_words need a tokenizer; requests built from the oracle so they bite
            from conformance.checks.sampling import stops, tokenizer

            tokenizer.write_tokenizer(checkpoint, vocab)
            reqs = stops.design(checkpoint, vocab, ctx.seed)
            run["tokenizer"] = True
            run["waves"] = [[r.to_json() for r in reqs]]
            runs = [run]
        elif unit.case == "batch":
            seeded = reqs[1]
            again = [dataclasses.replace(reqs[5], id=105), dataclasses.replace(seeded, id=101),
                     dataclasses.replace(reqs[0], id=100)]
            run["waves"] = [[r.to_json() for r in reqs], [dataclasses.replace(seeded, id=201).to_json()],
                            [r.to_json() for r in again]]
            runs = [run]
        else:       # greedy requests, then (a run of its own: an engine that raises loses its run) a sampled one
            run["speculative"] = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                  "prompt_lookup_min": 1}
            run["waves"] = [[r.to_json(logprobs=None) for r in reqs if r.sampling["temperature"] == 0],
                            [r.to_json(logprobs=None) for r in reqs if r.sampling["temperature"] > 0]]
            runs = [run]
        try:
            with lend(Path(tmp)) as proc:
                doc = proc.run(runs, JOB_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - only the engine process's death or silence is a result here
            crashed = getattr(exc, "crashed", None)
            if not isinstance(crashed, bool):
                raise
            return Verdict(Outcome.CRASH if crashed else Outcome.TIMEOUT, f"{exc} [sampling engine, {unit.case}]")
        result = doc["runs"][0]
        if "error" in result or (unit.case != "ngram" and result.get("wave_error")):
            report = result.get("wave_error") or result
            return Verdict(Outcome.ERROR, f"vLLM's engine raised {report['error']}\n{report.get('traceback', '')}")
        waves = result["waves"]
        answers = {a["id"]: a for wave in (waves if unit.case == "ngram" else waves[:1]) for a in wave}
        graded = [r for r in reqs if r.id in answers]
        logits = oracle_logits(checkpoint, graded, {r.id: answers[r.id]["tokens"] for r in graded})
    where = (f"[vLLM's engine on the platform, {MODEL} float32 (vocab {vocab}), {result['facts'].get('platform')}; "
             f"float64 reference teacher-forced on the engine's tokens, logprob tolerance {tol:.3g}]")
    if unit.case == "stops":
        return _stops_verdict(reqs, answers, logits, tol, where)
    if unit.case == "batch":
        problems = grade_batch(reqs, answers, logits, tol)
        if problems:
            more = f" ({len(problems) - 1} more requests wrong)" if len(problems) > 1 else ""
            return failed(f"{problems[0]}{more} {where}")
        base = answers[1]["tokens"]
        alone = waves[1][0]["tokens"]
        inside = {a["id"]: a for a in waves[2]}[101]["tokens"]
        for label, got in (("alone", alone), ("second in another batch of 3", inside)):
            if got != base:
                return failed(f"{reqs[1].describe()}: a seeded request drew {got} {label} where it drew {base} in "
                              f"the first batch of {len(reqs)} {where}")
        steps = sum(len(answers[r.id]["tokens"]) for r in reqs)
        return passed(f"{len(reqs)} requests, {steps} positions: processed logprobs, sampled tokens and greedy "
                      f"tokens as vLLM's order of processing says on the float64 logits; the seeded request drew "
                      f"{base} in every batch {where}")
    problems = []
    for r in graded:
        got = answers[r.id]["tokens"]
        for step, tok in enumerate(got):
            x = processed(r, logits[r.id][step], got[:step])
            keep, _, _ = step_bounds(r, x, tol)
            line = _step_problem(r, step, tok, [], x, keep, x, x, tol, r.sampling.get("temperature", 1.0) < 1e-5)
            if line:
                problems.append(line)
                break
    if problems:
        return failed(f"n-gram speculative decoding (3 draft tokens): {problems[0]} {where}")
    steps = sum(len(answers[r.id]["tokens"]) for r in graded)
    said = (f"n-gram speculative decoding (3 draft tokens): {len(graded)} requests, {steps} tokens, greedy ones the "
            f"oracle's argmax wherever the margin binds")
    broken = result.get("wave_error")
    if broken:
        wave = run["waves"][broken["wave"]]
        which = ("the greedy requests" if broken["wave"] == 0 else "the sampled request") + \
            f" ({', '.join(str(r['id']) for r in wave)})"
        head = f"{said}; then, with {which}," if graded else \
            f"n-gram speculative decoding (3 draft tokens): before any answer, with {which},"
        return Verdict(Outcome.ERROR, f"{head} vLLM's engine raised {broken['error']}\n"
                       f"{broken.get('traceback', '')} {where}")
    return passed(f"{said}, the sampled one inside its top-k {where}")


def _stops_verdict(reqs, answers, logits, tol, where) -> Verdict:
    from conformance.checks.sampling import stops

    problems = stops.grade(reqs, answers, logits, tol)
    if problems:
        more = f" ({len(problems) - 1} more requests wrong)" if len(problems) > 1 else ""
        return failed(f"{problems[0]}{more} {where}")
    steps = sum(len(answers[r.id]["tokens"]) for r in reqs)
    return passed(f"min_tokens with stop_token_ids and bad_words (the checkpoint's word-level tokenizer): "
                  f"{len(reqs)} requests, {steps} positions as vLLM's rules and order of processing say on the "
                  f"float64 logits; {stops.summary(reqs, answers, logits, tol)} {where}")
