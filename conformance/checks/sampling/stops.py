"""The sampling family's `stops` engine case: min_tokens with stop_token_ids, and bad_words, through vLLM's engine
(its own engine run, with the family's word-level tokenizer beside the checkpoint so vLLM can tokenize bad words),
graded against the float64 reference decoder with vLLM's rules (stop_rules.py).

The requests are built from the reference decoder so that the parameters bite: a greedy request whose stop tokens
include the oracle's first choice at step 0 (min_tokens masks it) and the token it would take right after
min_tokens (so a stop token ends it there); a sampled request (top_k 5) whose stop token and bad word are the two
likeliest tokens at step 0; a greedy request with a one-token bad word (its first choice), a two-token bad word
taken from its own greedy path (it bans the second token right after the first was generated) and a two-token bad
word that starts with the prompt's last token (vLLM matches generated tokens only, so it must not ban). Each
request's first problem names the parameter, the request and the step; the oracle is tested on synthetic answers
(tests/sampling/test_sampling_stops.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch

from conformance.checks.sampling import engine_oracle as E
from conformance.checks.sampling import oracle, stop_rules, tokenizer

MIN_TOKENS = 3
MAX_TOKENS = 8
SAMPLED_MIN_TOKENS = 4
DESIGN_TRIES = 6


# ----- building the requests ----------------------------------------------------------------------------------
def model_eos_ids(checkpoint: Path) -> tuple[int, ...]:
    """The end-of-sequence ids vLLM adds to every request's all_stop_token_ids: the tokenizer's EOS and the
    generation config's eos_token_id (an id or a list)."""
    ids = {tokenizer.EOS_ID}
    path = Path(checkpoint) / "generation_config.json"
    if path.exists():
        value = json.loads(path.read_text()).get("eos_token_id")
        ids |= {value} if isinstance(value, int) else set(value or ())
    return tuple(sorted(ids))


def reference(checkpoint: Path):
    """`last(ids) -> [vocab]` float64: the reference decoder's logits after the token ids `ids`."""
    from conformance.checks.common import native_only
    from conformance.checks.model import build_reference
    from reference_impl.models.checkpoint import read_config, read_tensors

    model = build_reference(read_config(checkpoint), torch.float64, read_tensors(checkpoint, torch.float64), "cpu")

    def last(ids: list[int]) -> torch.Tensor:
        with native_only(), torch.no_grad():
            t = torch.tensor(ids, dtype=torch.long)
            return model(t, torch.arange(t.numel()))[-1].double()

    return last


def greedy_path(r: E.Req, last) -> list[int]:
    """The oracle's greedy tokens for `r` under vLLM's rules: masks, then the argmax, a stop token after
    min_tokens ending it."""
    out: list[int] = []
    stops = set(r.sampling.get("stop_token_ids") or ())
    while len(out) < r.max_tokens:
        tok = int(E.processed(r, last(r.prompt + out), out).argmax())
        out.append(tok)
        if tok in stops and len(out) > r.sampling.get("min_tokens", 0):
            break
    return out


def _first_word(order: list[int]) -> int:
    return next(t for t in order if t >= len(tokenizer.SPECIAL))


