"""Fault: every request is read as max_seq_len keys long (as far as its block-table row reaches), not its own
seq_lens[i]: keys past the sequence are attended and the causal offset moves."""

from conformance_broken.attention_base import Builder, make_backend


class MaxLenBuilder(Builder):
    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        md = super().build(common_prefix_len, common_attn_metadata, fast_build)
        reach = md.block_table.shape[1] * self.kv_cache_spec.block_size
        md.seq_lens = [min(md.max_seq_len, reach)] * len(md.seq_lens)    # the bug
        return md


Backend = make_backend("BROKEN_MAX_SEQ_LEN", builder=MaxLenBuilder)
