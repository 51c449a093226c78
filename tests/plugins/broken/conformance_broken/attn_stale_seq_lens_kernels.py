"""Fault: the builder's persistent seq_lens buffer is refreshed only when a batch is larger than any before, so a
batch no larger than an earlier one runs on stale lengths (vllm-ascend#6158)."""

from conformance_broken.attention_base import Builder, make_backend


class StaleBuilder(Builder):
    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        md = super().build(common_prefix_len, common_attn_metadata, fast_build)
        kept = getattr(self, "_seq_lens", None)
        if kept is None or len(md.seq_lens) > len(kept):
            self._seq_lens = list(md.seq_lens)
        else:
            md.seq_lens = kept[: len(md.seq_lens)]                 # the bug: not reset for this batch
        return md


Backend = make_backend("BROKEN_STALE_SEQ_LENS", builder=StaleBuilder)
