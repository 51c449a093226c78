"""Fault: attention sinks accepted and dropped (vLLM's Transformers backend, vllm#52156)."""

from conformance_broken.attention_base import Impl, make_backend


class NoSinksImpl(Impl):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sinks = None                # the bug


Backend = make_backend("BROKEN_SINKS", NoSinksImpl)
