"""The reference runtime's sampler: temperature, min-p, top-k, top-p, penalties and the draw, with vLLM 0.32's
semantics and order of processing (vllm/v1/sample/sampler.py), and the rejection sampler of speculative decoding.

A platform written against our API may bring its own sampler: `sampler_for(platform)` answers what its
`get_sampler()` returns where it defines one, else this module's `Sampler`. A sampler has three entry points, the
units the `sampling` conformance family grades (docs/sampling.md):

- `apply_top_k_top_p(logits, k, p)`: logits with every token outside the top-k (ties with the k-th value kept) and
  outside the top-p nucleus (the fewest most likely tokens whose mass reaches p, the one crossing p kept) set to
  -inf; `k` (int64, per row; the vocabulary size means off) or `p` (float, per row) may be None. May write in place.
- `sample(logits, batch)`: one token per row from float32 logits, in vLLM's order: greedy rows (temperature below
  `SAMPLING_EPS`) take the argmax; the others are divided by their temperature, then min-p, then top-k and top-p,
  then drawn with each row's own `torch.Generator` (`batch.generators[row]`) or, for a row without one, the
  default generator. Returns (tokens int64, processed logprobs float32: log-softmax of the processed logits).
- `rejection_sample(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids,
  recovered_token_ids, uniform_probs, is_greedy, max_spec_len)`: the accept/reject kernel with the uniforms given.

Penalties (`apply_penalties`) and `generate_uniform_probs` / `sample_recovered_tokens` follow vLLM's too.
"""

from __future__ import annotations

import dataclasses

import torch

from reference_impl.sampling import stops

SAMPLING_EPS = 1e-5          # vLLM's _SAMPLING_EPS: a temperature below it is greedy
PLACEHOLDER_TOKEN_ID = -1    # a rejected position of the rejection sampler's output


@dataclasses.dataclass
class SamplingBatch:
    """Per-row sampling parameters of one batch (tensors on the logits' device). `temperature` 0 is greedy; `top_k`
    the vocabulary size, `top_p` 1 and `min_p` 0 are off, and None means off for every row."""

    temperature: torch.Tensor
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None
    generators: dict[int, torch.Generator] = dataclasses.field(default_factory=dict)

    @property
    def all_greedy(self) -> bool:
        return bool((self.temperature < SAMPLING_EPS).all())

    @property
    def all_random(self) -> bool:
        return bool((self.temperature >= SAMPLING_EPS).all())


