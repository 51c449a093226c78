"""What an older release of the software under a bridge lacks, as an exception the checks can recognise.

A bridge (conformance/vllm/) adapts the reference's contract onto the release a vendor pins. Where that release
cannot be asked what a case asks (a constructor argument it never took, a selector flag it does not know), the
bridge raises `ReleaseLacks`: the case is then graded NOT_SUPPORTED naming the release, not ERROR, since the
platform under test did nothing wrong. It lives here, below both the checks and the bridges, so the checks recognise
it without importing a bridge (tests/project/test_import_graph.py keeps that layering).
"""

from __future__ import annotations

from conformance.collect.exception_chain import in_chain


class ReleaseLacks(NotImplementedError):
    """`software` `installed` (e.g. vLLM 0.31.0) lacks `what`, which `software` `first` added (None: not known).

    A NotImplementedError, so code that treats it as a refusal still does; its message names the release and what
    to install to grade the case."""

    def __init__(self, software: str, installed: str, what: str, first: str | None = None):
        self.software = software
        self.installed = installed
        self.what = what
        self.first = first
        since = f"{software} {first} added it" if first else f"a later {software} release has it"
        install = f"install {software} {first} or newer" if first else f"install a newer {software}"
        super().__init__(f"{software} {installed} lacks {what} ({since}); {install} to grade it")


def release_lacks(exc: BaseException | None) -> ReleaseLacks | None:
    """The ReleaseLacks `exc` is, or was raised from (its __cause__/__context__ chain), else None."""
    return in_chain(exc, ReleaseLacks)
