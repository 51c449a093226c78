"""Fault: forward computes into a tensor of its own and returns it, leaving `output` unwritten (vllm-ascend#6558)."""

import torch

from conformance_broken.attention_base import Impl, make_backend


class ReturningImpl(Impl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        result = torch.empty_like(output)                     # the bug: never copied into output
        return super().forward(layer, query, key, value, kv_cache, attn_metadata, result)


Backend = make_backend("BROKEN_RETURNS", ReturningImpl)
