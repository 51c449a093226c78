"""Fault: logits_soft_cap accepted and never applied (vllm-metal's hard-coded 0.0, vllm-ascend's unused argument)."""

from conformance_broken.attention_base import Impl, make_backend


class NoCapImpl(Impl):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.logits_soft_cap = None      # the bug


Backend = make_backend("BROKEN_SOFTCAP", NoCapImpl)
