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
