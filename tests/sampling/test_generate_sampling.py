"""The reference runtime's generation with vLLM's sampling semantics: `reference_impl.sampling.BatchSampler` and
`python -m reference_impl.generate --top-p/--min-p`."""

from __future__ import annotations

import pytest
import torch

from reference_impl.sampling import BatchSampler


def test_greedy_is_the_argmax_and_a_small_top_p_keeps_only_the_likeliest():
    logits = torch.randn((5, 40), generator=torch.Generator().manual_seed(0)) * 3
    assert torch.equal(BatchSampler()(logits), logits.argmax(-1))
    assert torch.equal(BatchSampler(temperature=1.0, top_p=1e-6, seed=3)(logits), logits.argmax(-1))


def test_min_p_and_top_k_bound_what_is_drawn_and_the_seed_reproduces_it():
    logits = torch.randn((64, 40), generator=torch.Generator().manual_seed(1)) * 3
    draw = BatchSampler(temperature=1.0, top_k=3, min_p=0.2, seed=5)
    tokens = draw(logits)
    top3 = logits.topk(3, dim=-1).indices
    assert bool((tokens.unsqueeze(-1) == top3).any(-1).all())
    probs = logits.softmax(-1)
    assert bool((probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) >= 0.2 * probs.amax(-1)).all())
    assert torch.equal(BatchSampler(temperature=1.0, top_k=3, min_p=0.2, seed=5)(logits), tokens)
    assert not torch.equal(BatchSampler(temperature=1.0, top_k=3, min_p=0.2, seed=6)(logits), tokens)


@pytest.mark.parametrize("kwargs,name", [({"top_p": 0.0}, "top_p=0.0"), ({"min_p": 1.5}, "min_p=1.5"),
                                         ({"temperature": -1.0}, "temperature=-1.0")])
def test_out_of_range_parameters_are_refused_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        BatchSampler(**kwargs)


def test_the_command_line_refuses_a_top_p_outside_0_1(capsys):
    from reference_impl.generate import build_parser, validate

    parser = build_parser()
    args = parser.parse_args(["--random", "tiny", "--prompt-ids", "1,2", "--max-new-tokens", "2", "--top-p", "0"])
    with pytest.raises(SystemExit) as exc:
        validate(parser, args)
    assert exc.value.code == 2 and "--top-p must be in (0, 1]" in capsys.readouterr().err


# ----- per-request parameters in the runtime's generation (reference_impl.sampling.RequestSampler) --------------
def _tiny():
    from reference_impl.models import DecoderConfig, build_model

    return build_model(DecoderConfig(), torch.float32, seed=2)


def _generate(model, prompts, params, new=8):
    from reference_impl.models import generate
    from reference_impl.sampling import RequestSampler

    return generate(model, prompts, new, cache=model.allocate_kv_cache(len(prompts), 32),
                    sampler=RequestSampler(params)).tokens


def test_a_seeded_request_gives_the_same_tokens_alone_and_in_any_batch():
    from reference_impl.sampling import RequestParams

    model = _tiny()
    seeded = RequestParams(temperature=1.0, top_k=50, seed=11)
    alone = _generate(model, [[5, 17, 3, 99, 42, 7]], [seeded])[0]
    torch.manual_seed(123)   # the unseeded requests below draw from the default generator: not the seeded one's
    batch = _generate(model, [[8, 1, 250], [5, 17, 3, 99, 42, 7], [60, 61, 62]],
                      [RequestParams(temperature=0.7), seeded, RequestParams(temperature=1.3, top_p=0.9)])
    assert batch[1] == alone
    assert _generate(model, [[5, 17, 3, 99, 42, 7]], [RequestParams(temperature=1.0, top_k=50, seed=12)])[0] != alone
    greedy = _generate(model, [[5, 17, 3, 99, 42, 7]], [RequestParams()])[0]
    assert _generate(model, [[8, 1, 250], [5, 17, 3, 99, 42, 7]], [seeded, RequestParams()])[1] == greedy


def test_penalties_act_on_each_requests_own_prompt_and_output():
    from reference_impl.sampling import RequestParams

    model = _tiny()
    prompt = [5, 17, 3, 99, 42, 7]
    plain = _generate(model, [prompt], [RequestParams()], new=12)[0]
    # a repetition penalty this large makes every token seen in the prompt or the output so far the least likely
    fresh = _generate(model, [prompt, [8, 1, 250]], [RequestParams(repetition_penalty=1e6), RequestParams()],
                      new=12)
    assert len(set(fresh[0])) == len(fresh[0]) and not set(fresh[0]) & set(prompt)
    assert fresh[1] == _generate(model, [[8, 1, 250]], [RequestParams()], new=12)[0]   # the other row untouched
    assert plain == _generate(model, [prompt], [RequestParams(repetition_penalty=1.0)], new=12)[0]


