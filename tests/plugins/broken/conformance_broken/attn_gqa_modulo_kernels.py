"""Fault: query head h reads kv head h % KVH instead of h // (H / KVH)."""

from conformance_broken.attention_base import Impl, make_backend


class ModuloImpl(Impl):
    def _per_query_head(self, x):
        return x.repeat(1, self.num_heads // self.num_kv_heads, 1)   # the bug: tiles heads instead of interleaving


Backend = make_backend("BROKEN_GQA", ModuloImpl)
