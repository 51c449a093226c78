"""vLLM's CPU attention backend with the plugin's metadata builder: `Stale*` reuses the previous step's seq_lens on
decode steps that do not grow the batch; `Fresh*` is the same code reading the batch's own seq_lens."""

import dataclasses

from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionMetadataBuilder


class StaleSeqLensBuilder(CPUAttentionMetadataBuilder):
    keeps_seq_lens = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.previous_seq_lens = None

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        md = common_attn_metadata
        previous = self.previous_seq_lens
        decode_only = md.max_query_len == 1
        if self.keeps_seq_lens and decode_only and previous is not None and md.num_reqs <= previous.numel():
            # the planted fault: one more token for each row of the previous step, whoever holds that row now
            seq_lens = previous[: md.num_reqs] + 1
            md = dataclasses.replace(md, seq_lens=seq_lens, max_seq_len=int(seq_lens.max()))
        self.previous_seq_lens = md.seq_lens.clone()
        return super().build(common_prefix_len, md, fast_build)


class FreshSeqLensBuilder(StaleSeqLensBuilder):
    keeps_seq_lens = False


class StaleCpuAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_builder_cls():
        return StaleSeqLensBuilder


class FreshCpuAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_builder_cls():
        return FreshSeqLensBuilder
