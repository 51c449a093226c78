"""Sampling family: the tokens users get from a sampled request, graded op by op against a float64 oracle.

The platform's sampler is what `reference_impl.sampling.sampler_for(platform)` answers: the sampler a platform of
our API brings with `get_sampler()`, else the reference runtime's; under `--platform=vllm` the bridge's platform
answers vLLM's `Sampler` / `TopKTopPSampler` built with the resolved platform current and vLLM's rejection sampler
with the platform's kernel overrides (conformance/vllm/sampler_bridge.py; the checks reach vLLM only through the
platform they are handed). Four checks, each a unit per case (cases.py; docs/sampling.md):

- `top_k_top_p`: `apply_top_k_top_p` on fixed logits; every token's mask exact against the oracle (oracle.py),
  every kept logit unchanged.
- `sample`: the whole order of processing (greedy rows, temperature, min-p, top-k, top-p, the draw) on fixed logits,
  each request drawn N times with its own seeded generator: greedy rows must give the argmax every time, sampled
  rows' frequencies must match the oracle's distribution by an exact binomial test whose false-alarm rate over the
  unit is at most `ALPHA`, and the processed logprobs must be the oracle's.
- `seeded`: a seeded request draws the same tokens alone, inside a batch, and with the default generator elsewhere.
- `rejection`: speculative decoding's accept/reject with fixed uniforms and recovered tokens, exact per request;
  `rejection_distribution`: its whole step (uniforms, recovered tokens, kernels) on fixed probabilities, whose
  first token must follow the target distribution (the point of speculative sampling), by the same exact test.

The sampler may draw from the default generator (vLLM does for requests without a seed, and its CPU sampler for
every row); reseeding it is a finding (conformance.checks.common.drawing_default_generator).
"""

from __future__ import annotations

import math

import torch

import functools

from conformance.checks.common import (CheckContext, KernelRaised, Verdict, call_impl, case_generator,
                                       drawing_default_generator, error_from, failed, passed,
                                       release_lacks_verdict)
from conformance.checks.record import check
from conformance.checks.sampling import cases as sampling_cases
from conformance.checks.sampling import oracle
from conformance.collect.units import Unit
from conformance.results.result import Outcome

ALPHA = 1e-6          # the most a statistical unit may fail a correct sampler (Bonferroni over rows and tokens)
LOGPROB_ATOL = 1e-4   # processed logprobs (float32 log-softmax) against the oracle's float64 ones
OPS = {"top_k_top_p": "apply_top_k_top_p", "sample": "sample", "seeded": "sample", "rejection": "rejection_sample",
       "rejection_distribution": "rejection_sample"}
CASES = {"top_k_top_p": sampling_cases.MASK_CASES, "sample": sampling_cases.DIST_CASES,
         "seeded": {"alone_vs_batch": (None, sampling_cases.QUICK)},
         "rejection": sampling_cases.REJECTION_CASES, "rejection_distribution": sampling_cases.SPEC_DIST_CASES}


def sampling_units(inventory, family: str, check_name: str, level: str) -> list[Unit]:
    """One unit per case of the level (op = the sampler entry point it grades); float32 logits, as vLLM samples."""
    return [Unit(family, check_name, OPS[check_name], None, "float32", case)
            for case in sampling_cases.at_level(CASES[check_name], level)]


def _sampler(ctx: CheckContext):
    from reference_impl.sampling import sampler_for

    return call_impl("constructing the platform's sampler (get_sampler)", sampler_for, ctx.platform)


def _name(sampler, attr: str = "name") -> str:
    return getattr(sampler, attr, None) or f"{type(sampler).__module__}.{type(sampler).__qualname__}"


def _case(unit: Unit, check_name: str):
    entry = CASES[check_name].get(unit.case)
    if entry is None:
        raise ValueError(f"sampling.{check_name} has no case {unit.case!r}: one of {tuple(CASES[check_name])} "
                         "(conformance/checks/sampling/cases.py)")
    return entry[0]


def sampler_errors(body):
    """A raise of the sampler is an ERROR naming the entry point and the case (not the IR advice about
    supports_args, which a sampler has none of)."""
    @functools.wraps(body)
    def run(ctx, unit):
        try:
            return body(ctx, unit)
        except KernelRaised as exc:   # a release that lacks what the case asks is NOT_SUPPORTED, as in run_unit
            return release_lacks_verdict(exc, unit.case) or error_from(exc.exc, f"{exc.where} (case {unit.case})")

    return run


