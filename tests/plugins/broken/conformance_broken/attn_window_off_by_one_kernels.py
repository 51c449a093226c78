"""Fault: the sliding window admits w+1 keys (j >= p - w) instead of w (j > p - w)."""

from conformance_broken.attention_base import Impl, make_backend


class WindowImpl(Impl):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.sliding_window is not None:
            self.sliding_window += 1     # the bug: the window bound is inclusive on both ends


Backend = make_backend("BROKEN_WINDOW", WindowImpl)
