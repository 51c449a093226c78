"""The `attention` family: a platform's attention backends graded on paged batches (docs/attention.md).

`checks` holds the check bodies (forward, cache_write, aliasing, steps, compile, dispatch), `units` the units over the
backends a platform brings, `diagnosis` what a failing backend computes instead. Importing the package declares the
family's checks (`conformance.checks.records` imports it).
"""

from conformance.checks.attention import checks  # noqa: F401 - declares the family's checks

__all__ = ["checks"]