def _sampler_call(where: str, fn, *args):
    """The platform's sampler called; it may draw from the default generator, not reseed it."""
    with drawing_default_generator(where):
        return call_impl(where, fn, *args)


# ----- apply_top_k_top_p --------------------------------------------------------------------------------------
@check("sampling", "top_k_top_p", units=sampling_units)
@sampler_errors
def top_k_top_p(ctx: CheckContext, unit: Unit) -> Verdict:
    req = _case(unit, "top_k_top_p")(case_generator(ctx, unit))
    sampler = _sampler(ctx)
    name = _name(sampler)
    logits = req.logits.to(ctx.device)
    k = None if req.top_k is None else torch.tensor(req.top_k, dtype=torch.int32, device=ctx.device)
    p = None if req.top_p is None else torch.tensor(req.top_p, dtype=torch.float32, device=ctx.device)
    name = getattr(sampler, "apply_name", None) or f"{name}.apply_top_k_top_p"
    out = _sampler_call(name, sampler.apply_top_k_top_p, logits.clone(), k, p)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(logits.shape):
        return failed(f"{name} returned {_what(out)} for logits of shape {tuple(logits.shape)}")
    out = out.detach().to("cpu", torch.float32)
    bad_rows = []
    for row in range(req.rows):
        problem = _mask_problem(req, row, out[row])
        if problem:
            bad_rows.append((row, problem))
    where = f"[{name}, {req.rows} requests, vocab {req.vocab}; k {'off' if k is None else 'set'}, " \
            f"p {'off' if p is None else 'set'}]"
    if bad_rows:
        row, problem = bad_rows[0]
        return failed(f"{len(bad_rows)} of {req.rows} requests masked wrongly; first {req.describe(row)}: "
                      f"{problem} {where}")
    return passed(f"every token of {req.rows} requests masked as vLLM's top-k/top-p rule says {where}")


def _what(out) -> str:
    if isinstance(out, torch.Tensor):
        return f"a tensor of shape {tuple(out.shape)} and dtype {out.dtype}"
    return f"a {type(out).__name__}"


def _mask_problem(req, row: int, got: torch.Tensor) -> str | None:
    keep = req.keep(row)
    x = req.logits[row]
    state = keep.state
    dropped = got == -math.inf
    same = (got == x) | (dropped & (x == -math.inf))
    changed = ~dropped & ~same
    if changed.any():
        t = int(changed.nonzero()[0])
        return (f"token {t}'s logit changed from {float(x[t]):.6g} to {float(got[t]):.6g} "
                f"({int(changed.sum())} kept logits changed): a mask leaves kept logits as they are")
    wrong_drop = (state == oracle.KEEP) & dropped
    wrong_keep = (state == oracle.DROP) & ~dropped
    n_kept = int((~dropped).sum())
    n_oracle = int((state == oracle.KEEP).sum()) + sum(g.lo for g in keep.groups)
    if wrong_drop.any() or wrong_keep.any():
        t = int((wrong_drop | wrong_keep).nonzero()[0])
        what = "dropped (-inf)" if bool(wrong_drop[t]) else "kept"
        return (f"token {t} (logit {float(x[t]):.6g}) is {what} where the oracle "
                f"{'keeps' if bool(wrong_drop[t]) else 'drops'} it ({_why(keep, x, t, bool(wrong_drop[t]))}); "
                f"{int(wrong_drop.sum())} tokens dropped and {int(wrong_keep.sum())} kept wrongly, {n_kept} kept "
                f"where the oracle keeps {n_oracle}")
    for g in keep.groups:
        kept = int((~dropped[g.tokens]).sum())
        if not g.lo <= kept <= g.hi:
            need = f"{g.lo}" if g.lo == g.hi else f"{g.lo} to {g.hi}"
            return (f"{kept} of the {len(g.tokens)} tokens tied at logit {float(x[g.tokens[0]]):.6g} (the top-p "
                    f"threshold falls among them) are kept where vLLM's rule keeps {need} of them (ascending by "
                    f"probability, a token is dropped while the cumulative mass is at most 1 - top_p)")
    return None


