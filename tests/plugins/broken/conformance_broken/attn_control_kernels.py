"""Control: a correct backend that computes sinks while declaring them unsupported (as vLLM 0.32's CPU_ATTN does):
every attention check passes, and dispatch says to declare sinks."""

from conformance_broken.attention_base import make_backend

Backend = make_backend("CONTROL_ATTN", supports_sink=False)
