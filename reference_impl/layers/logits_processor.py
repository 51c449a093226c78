"""LogitsProcessor: logits from hidden states through the LM head, soft-capped, scaled, padding dropped."""

from __future__ import annotations

import torch

from reference_impl.custom_op import PluggableLayer
from reference_impl.ir.cases import randn
from reference_impl.ir.tolerances import LINEAR_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases
from reference_impl.layers.vocab_parallel_embedding import ParallelLMHead, _init_rows


@PluggableLayer.register("logits_processor")
class LogitsProcessor(PluggableLayer):
    """`forward(lm_head, hidden_states, embedding_bias=None) -> [..., org_vocab_size]` logits.

    Steps (vLLM's order): this rank's logits `lm_head(hidden_states)` (+ `embedding_bias`, shaped
    like this rank's logits); all-gather over the tensor-parallel group (every rank gets the logits,
    where vLLM gathers to rank 0 only); keep the columns of token ids `0 .. org_vocab_size-1` in id
    order (the padding and added ids go); soft-cap `tanh(x / soft_cap) * soft_cap` when `soft_cap`
    is set; multiply by `scale`. With `logits_as_input`, `hidden_states` already are the logits
    (`lm_head` is ignored) and only the soft-cap and scale apply. A PluggableLayer, as in vLLM 0.32.
    """

    def __init__(self, vocab_size: int, org_vocab_size: int | None = None, scale: float = 1.0,
                 logits_as_input: bool = False, soft_cap: float | None = None):
        super().__init__()
        org_vocab_size = org_vocab_size or vocab_size
        if not 0 < org_vocab_size <= vocab_size:
            raise ValueError(f"LogitsProcessor: need 0 < org_vocab_size={org_vocab_size} <= vocab_size={vocab_size}")
        if soft_cap is not None and not soft_cap > 0:
            raise ValueError(f"LogitsProcessor: soft_cap={soft_cap!r} must be positive (or None)")
        self.vocab_size = vocab_size
        self.org_vocab_size = org_vocab_size
        self.scale = scale
        self.logits_as_input = logits_as_input
        self.soft_cap = soft_cap

    def forward_native(self, lm_head: ParallelLMHead | None, hidden_states: torch.Tensor,
                       embedding_bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.logits_as_input:
            logits = hidden_states
        else:
            logits = self._get_logits(lm_head, hidden_states, embedding_bias)
        if self.soft_cap is not None:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        if self.scale != 1.0:
            logits = logits * self.scale
        return logits

    def _get_logits(self, lm_head, hidden_states, embedding_bias):
        if lm_head is None:
            raise ValueError("LogitsProcessor needs an lm_head unless logits_as_input=True")
        if lm_head.num_embeddings < self.org_vocab_size:
            raise ValueError(f"LogitsProcessor: org_vocab_size={self.org_vocab_size} exceeds the LM head's "
                             f"{lm_head.num_embeddings} ids")
        logits = lm_head(hidden_states)
        if embedding_bias is not None:
            logits = logits + embedding_bias
        logits = lm_head.tp_group.all_gather(logits, dim=-1)
        ranges = lm_head.gathered_ranges(self.org_vocab_size)
        if len(ranges) == 1:
            start, end = ranges[0]
            return logits[..., start:end]
        return torch.cat([logits[..., start:end] for start, end in ranges], dim=-1)

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, org_vocab_size={self.org_vocab_size}, scale={self.scale}, "
                f"logits_as_input={self.logits_as_input}, soft_cap={self.soft_cap}")


# ----- conformance cases (single rank) ---------------------------------------------------------------
def _lm_head(vocab, dim, dtype, gen, org=None):
    head = ParallelLMHead(vocab, dim, params_dtype=dtype, org_num_embeddings=org)
    _init_rows(head, gen)
    return head


def _case(name, tokens, vocab, dim, *, org=None, logits_as_input=False, level="quick", **kwargs):
    def make_inputs(dtype, device, gen):
        if logits_as_input:
            return (None, randn((tokens, vocab), dtype, device, gen, scale=20.0))
        head = _lm_head(vocab, dim, dtype, gen, org).to(device)
        return (head, randn((tokens, dim), dtype, device, gen))

    return LayerCase(name, lambda dtype: {"vocab_size": vocab, "org_vocab_size": org,
                                          "logits_as_input": logits_as_input, **kwargs}, make_inputs, level=level)


declare_cases(LogitsProcessor, tolerances=LINEAR_TOLERANCES, cases=[
    _case("tokens=5,vocab=300,dim=65", 5, 300, 65),
    _case("tokens=4,vocab=300,dim=32,scale=0.5,soft_cap=3", 4, 300, 32, scale=0.5, soft_cap=3.0),
    _case("tokens=3,vocab=1026,org=1010,dim=16", 3, 1026, 16, org=1010),
    _case("tokens=6,vocab=257,logits_as_input,soft_cap=30", 6, 257, 0, logits_as_input=True, soft_cap=30.0),
    _case("tokens=64,vocab=32000,dim=256", 64, 32000, 256, level="standard"),
])