def _why(keep: oracle.RowKeep, x: torch.Tensor, t: int, oracle_keeps: bool) -> str:
    v = float(x[t])
    if oracle_keeps:
        parts = []
        if keep.kth is not None:
            parts.append(f"at or above the k-th largest logit {keep.kth:.6g}, ties kept")
        if keep.top_p_kept_mass is not None:
            parts.append(f"inside the top-p nucleus, which holds {keep.top_p_kept_mass:.6g} of the mass with the "
                         "token that crosses top_p")
        return "; ".join(parts) or "no filter drops it"
    if keep.kth is not None and v < keep.kth:
        return f"below the k-th largest logit {keep.kth:.6g}"
    if keep.min_p_floor is not None:
        return f"below min_p times the largest probability ({keep.min_p_floor:.4g}) or outside the nucleus"
    if v == -math.inf:
        return "its logit is -inf"
    return (f"outside the top-p nucleus: the oracle's nucleus holds {keep.top_p_kept_mass:.6g} of the mass, the "
            "fewest most likely tokens whose mass reaches top_p")


# ----- sample: the order of processing, in distribution ----------------------------------------------------------
def _batch(req, repeats: int, device: str, seeds: list[int]):
    from reference_impl.sampling import SamplingBatch

    def column(values, dtype):
        if values is None:
            return None
        return torch.tensor(values, dtype=dtype, device=device).repeat_interleave(repeats)

    temperature = column(req.temperature or [1.0] * req.rows, torch.float32)
    gens = {i: torch.Generator(device=device).manual_seed(s) for i, s in enumerate(seeds)}
    return SamplingBatch(temperature, top_k=column(req.top_k, torch.int32), top_p=column(req.top_p, torch.float32),
                         min_p=column(req.min_p, torch.float32), generators=gens)


def draws_for(case: str, level: str) -> int:
    return sampling_cases.DRAWS_LARGE_VOCAB if case == "vocab_152k" else sampling_cases.DRAWS[level]


@check("sampling", "sample", units=sampling_units)
@sampler_errors
def sample(ctx: CheckContext, unit: Unit) -> Verdict:
    gen = case_generator(ctx, unit)
    req = _case(unit, "sample")(gen)
    repeats = draws_for(unit.case, ctx.level)
    sampler = _sampler(ctx)
    name = _name(sampler)
    base = int(torch.randint(0, 2**40, (1,), generator=gen))
    batch = _batch(req, repeats, ctx.device, [base + i for i in range(req.rows * repeats)])
    logits = req.logits.repeat_interleave(repeats, dim=0).to(ctx.device)
    result = _sampler_call(f"{name}.sample", sampler.sample, logits, batch)
    tokens, processed = result if isinstance(result, tuple) else (result, None)
    if not isinstance(tokens, torch.Tensor) or tokens.numel() != logits.shape[0]:
        return failed(f"{name}.sample returned {_what(tokens)} for {logits.shape[0]} rows")
    tokens = tokens.detach().reshape(-1).to("cpu", torch.long)
    where = (f"[{name}; {req.rows} requests x {repeats} draws, each with its own seeded generator, vocab "
             f"{req.vocab}; exact binomial test, false-alarm rate at most {ALPHA:g} for the unit]")
    problems = []
    for row in range(req.rows):
        drawn = tokens[row * repeats:(row + 1) * repeats]
        problem = _draw_problem(req, row, drawn, repeats)
        if problem:
            problems.append(f"{req.describe(row)}: {problem}")
    if not problems and processed is not None:
        processed = processed.detach().to("cpu", torch.float32)
        for row in range(req.rows):
            problem = _logprob_problem(req, row, processed[row * repeats])
            if problem:
                problems.append(f"{req.describe(row)}: processed logprobs: {problem}")
    if problems:
        more = f" ({len(problems) - 1} more requests wrong)" if len(problems) > 1 else ""
        return failed(f"{problems[0]}{more} {where}")
    said = "" if processed is not None else "; the sampler returned no processed logprobs (not graded)"
    return passed(f"{req.rows} requests drawn as vLLM's order of processing says (temperature, min-p, top-k, top-p)"
                  f"{said} {where}")