def apply_top_k(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """-inf below each row's k-th largest value (ties with it kept); k >= the vocabulary size keeps the row. Only
    the rows that cut are touched, through the largest k among them (a top-k, not a sort of the whole row)."""
    vocab = logits.shape[-1]
    k = k.to(device=logits.device, dtype=torch.long).clamp(1, vocab)
    rows = (k < vocab).nonzero().flatten()
    if rows.numel() == 0:
        return logits
    cut = logits[rows]
    largest = cut.topk(int(k[rows].max()), dim=-1).values        # sorted descending, as a full sort's head
    kth = largest.gather(-1, (k[rows] - 1).unsqueeze(-1))
    logits[rows] = cut.masked_fill_(cut < kth, float("-inf"))
    return logits


def apply_top_p(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """-inf outside each row's nucleus: ascending by probability, the tokens whose cumulative mass stays at or below
    1 - p are dropped, the most likely token always kept (vLLM's rule). A row with p >= 1 drops just its tokens of
    probability 0 (those whose softmax underflows, besides the -inf ones), which needs no sort: only the rows with
    p < 1 are sorted."""
    p = p.to(device=logits.device)
    whole = (p >= 1).nonzero().flatten()
    if whole.numel():
        kept = logits[whole]
        logits[whole] = kept.masked_fill_(kept.softmax(dim=-1) == 0, float("-inf"))
    rows = (p < 1).nonzero().flatten()
    if rows.numel() == 0:
        return logits
    ordered, order = logits[rows].sort(dim=-1, descending=False)
    mass = ordered.softmax(dim=-1).cumsum(dim=-1)
    drop = mass <= (1 - p[rows].to(mass.dtype)).unsqueeze(-1)
    drop[:, -1] = False
    ordered = ordered.masked_fill(drop, float("-inf"))
    logits[rows] = torch.empty_like(ordered).scatter_(-1, order, ordered)
    return logits


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    if k is not None:
        logits = apply_top_k(logits, k)
    if p is not None:
        logits = apply_top_p(logits, p)
    return logits


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """-inf where a token's probability is below min_p times the row's largest probability."""
    probs = logits.softmax(dim=-1)
    floor = probs.amax(dim=-1, keepdim=True) * min_p.to(probs.dtype).unsqueeze(-1)
    return logits.masked_fill_(probs < floor, float("-inf"))


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor, all_random: bool) -> torch.Tensor:
    """Each row divided by its temperature; a greedy row (below SAMPLING_EPS) by 1 unless every row samples."""
    if not all_random:
        temperature = torch.where(temperature < SAMPLING_EPS, 1.0, temperature)
    return logits.div_(temperature.to(logits.dtype).unsqueeze(-1))


def apply_penalties(logits: torch.Tensor, prompt_ids: list[list[int]], output_ids: list[list[int]],
                    repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
    """vLLM's penalties: repetition (a token seen in the prompt or the output: a positive logit divided by the
    penalty, a non-positive one multiplied), then frequency (minus the penalty times the output count) and presence
    (minus the penalty where the output has the token)."""
    rows, vocab = logits.shape
    seen = torch.zeros((rows, vocab), dtype=torch.bool, device=logits.device)
    counts = torch.zeros((rows, vocab), dtype=logits.dtype, device=logits.device)
    for i in range(rows):
        if prompt_ids[i]:
            seen[i, torch.tensor(prompt_ids[i], device=logits.device)] = True
        for t in output_ids[i]:
            counts[i, t] += 1
    seen |= counts > 0
    rep = torch.where(seen, repetition.to(logits.dtype).unsqueeze(-1), 1.0)
    logits *= torch.where(logits > 0, 1.0 / rep, rep)
    logits -= frequency.to(logits.dtype).unsqueeze(-1) * counts
    logits -= presence.to(logits.dtype).unsqueeze(-1) * (counts > 0)
    return logits


def exponential_noise(shape, generators: dict[int, torch.Generator], device, dtype=torch.float32) -> torch.Tensor:
    """Exp(1) noise per row: a row with a generator draws from it alone, the others from the default generator."""
    q = torch.empty(shape, dtype=dtype, device=device)
    if len(generators) != shape[0]:
        q.exponential_()
    for row, gen in generators.items():
        q[row].exponential_(generator=gen)
    return q


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """A token per row drawn from `probs` by the exponential race (argmax of p / Exp(1)), which is a draw from p. A
    row with its own generator races only its tokens of positive probability (the others never win), so a request cut
    to a few tokens draws a few numbers, not a vocabulary's worth; the rows without one draw from the default
    generator together."""
    rows, vocab = probs.shape
    if not generators:
        return (probs / exponential_noise(probs.shape, {}, probs.device)).argmax(dim=-1)
    out = torch.empty(rows, dtype=torch.long, device=probs.device)
    others = [r for r in range(rows) if r not in generators]
    if others:
        idx = torch.tensor(others, device=probs.device)
        out[idx] = (probs[idx] / exponential_noise((len(others), vocab), {}, probs.device)).argmax(dim=-1)
    for row, gen in generators.items():
        support = (probs[row] > 0).nonzero().flatten()
        if support.numel() == 0:       # no token of positive probability (a NaN row): as the full race would
            q = torch.empty(vocab, dtype=probs.dtype, device=probs.device).exponential_(generator=gen)
            out[row] = (probs[row] / q).argmax()
            continue
        q = torch.empty(support.numel(), dtype=probs.dtype, device=probs.device).exponential_(generator=gen)
        out[row] = support[(probs[row, support] / q).argmax()]
    return out


class Sampler:
    """The reference sampler (see the module docstring for the contract a platform's sampler keeps)."""

    name = "reference_impl.sampling.Sampler"
    rejection_name = "reference_impl.sampling.rejection_sample"

    def apply_top_k_top_p(self, logits, k, p):
        return apply_top_k_top_p(logits, k, p)

    def sample(self, logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = logits.to(torch.float32)
        greedy = logits.argmax(dim=-1)
        if batch.all_greedy:
            return greedy, logits.log_softmax(dim=-1)
        logits = apply_temperature(logits, batch.temperature, batch.all_random)
        if batch.min_p is not None:
            logits = apply_min_p(logits, batch.min_p)
        logits = self.apply_top_k_top_p(logits, batch.top_k, batch.top_p)
        processed = logits.log_softmax(dim=-1)
        drawn = random_sample(logits.softmax(dim=-1), batch.generators)
        return torch.where(batch.temperature < SAMPLING_EPS, greedy, drawn), processed

    def rejection_sample(self, draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids,
                         recovered_token_ids, uniform_probs, is_greedy, max_spec_len):
        return rejection_sample(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids,
                                recovered_token_ids, uniform_probs, is_greedy, max_spec_len)

    def speculative_sample(self, draft_token_ids, num_draft_tokens, cu_num_draft_tokens, draft_probs, target_logits,
                           bonus_token_ids, generators):
        """Speculative decoding's whole step for sampling requests at temperature 1 (vLLM's `rejection_sample`):
        the uniforms, then the recovered tokens, from each request's generator, then the accept/reject kernel."""
        target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)
        uniforms = generate_uniform_probs(list(num_draft_tokens), generators, target_logits.device)
        recovered = sample_recovered_tokens(cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                                            generators)
        is_greedy = torch.zeros(len(num_draft_tokens), dtype=torch.bool, device=target_logits.device)
        return self.rejection_sample(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs,
                                     bonus_token_ids, recovered, uniforms, is_greedy, max(num_draft_tokens))


def rejection_sample(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids,
                     recovered_token_ids, uniform_probs, is_greedy, max_spec_len) -> torch.Tensor:
    """Speculative decoding's accept/reject, per request (rows of `cu_num_draft_tokens`): a greedy request accepts
    draft tokens while each is the target's argmax, a sampling one while target_prob / draft_prob >= its uniform
    (draft_probs None: draft_prob 1; a draft token < 0 or a draft_prob of 0 rejects); the first rejected position
    takes the recovered token (greedy: the target's argmax), and a request that accepted every draft token gets its
    bonus token. Output (requests, max_spec_len + 1) int32, PLACEHOLDER_TOKEN_ID after the last token."""
    batch = cu_num_draft_tokens.shape[0]
    out = torch.full((batch, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32,
                     device=target_probs.device)
    cu = cu_num_draft_tokens.tolist()
    drafts = draft_token_ids.tolist()
    argmax = target_probs.argmax(dim=-1).tolist()
    for req in range(batch):
        start = cu[req - 1] if req else 0
        rejected = False
        for pos in range(cu[req] - start):
            t = start + pos
            tok = drafts[t]
            if bool(is_greedy[req]):
                accepted = tok == argmax[t]
                fallback = argmax[t]
            else:
                fallback = int(recovered_token_ids[t])
                if tok < 0:
                    accepted = False
                else:
                    q = 1.0 if draft_probs is None else float(draft_probs[t, tok])
                    accepted = q > 0 and float(target_probs[t, tok]) / q >= float(uniform_probs[t])
            out[req, pos] = tok if accepted else fallback
            if not accepted:
                rejected = True
                break
        if not rejected:
            out[req, cu[req] - start] = int(bonus_token_ids[req])
    return out


def generate_uniform_probs(num_draft_tokens: list[int], generators: dict[int, torch.Generator], device):
    """float64 uniforms per draft token; a request with a generator draws its own (none for no draft tokens)."""
    u = torch.rand((sum(num_draft_tokens),), dtype=torch.float64, device=device)
    start = 0
    for req, n in enumerate(num_draft_tokens):
        if n and req in generators:
            u[start:start + n].uniform_(generator=generators[req])
        start += n
    return u


def sample_recovered_tokens(cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                            generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Per draft position, a token drawn from max(target - draft, 0) (draft_probs None: the target without the draft
    token), by the exponential race with one noise row per request."""
    batch = cu_num_draft_tokens.shape[0]
    cu = cu_num_draft_tokens.tolist()
    counts = [cu[i] - (cu[i - 1] if i else 0) for i in range(batch)]
    gens = {i: g for i, g in generators.items() if counts[i] > 0}
    q = exponential_noise((batch, target_probs.shape[-1]), gens, target_probs.device)
    rows = torch.repeat_interleave(torch.arange(batch, device=target_probs.device),
                                   torch.tensor(counts, device=target_probs.device))
    if draft_probs is None:
        residual = target_probs.clone()
        residual.scatter_(-1, draft_token_ids.long().clamp(min=0).unsqueeze(-1), 0.0)
    else:
        residual = (target_probs - draft_probs).clamp(min=0)
    return (residual / q[rows]).argmax(dim=-1).to(draft_token_ids.dtype)


class BatchSampler:
    """`logits [rows, vocab] -> tokens` for the runtime's generation loop (reference_impl.models.generate): every row
    with the same temperature, top_k (0: off), top_p (1: off) and min_p (0: off), in vLLM's order of processing
    (`Sampler.sample`, or `sampler`'s), one generator seeded with `seed` on the logits' device drawing for every row
    in turn. Temperature 0 is greedy."""

    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                 seed: int = 0, sampler=None):
        for name, value, ok in (("temperature", temperature, temperature >= 0), ("top_k", top_k, top_k >= 0),
                                ("top_p", top_p, 0 < top_p <= 1), ("min_p", min_p, 0 <= min_p <= 1)):
            if not ok:
                raise ValueError(f"{name}={value} is out of range (temperature >= 0, top_k >= 0, 0 < top_p <= 1, "
                                 "0 <= min_p <= 1)")
        self.temperature, self.top_k, self.top_p, self.min_p, self.seed = temperature, top_k, top_p, min_p, seed
        self.sampler = sampler or Sampler()
        self._generator: torch.Generator | None = None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        rows, vocab = logits.shape
        device = logits.device
        if self._generator is None:
            self._generator = torch.Generator(device=device).manual_seed(self.seed)

        def full(value, dtype):
            return torch.full((rows,), value, dtype=dtype, device=device)

        batch = SamplingBatch(
            full(self.temperature, torch.float32),
            top_k=full(min(self.top_k, vocab), torch.int32) if 0 < self.top_k < vocab else None,
            top_p=full(self.top_p, torch.float32) if self.top_p < 1 else None,
            min_p=full(self.min_p, torch.float32) if self.min_p > 0 else None,
            generators={row: self._generator for row in range(rows)})
        return self.sampler.sample(logits, batch)[0]


@dataclasses.dataclass(frozen=True)
class RequestParams:
    """One request's sampling parameters, with vLLM's `SamplingParams` meaning: temperature 0 is greedy, top_k 0,
    top_p 1 and min_p 0 are off; `seed` gives the request a generator of its own (its tokens are then the same alone
    or in any batch), None draws from the default generator; penalties 1 (repetition) and 0 (frequency, presence)
    are off. `stop_token_ids` end the request (the token kept as its last); `min_tokens` masks them, and the
    generation's end-of-sequence ids, until that many tokens are generated; `bad_words` are token-id lists, each
    banning its last id right after its other ids were generated (reference_impl/sampling/stops.py)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    bad_words: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "bad_words", tuple(tuple(w) for w in self.bad_words))
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens={self.min_tokens} must be at least 0")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids={list(self.stop_token_ids)} must be non-negative token ids")
        if any(not w or any(not isinstance(t, int) or t < 0 for t in w) for w in self.bad_words):
            raise ValueError(f"bad_words={[list(w) for w in self.bad_words]} must be non-empty lists of non-negative "
                             "token ids (the runtime has no tokenizer: give each word's ids)")
        for name, ok in (("temperature", self.temperature >= 0), ("top_k", self.top_k >= 0),
                         ("top_p", 0 < self.top_p <= 1), ("min_p", 0 <= self.min_p <= 1),
                         ("repetition_penalty", self.repetition_penalty > 0),
                         ("frequency_penalty", -2 <= self.frequency_penalty <= 2),
                         ("presence_penalty", -2 <= self.presence_penalty <= 2)):
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)} is out of range (temperature >= 0, top_k >= 0, "
                                 "0 < top_p <= 1, 0 <= min_p <= 1, repetition_penalty > 0, frequency_penalty and "
                                 "presence_penalty in [-2, 2], as vLLM's SamplingParams)")

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1 or self.frequency_penalty != 0 or self.presence_penalty != 0

    def masked(self, output, end_ids=()) -> set[int]:
        """The tokens min_tokens and bad_words mask at the step after `output`; `end_ids`: the generation's
        end-of-sequence ids, which min_tokens masks with the request's stop tokens."""
        return (stops.min_tokens_mask(self.min_tokens, set(self.stop_token_ids) | set(end_ids), output)
                | set(stops.bad_word_bans(self.bad_words, output)))


class RequestSampler:
    """The runtime's sampler for requests with parameters of their own (`reference_impl.models.generate` hands it the
    requests its rows belong to, every request's prompt and output so far, and its own stop tokens): each row's
    bad_words and min_tokens masks, then its penalties over its own prompt and output, then `sampler.sample` in
    vLLM's order with each row's temperature, top-k, top-p and min-p; a seeded request draws from its own generator,
    created on first use on the logits' device. `request_stop_token_ids(row)` tells generate() which tokens end
    that request."""

    takes_requests = True   # generate() calls it as sampler(logits, rows=, prompts=, outputs=, stop_token_ids=)

    def __init__(self, params, sampler=None):
        self.params = [p if isinstance(p, RequestParams) else RequestParams(**p) for p in params]
        self.sampler = sampler or Sampler()
        self._generators: dict[int, torch.Generator] = {}

    def request_stop_token_ids(self, row: int) -> tuple[int, ...]:
        """The tokens that end request `row` (its stop_token_ids)."""
        return self.params[row].stop_token_ids

    def __call__(self, logits: torch.Tensor, rows, prompts, outputs, stop_token_ids=()) -> torch.Tensor:
        """One token per row; `stop_token_ids`: the generation's own end-of-sequence ids, which min_tokens masks
        too (vLLM's all_stop_token_ids holds the EOS)."""
        rows = [int(r) for r in rows]
        if any(not 0 <= r < len(self.params) for r in rows):
            raise ValueError(f"rows {rows} name requests this sampler has no parameters for ({len(self.params)})")
        params = [self.params[r] for r in rows]
        device, vocab = logits.device, logits.shape[-1]
        logits = logits.to(torch.float32).clone()
        for i, (r, p) in enumerate(zip(rows, params)):
            stops.mask_row(logits, i, p.masked(outputs[r], stop_token_ids))

        def per_row(values, dtype):
            return torch.tensor(values, dtype=dtype, device=device)

        if any(p.penalised for p in params):
            logits = apply_penalties(logits, [list(prompts[r]) for r in rows], [list(outputs[r]) for r in rows],
                                     per_row([p.repetition_penalty for p in params], torch.float32),
                                     per_row([p.frequency_penalty for p in params], torch.float32),
                                     per_row([p.presence_penalty for p in params], torch.float32))
        generators = {}
        for i, (r, p) in enumerate(zip(rows, params)):
            if p.seed is not None:
                if r not in self._generators:
                    self._generators[r] = torch.Generator(device=device).manual_seed(p.seed)
                generators[i] = self._generators[r]
        batch = SamplingBatch(
            per_row([p.temperature for p in params], torch.float32),
            top_k=(per_row([p.top_k if 0 < p.top_k < vocab else vocab for p in params], torch.int32)
                   if any(0 < p.top_k < vocab for p in params) else None),
            top_p=per_row([p.top_p for p in params], torch.float32) if any(p.top_p < 1 for p in params) else None,
            min_p=per_row([p.min_p for p in params], torch.float32) if any(p.min_p > 0 for p in params) else None,
            generators=generators)
        return self.sampler.sample(logits, batch)[0]


def sampler_for(platform) -> object:
    """The sampler a platform brings (its `get_sampler()`), or the reference one."""
    get = getattr(platform, "get_sampler", None)
    return get() if callable(get) else Sampler()


__all__ = ["SAMPLING_EPS", "PLACEHOLDER_TOKEN_ID", "BatchSampler", "RequestParams", "RequestSampler", "Sampler",
           "SamplingBatch", "apply_min_p", "apply_penalties",
           "apply_temperature", "apply_top_k", "apply_top_k_top_p", "apply_top_p", "generate_uniform_probs",
           "random_sample", "rejection_sample", "sample_recovered_tokens", "sampler_for"]
