"""Fault: a chunked-prefill request (more than one new token) attends to its new tokens only, not to its context in
the cache (a prefill path run on the new keys alone)."""

import torch

from conformance_broken.attention_base import Impl, make_backend


class NoContextImpl(Impl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        super().forward(layer, query, key, value, kv_cache, attn_metadata, output)
        if attn_metadata is None:
            return output
        qsl = attn_metadata.query_start_loc
        for start, end in zip(qsl[:-1], qsl[1:]):
            if end - start > 1:                                   # the bug: the prefill path ignores the cache
                k, v = key[start:end].to(torch.float32), value[start:end].to(torch.float32)
                output[start:end] = self._attend(query[start:end].to(torch.float32), k, v, end - start,
                                                 attn_metadata.causal, encoder=False).to(output.dtype)
        return output


Backend = make_backend("BROKEN_CONTEXT", NoContextImpl)