def _draw_problem(req, row: int, drawn: torch.Tensor, repeats: int) -> str | None:
    vocab = req.vocab
    if bool(((drawn < 0) | (drawn >= vocab)).any()):
        bad = int(drawn[(drawn < 0) | (drawn >= vocab)][0])
        return f"drew token {bad}, outside the vocabulary of {vocab}"
    counts = torch.bincount(drawn, minlength=vocab)
    if req.temperature is not None and req.temperature[row] < 1e-5:
        best = oracle.greedy_tokens(req.logits[row])
        wrong = [t for t in counts.nonzero().flatten().tolist() if t not in best]
        if wrong:
            return (f"greedy (temperature 0) drew token {wrong[0]} {int(counts[wrong[0]])} of {repeats} times where "
                    f"greedy decoding gives token {min(best)} (the argmax) every time")
        return None
    keep = req.keep(row)
    probs = oracle.distribution(req.tempered(row), keep)
    outliers = oracle.binomial_outliers(counts.tolist(), probs, ALPHA / req.rows)
    if not outliers:
        return None
    more = f"; {len(outliers) - 1} more tokens off" if len(outliers) > 1 else ""
    kept = int((keep.state == oracle.KEEP).sum())
    return f"{outliers[0].line(repeats)}{more}; the oracle keeps {kept} tokens"


def _logprob_problem(req, row: int, got: torch.Tensor) -> str | None:
    greedy = req.temperature is not None and req.temperature[row] < 1e-5
    keep = req.keep(row) if not greedy else oracle.keep_row(
        req.logits[row], req.top_k[row] if req.top_k else None, req.top_p[row] if req.top_p else None,
        req.min_p[row] if req.min_p else None)
    if not keep.determined:
        return None
    x = oracle.as_f64(req.logits[row] if greedy else req.tempered(row))
    mask = keep.state == oracle.KEEP
    want = x.masked_fill(~mask, -math.inf).log_softmax(0)
    got64 = got.to(torch.float64)
    masked_wrong = (got64 == -math.inf) != (want == -math.inf)
    if bool(masked_wrong.any()):
        t = int(masked_wrong.nonzero()[0])
        return (f"token {t} is {float(got64[t]):.6g} where the oracle gives {float(want[t]):.6g} "
                f"({int(masked_wrong.sum())} tokens masked differently)")
    err = (got64 - want).abs().masked_fill(~mask, 0.0)
    if float(err.max()) > LOGPROB_ATOL:
        t = int(err.argmax())
        return (f"token {t} is {float(got64[t]):.6g} where the oracle gives {float(want[t]):.6g} (error "
                f"{float(err.max()):.3g} > {LOGPROB_ATOL:g})")
    return None


# ----- seeded requests: alone and in batches ---------------------------------------------------------------------
SEEDED_STEPS = 4


@check("sampling", "seeded", units=sampling_units)
@sampler_errors
def seeded(ctx: CheckContext, unit: Unit) -> Verdict:
    from reference_impl.sampling import SamplingBatch

    gen = case_generator(ctx, unit)
    vocab = 64
    logits = torch.randn((8, vocab), generator=gen) * 1.5
    params = dict(temperature=[0.9, 1.0, 0.7, 1.2, 0.5, 1.0, 0.8, 1.1], top_k=[20, vocab, 5, 40, vocab, 10, vocab, 30],
                  top_p=[0.9, 1.0, 0.8, 0.95, 0.7, 1.0, 0.6, 0.85])
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    sampler = _sampler(ctx)
    name = _name(sampler)
    target = 0       # the request under test is row 0 of `logits` / `params`

    def run(order: list[int], seeds: dict[int, int], advance_default: bool) -> list[int]:
        """The batch of requests `order` (row indices of `logits`), SEEDED_STEPS draws; the target's tokens."""
        dev = ctx.device
        batch_logits = logits[order].to(dev)
        pick = {k: torch.tensor([v[i] for i in order], device=dev) for k, v in params.items()}
        gens = {pos: torch.Generator(device=dev).manual_seed(seeds[row]) for pos, row in enumerate(order)
                if row in seeds}
        batch = SamplingBatch(pick["temperature"].float(), top_k=pick["top_k"].to(torch.int32),
                              top_p=pick["top_p"].float(), generators=gens)
        at = order.index(target)
        out = []
        with drawing_default_generator(f"{name}.sample"):
            if advance_default:
                torch.rand(1000, device=dev)       # the default generator elsewhere than in the other runs
            for _ in range(SEEDED_STEPS):
                result = call_impl(f"{name}.sample", sampler.sample, batch_logits.clone(), batch)
                tokens = result[0] if isinstance(result, tuple) else result
                out.append(int(tokens.reshape(-1)[at]))
        return out

    seeds = {0: seed, 2: seed + 1, 4: seed + 2, 5: seed + 3, 7: seed + 4}     # rows 1, 3, 6 have no seed
    alone = run([0], {0: seed}, False)
    runs = {"inside a batch of 8 at row 5 (three requests without a seed)": run([1, 2, 3, 4, 5, 0, 6, 7], seeds, False),
            "first in a batch of 4, the default generator drawn from before": run([0, 3, 6, 1], seeds, True),
            "alone again, the default generator drawn from before": run([0], {0: seed}, True)}
    what = (f"request (seed {seed}, temperature=0.9, top_k=20, top_p=0.9, vocab {vocab}), {SEEDED_STEPS} draws")
    for label, got in runs.items():
        if got != alone:
            return failed(f"a seeded request's tokens depend on what else runs: {what} drew {got} {label} where "
                          f"alone it drew {alone} [{name}]")
    return passed(f"{what}: the same tokens {alone} alone, in batches and whatever the default generator's state "
                  f"[{name}]")