def design(checkpoint: Path, vocab: int, seed: int) -> list[E.Req]:
    """The case's three requests for this checkpoint and seed (see the module docstring)."""
    last = reference(checkpoint)
    eos = model_eos_ids(checkpoint)
    gen = torch.Generator().manual_seed(seed)

    def prompt(n):
        return torch.randint(len(tokenizer.SPECIAL), vocab, (n,), generator=gen).tolist()

    def ranked(p):
        return last(p).argsort(descending=True).tolist()

    p0, p1, p2 = prompt(21), prompt(18), prompt(24)
    stops = [ranked(p0)[0]]
    for _ in range(DESIGN_TRIES):   # add the token taken right after min_tokens until a stop token ends the path
        r0 = E.Req(0, p0, MAX_TOKENS, {"temperature": 0.0, "min_tokens": MIN_TOKENS, "stop_token_ids": list(stops)},
                   eos)
        path = greedy_path(r0, last)
        if path[-1] in stops and len(path) > MIN_TOKENS:
            break
        stops.append(path[MIN_TOKENS])
    order1 = ranked(p1)
    r1 = E.Req(1, p1, MAX_TOKENS, {"temperature": 0.8, "top_k": 5, "seed": 31, "min_tokens": SAMPLED_MIN_TOKENS,
                                    "stop_token_ids": [order1[0]],
                                    "bad_words": [tokenizer.word(_first_word(order1[1:]))]}, eos)
    single = tokenizer.word(_first_word(ranked(p2)))
    path = greedy_path(E.Req(2, p2, 6, {"temperature": 0.0, "bad_words": [single]}, eos), last)
    words = [single]
    from_prompt = [p2[-1], path[0]] if path[0] >= len(tokenizer.SPECIAL) else None
    pair = next(([a, b] for a, b in zip(path[1:], path[2:])
                 if min(a, b) >= len(tokenizer.SPECIAL) and a != b and [a, b] != from_prompt), None)
    words += [tokenizer.words(w) for w in (pair, from_prompt) if w]
    r2 = E.Req(2, p2, 6, {"temperature": 0.0, "bad_words": words}, eos)
    return [r0, r1, r2]


# ----- grading ------------------------------------------------------------------------------------------------
def _unmasked(r: E.Req) -> E.Req:
    """The request without min_tokens and bad_words: what the engine would do were they ignored."""
    drop = ("min_tokens", "bad_words")
    return dataclasses.replace(r, sampling={k: v for k, v in r.sampling.items() if k not in drop})


def grade(reqs: list[E.Req], answers: dict[int, dict], logits: dict[int, torch.Tensor], tol: float) -> list[str]:
    """Every request's first problem, as a line naming the parameter, the request and the step."""
    problems = []
    for r in reqs:
        line = _request_problem(r, answers[r.id], logits[r.id], tol)
        if line:
            problems.append(line)
    return problems


def _request_problem(r: E.Req, got: dict, raw: torch.Tensor, tol: float) -> str | None:
    s = r.sampling
    tokens = got["tokens"]
    stops = set(s.get("stop_token_ids") or ())
    m = s.get("min_tokens", 0)
    vocab = raw.shape[-1]
    bad = stop_rules.bad_words_ids(s, vocab)
    greedy = s.get("temperature", 1.0) < 1e-5
    if not tokens:
        return f"{r.describe()}: no tokens generated (max_tokens {r.max_tokens})"
    for step, (tok, pairs) in enumerate(zip(tokens, got["logprobs"])):
        where = f"{r.describe()}, step {step}"
        so_far = tokens[:step]
        held = stop_rules.min_tokens_mask(r, so_far)
        bans = stop_rules.bad_word_bans(bad, so_far)
        if tok in held:
            return (f"min_tokens={m}: {where}: generated stop token {tok} as its token {step + 1}, where vLLM masks "
                    f"its stop tokens {sorted(stop_rules.all_stop_token_ids(r))} (stop_token_ids and the model's "
                    f"EOS) until {m} tokens are generated")
        if tok in bans:
            return (f"bad_words: {where}: generated token {tok}, which {_completes(bans[tok], so_far)} "
                    f"{tokenizer.words(bans[tok])!r}")
        if tok in stops and step < len(tokens) - 1:
            return (f"stop_token_ids: {where}: generated stop token {tok} after min_tokens={m} and went on to "
                    f"{len(tokens)} tokens; a stop token ends the request")
        for t, value in pairs:
            if value != -math.inf and (t in held or t in bans):
                name = f"min_tokens={m}" if t in held else "bad_words"
                why = ("a stop token before min_tokens" if t in held else
                       f"banned by the bad word {tokenizer.words(bans[t])!r}")
                return (f"{name}: {where}: the processed logprob of token {t} is {value:.4f} where vLLM masks it "
                        f"(-inf): {why}")
        x = E.processed(r, raw[step], so_far)
        keep, low, high = E.step_bounds(r, x, tol)
        line = E._step_problem(r, step, tok, pairs, x, keep, low, high, tol, greedy)
        if line:
            return line + _over_mask_hint(r, x, so_far, bad, step)
    n = len(tokens)
    reason = got.get("finish_reason")
    if n < r.max_tokens and tokens[-1] not in stops:
        return (f"stop_token_ids: {r.describe()}: ended after {n} of max_tokens {r.max_tokens} tokens on token "
                f"{tokens[-1]}, not a stop token (finish reason {reason!r})")
    if tokens[-1] in stops and reason not in (None, "stop"):
        return (f"stop_token_ids: {r.describe()}: ended on stop token {tokens[-1]} at step {n - 1} with finish reason "
                f"{reason!r}, not 'stop'")
    return None