@pytest.mark.parametrize("kwargs,name", [({"repetition_penalty": 0.0}, "repetition_penalty=0.0"),
                                         ({"frequency_penalty": 3.0}, "frequency_penalty=3.0"),
                                         ({"top_k": -1}, "top_k=-1")])
def test_request_parameters_out_of_range_are_refused_by_name(kwargs, name):
    from reference_impl.sampling import RequestParams

    with pytest.raises(ValueError, match=name):
        RequestParams(**kwargs)


def test_rows_without_parameters_are_refused():
    from reference_impl.sampling import RequestParams, RequestSampler

    with pytest.raises(ValueError, match=r"rows \[0, 2\] name requests this sampler has no parameters for \(2\)"):
        RequestSampler([RequestParams(), RequestParams()])(torch.zeros(2, 8), rows=[0, 2], prompts=[[1], [2], [3]],
                                                            outputs=[[], [], []])


# ----- min_tokens, stop tokens and bad words per request (reference_impl/sampling/stops.py) --------------------
PROMPT = [5, 17, 3, 99, 42, 7]


def _one(params, new=8, stop_token_ids=()):
    from reference_impl.models import generate
    from reference_impl.sampling import RequestSampler

    model = _tiny()
    return generate(model, [PROMPT], new, cache=model.allocate_kv_cache(1, 32), sampler=RequestSampler([params]),
                    stop_token_ids=stop_token_ids).tokens[0]


def test_min_tokens_holds_back_the_stop_tokens_then_a_stop_token_ends_the_request():
    from reference_impl.sampling import RequestParams

    plain = _one(RequestParams())
    stop = [plain[0]]      # the first choice: min_tokens must mask it
    for _ in range(6):     # add the token taken right after min_tokens until a stop token ends the request there
        got = _one(RequestParams(min_tokens=3, stop_token_ids=stop))
        if len(got) == 4 and got[-1] in stop:
            break
        stop.append(got[3])
    assert len(got) == 4 and got[-1] in stop and not set(got[:3]) & set(stop)
    assert _one(RequestParams(stop_token_ids=stop)) == plain[:1]     # without min_tokens it ends at once


def test_min_tokens_masks_the_generations_end_of_sequence_too():
    from reference_impl.sampling import RequestParams

    eos = _one(RequestParams())[0]
    assert _one(RequestParams(), stop_token_ids=[eos]) == [eos]
    held = _one(RequestParams(min_tokens=2), stop_token_ids=[eos])
    assert eos not in held[:2] and len(held) > 2


def test_bad_words_ban_a_token_always_or_right_after_their_other_tokens_and_never_match_the_prompt():
    from reference_impl.sampling import RequestParams

    plain = _one(RequestParams())
    single = _one(RequestParams(bad_words=[[plain[0]]]))
    assert plain[0] not in single
    k = next(i for i in range(1, 7) if plain[i] != plain[i + 1])
    pair = _one(RequestParams(bad_words=[[plain[k], plain[k + 1]]]))
    assert pair[:k + 1] == plain[:k + 1] and pair[k + 1] != plain[k + 1]
    assert _one(RequestParams(bad_words=[[PROMPT[-1], plain[0]]]))[0] == plain[0]   # the prompt does not count


def test_a_sampled_request_draws_past_a_banned_first_choice():
    from reference_impl.sampling import RequestParams

    model = _tiny()
    logits = model(torch.tensor(PROMPT), torch.arange(len(PROMPT)))[-1]
    first, second = logits.topk(2).indices.tolist()
    assert _one(RequestParams(temperature=1.0, top_k=1, seed=3, bad_words=[[first]]), new=1) == [second]


@pytest.mark.parametrize("kwargs,says", [({"min_tokens": -1}, "min_tokens=-1"),
                                         ({"stop_token_ids": [3, -1]}, r"stop_token_ids=\[3, -1\]"),
                                         ({"bad_words": [[4], []]}, r"bad_words=\[\[4\], \[\]\] must be non-empty")])
def test_stop_and_bad_word_parameters_out_of_range_are_refused_by_name(kwargs, says):
    from reference_impl.sampling import RequestParams

    with pytest.raises(ValueError, match=says):
        RequestParams(**kwargs)


def test_a_bad_word_outside_the_vocabulary_is_refused_when_sampling():
    from reference_impl.sampling import RequestParams

    with pytest.raises(ValueError, match=r"token ids \[100000\] \(stop_token_ids or bad_words\) are outside the "
                                         r"vocabulary"):
        _one(RequestParams(bad_words=[[100000]]))