# ----- the rejection sampler -------------------------------------------------------------------------------------
def _spec_tensors(spec, device):
    cu = torch.tensor(spec.num_draft, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    return dict(
        draft_token_ids=torch.tensor(spec.drafts, dtype=torch.int32, device=device),
        cu_num_draft_tokens=cu,
        draft_probs=None if spec.draft_probs is None else spec.draft_probs.to(device),
        target_probs=spec.target_probs.to(device),
        bonus_token_ids=torch.tensor(spec.bonus, dtype=torch.int32, device=device).unsqueeze(1),
        recovered_token_ids=torch.tensor(spec.recovered, dtype=torch.int32, device=device),
        uniform_probs=spec.uniforms.to(device),
        is_greedy=torch.tensor(spec.greedy, dtype=torch.bool, device=device),
        max_spec_len=spec.max_spec_len)


def _expected(spec, req: int) -> list[int]:
    span = spec.span(req)
    target = [spec.target_probs[t].double().tolist() for t in span]
    draft = None if spec.draft_probs is None else [spec.draft_probs[t].double().tolist() for t in span]
    return oracle.rejection_row([spec.drafts[t] for t in span], draft, target,
                                [float(spec.uniforms[t]) for t in span], [spec.recovered[t] for t in span],
                                spec.bonus[req], spec.greedy[req])


@check("sampling", "rejection", units=sampling_units)
@sampler_errors
def rejection(ctx: CheckContext, unit: Unit) -> Verdict:
    spec = _case(unit, "rejection")(case_generator(ctx, unit))
    sampler = _sampler(ctx)
    name = _name(sampler, "rejection_name")
    args = _spec_tensors(spec, ctx.device)
    out = _sampler_call(f"{name}: rejection_sample", sampler.rejection_sample, *args.values())
    batch = len(spec.num_draft)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (batch, spec.max_spec_len + 1):
        return failed(f"rejection_sample returned {_what(out)} where ({batch}, {spec.max_spec_len + 1}) is due "
                      f"[{name}]")
    out = out.detach().to("cpu", torch.long)
    wrong = []
    for req in range(batch):
        want = _expected(spec, req)
        got = out[req].tolist()
        want_row = want + [-1] * (spec.max_spec_len + 1 - len(want))
        if got != want_row:
            wrong.append((req, _rejection_line(spec, req, got, want)))
    where = f"[{name}; {batch} requests, fixed uniforms and recovered tokens, vocab {spec.target_probs.shape[1]}]"
    if wrong:
        req, line = wrong[0]
        more = f" ({len(wrong) - 1} more requests wrong)" if len(wrong) > 1 else ""
        return failed(f"{spec.describe(req)}: {line}{more} {where}")
    accepted = sum(len(_expected(spec, r)) - 1 for r in range(batch))
    return passed(f"every request's tokens as the oracle's ({accepted} draft tokens accepted in all) {where}")


def _rejection_line(spec, req: int, got: list[int], want: list[int]) -> str:
    got_tokens = list(got)
    while got_tokens and got_tokens[-1] == -1:       # the placeholders after the last token
        got_tokens.pop()
    n_want, n_got = len(want) - 1, max(0, len(got_tokens) - 1)     # the last token is recovered or the bonus
    pos = next((i for i, (a, b) in enumerate(zip(got + [None], want + [None])) if a != b), len(want))
    detail = ""
    if pos < spec.num_draft[req]:
        t = spec.span(req)[pos]
        tok = spec.drafts[t]
        if spec.greedy[req]:
            detail = f"; position {pos}: draft token {tok}, the target's argmax {int(spec.target_probs[t].argmax())}"
        elif tok < 0:
            detail = (f"; position {pos}: a padded draft token ({tok}), which must be rejected (the oracle takes "
                      f"recovered token {spec.recovered[t]} there and stops)")
        else:
            q = 1.0 if spec.draft_probs is None else float(spec.draft_probs[t, tok])
            tp = float(spec.target_probs[t, tok])
            u = float(spec.uniforms[t])
            verdict = "accept" if q > 0 and tp / q >= u else "reject"
            detail = (f"; position {pos}: draft token {tok}, target {tp:.4g} / draft {q:.4g} = "
                      f"{(tp / q if q else 0):.4g} against uniform {u:.4g}: the oracle must {verdict}"
                      f"{'' if verdict == 'accept' else f' and take recovered token {spec.recovered[t]}'}")
    return (f"output {got_tokens} where the oracle gives {want} (accepted {n_got} draft tokens where the oracle "
            f"accepts {n_want}){detail}")


@check("sampling", "rejection_distribution", units=sampling_units)
@sampler_errors
def rejection_distribution(ctx: CheckContext, unit: Unit) -> Verdict:
    vocab, with_draft_probs = _case(unit, "rejection_distribution")
    gen = case_generator(ctx, unit)
    n = sampling_cases.SPEC_DRAWS[ctx.level]
    sampler = _sampler(ctx)
    name = _name(sampler, "rejection_name")
    if not callable(getattr(sampler, "speculative_sample", None)):
        return Verdict(Outcome.NOT_IMPLEMENTED, f"the sampler {_name(sampler)} has no speculative_sample")
    target_logits = (torch.randn((1, vocab), generator=gen, dtype=torch.float64) * 1.5).to(torch.float32)
    draft = (torch.randn((vocab,), generator=gen, dtype=torch.float64) * 1.5).softmax(0).to(torch.float32)
    if with_draft_probs:       # each request's one draft token drawn from the draft distribution (by the check)
        drafts = torch.multinomial(draft.double(), n, replacement=True, generator=gen).to(torch.int32)
        draft_probs = draft.repeat(n, 1).to(ctx.device)
    else:                      # an n-gram drafter: a fixed token, no probabilities
        drafts = torch.full((n,), int(torch.randint(0, vocab, (1,), generator=gen)), dtype=torch.int32)
        draft_probs = None
    base = int(torch.randint(0, 2**40, (1,), generator=gen))
    gens = {i: torch.Generator(device=ctx.device).manual_seed(base + i) for i in range(n)}
    cu = torch.arange(1, n + 1, dtype=torch.int32, device=ctx.device)
    bonus = torch.zeros((n, 1), dtype=torch.int32, device=ctx.device)
    out = _sampler_call(f"{name}: speculative_sample", sampler.speculative_sample, drafts.to(ctx.device), [1] * n,
                        cu, draft_probs, target_logits.repeat(n, 1).to(ctx.device), bonus, gens)
    first = out.detach().to("cpu", torch.long)[:, 0]
    target = target_logits[0].double().softmax(0).tolist()
    counts = torch.bincount(first.clamp(0, vocab - 1), minlength=vocab).tolist()
    accepted = int((first == drafts.long()).sum())
    drafter = "draft tokens drawn from a draft distribution" if with_draft_probs else "an n-gram draft token"
    where = (f"[{name}; {n} requests of one draft token ({drafter}), each with its own seeded generator, vocab "
             f"{vocab}; exact binomial test, false-alarm rate at most {ALPHA:g}]")
    if bool(((first < 0) | (first >= vocab)).any()):
        return failed(f"a first output token outside the vocabulary: {int(first[(first < 0) | (first >= vocab)][0])} "
                      f"{where}")
    outliers = oracle.binomial_outliers(counts, target, ALPHA)
    if outliers:
        more = f"; {len(outliers) - 1} more tokens off" if len(outliers) > 1 else ""
        expect = sum(min(a, b) for a, b in zip(target, draft.double().tolist())) if with_draft_probs else \
            target[int(drafts[0])]
        return failed(f"speculative decoding's first token does not follow the target distribution: "
                      f"{outliers[0].line(n)}{more}; {accepted} of {n} draft tokens accepted where the oracle "
                      f"expects {expect * n:.0f} {where}")
    return passed(f"the first token follows the target distribution ({accepted} of {n} draft tokens accepted) "
                  f"{where}")


from conformance.checks.sampling import engine as _engine  # noqa: E402,F401 - registers sampling.engine