def _completes(ids: list[int], so_far: list[int]) -> str:
    return "is the bad word" if len(ids) == 1 else f"after {so_far[-(len(ids) - 1):]} completes the bad word"


def _over_mask_hint(r: E.Req, x: torch.Tensor, so_far: list[int], bad: list[list[int]], step: int) -> str:
    """Where the oracle's choice is a token these parameters mask at other times: why it is not masked now."""
    top = int(x.argmax())
    if any(ids[-1] == top and len(ids) > 1 for ids in bad):
        return (f"; bad_words: the oracle's token {top} ends a bad word whose first tokens were not just generated "
                f"(vLLM matches generated tokens only, never the prompt)")
    if top in stop_rules.all_stop_token_ids(r) and step >= r.sampling.get("min_tokens", 0):
        return f"; min_tokens: the oracle's token {top} is a stop token, no longer masked after min_tokens"
    return ""


def bites(r: E.Req, tokens: list[int], raw: torch.Tensor, tol: float) -> dict[str, int]:
    """How often min_tokens and bad_words masked a token the request would otherwise have taken (greedy: the
    argmax) or kept (sampled: its kept set): the evidence that the case tested them."""
    plain = _unmasked(r)
    greedy = r.sampling.get("temperature", 1.0) < 1e-5
    bad = stop_rules.bad_words_ids(r.sampling, raw.shape[-1])
    out = {"min_tokens": 0, "bad_words": 0}
    for step in range(len(tokens)):
        so_far = tokens[:step]
        x = E.processed(plain, raw[step], so_far)
        wanted = {int(x.argmax())} if greedy else \
            set(torch.nonzero(E.step_bounds(plain, x, tol)[0].state == oracle.KEEP).flatten().tolist())
        out["min_tokens"] += bool(wanted & stop_rules.min_tokens_mask(r, so_far))
        out["bad_words"] += bool(wanted & set(stop_rules.bad_word_bans(bad, so_far)))
    return out


def summary(reqs: list[E.Req], answers: dict[int, dict], logits: dict[int, torch.Tensor], tol: float) -> str:
    """What a passing run showed: where each parameter bit, and which requests a stop token ended."""
    counts = {r.id: bites(r, answers[r.id]["tokens"], logits[r.id], tol) for r in reqs}
    parts = []
    for name in ("min_tokens", "bad_words"):
        where = [f"request {i} ({c[name]} steps)" for i, c in counts.items() if c[name]]
        parts.append(f"{name} masked a token the unmasked oracle would take or keep: "
                     f"{', '.join(where) if where else 'never (the case did not bite)'}")
    ended = [f"request {r.id} at step {len(answers[r.id]['tokens']) - 1} (token {answers[r.id]['tokens'][-1]})"
             for r in reqs if answers[r.id]["tokens"][-1] in set(r.sampling.get("stop_token_ids") or ())]
    parts.append(f"a stop token after min_tokens ended {', '.join(ended) if ended else 'no request'}")
    return "; ".join(parts)
