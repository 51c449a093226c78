"""Fault: the fp8 KV cache is written and read without the layer's k/v scales (flashinfer#4979)."""

from conformance_broken.attention_base import Impl, make_backend


class UnscaledImpl(Impl):
    def _stored(self, x, scale, cache_dtype):
        return super()._stored(x, 1.0, cache_dtype)               # the bug: k_scale / v_scale ignored

    def _read(self, kv, scale):
        return super()._read(kv, 1.0)


Backend = make_backend("BROKEN_FP8_SCALES", UnscaledImpl)
