"""Control: vLLM's sampling semantics computed another way: top-k by torch.topk's k-th value, top-p on a descending
sort (a token is kept while the mass before it is below p), draws by torch.multinomial with each request's
generator, the rejection sampler vectorised over positions. (A descending sort's float32 cumulative mass reaches 1
before the last tokens, so at p = 1 it would drop them: this twin keeps every token there, as vLLM's ascending
rule does.)"""

import torch

from reference_impl import sampling as rs


def apply_top_k_top_p(logits, k, p):
    if logits.shape[0] == 0:      # no requests (a speculative step without draft positions): nothing to mask
        return logits
    if k is not None:
        vocab = logits.shape[-1]
        kk = k.to(torch.long).clamp(1, vocab)
        kth = logits.topk(int(kk.max()), dim=-1).values.gather(-1, (kk - 1).unsqueeze(-1))
        kth = torch.where((kk >= vocab).unsqueeze(-1), float("-inf"), kth)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p is not None:
        ordered, order = logits.sort(dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs
        drop = before >= p.to(probs.dtype).unsqueeze(-1)
        drop &= (p < 1).unsqueeze(-1)   # float32 mass before the tail can reach 1: p = 1 keeps every token
        drop[:, 0] = False
        logits = torch.empty_like(logits).scatter_(-1, order, ordered.masked_fill(drop, float("-inf")))
    return logits


class Sampler(rs.Sampler):
    name = "conformance_broken.sampling_control_kernels.Sampler"
    rejection_name = "conformance_broken.sampling_control_kernels.Sampler.rejection_sample"

    def apply_top_k_top_p(self, logits, k, p):
        return apply_top_k_top_p(logits, k, p)

    def sample(self, logits, batch):
        logits = logits.to(torch.float32)
        greedy = logits.argmax(dim=-1)
        if batch.all_greedy:
            return greedy, logits.log_softmax(dim=-1)
        temp = torch.where(batch.temperature < rs.SAMPLING_EPS, 1.0, batch.temperature)
        logits = logits / temp.unsqueeze(-1)
        if batch.min_p is not None:
            probs = logits.softmax(dim=-1)
            logits = logits.masked_fill(probs < probs.amax(-1, keepdim=True) * batch.min_p.unsqueeze(-1),
                                        float("-inf"))
        logits = apply_top_k_top_p(logits, batch.top_k, batch.top_p)
        probs = logits.softmax(dim=-1)
        drawn = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        for row in range(logits.shape[0]):
            drawn[row] = torch.multinomial(probs[row], 1, generator=batch.generators.get(row))[0]
        return torch.where(batch.temperature < rs.SAMPLING_EPS, greedy, drawn), logits.log_softmax(dim=-1)

    def rejection_sample(self, draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids,
                         recovered_token_ids, uniform_probs, is_greedy, max_spec_len):
        batch = cu_num_draft_tokens.shape[0]
        out = torch.full((batch, max_spec_len + 1), -1, dtype=torch.int32, device=target_probs.device)
        ends = cu_num_draft_tokens.long()
        starts = torch.cat([ends.new_zeros(1), ends[:-1]])
        drafts = draft_token_ids.long()
        safe = drafts.clamp(min=0)
        target = target_probs.gather(-1, safe.unsqueeze(-1)).squeeze(-1).double()
        draft = (torch.ones_like(target) if draft_probs is None
                 else draft_probs.gather(-1, safe.unsqueeze(-1)).squeeze(-1).double())
        argmax = target_probs.argmax(dim=-1)
        random_ok = (drafts >= 0) & (draft > 0) & (target >= uniform_probs.double() * draft)
        for req in range(batch):
            s, e = int(starts[req]), int(ends[req])
            greedy = bool(is_greedy[req])
            ok = (drafts[s:e] == argmax[s:e]) if greedy else random_ok[s:e]
            fallback = argmax[s:e] if greedy else recovered_token_ids[s:e].long()
            n = int(ok.long().cumprod(0).sum()) if e > s else 0
            out[req, :n] = drafts[s:s + n].to(torch.int32)
            out[req, n] = int(fallback[n]) if n < e - s else int(bonus_token_ids.reshape(-1)[req])
        return out
