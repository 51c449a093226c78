"""Fault: a padded token's slot -1 is used as an index, so its key and value land in the cache's last slot
(vllm#43810)."""

from conformance_broken.attention_base import Impl, make_backend


class PaddedSlotImpl(Impl):
    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        slots = slot_mapping % (kv_cache.shape[0] * kv_cache.shape[2])   # the bug: -1 wraps to the last slot
        super().do_kv_cache_update(layer, key, value, kv_cache, slots)


Backend = make_backend("BROKEN_PADDED_SLOT", PaddedSlotImpl)
