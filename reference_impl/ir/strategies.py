"""Labelled hypothesis strategies for the IR ops' property draws, and the one settings profile they run under.

Op modules describe *what* to draw (rows of a given width, heads of a rotary input, quant groups)
with the strategies below; `conformance.checks.numerics.ir_property` runs the draws under
`conformance_settings()`. Each strategy yields a small frozen record whose repr names every drawn
field, so a failure message lists the exact draw. hypothesis is imported when a strategy is built,
not when an op module is imported, so using the runtime does not import it. Strategies are immutable, so each
is built once per set of arguments and reused: building one costs hypothesis more than drawing from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

PROFILE = "reference-impl-conformance"
LAYOUTS = (None, "strided", "row_strided")
MAX_TOKENS = 9   # rows 1 (which torch.compile specialises) to a few odd and even batches


@dataclasses.dataclass(frozen=True)
class Rows:
    """A `[tokens, width]` input: `scale` is the value magnitude, `layout` None / strided / row_strided."""

    tokens: int
    width: int
    scale: float
    layout: str | None


@dataclasses.dataclass(frozen=True)
class RopeHeads:
    """A rotary input: query heads are `kv_heads * group`; `head_size = rotary_dim + pass_dims`."""

    tokens: int
    kv_heads: int
    group: int
    rotary_dim: int
    pass_dims: int
    neox: bool

    @property
    def q_heads(self) -> int:
        return self.kv_heads * self.group

    @property
    def head_size(self) -> int:
        return self.rotary_dim + self.pass_dims


@functools.cache
def rows(max_width: int, scales: tuple[float, ...], layouts: tuple[str | None, ...] = LAYOUTS,
         width_step: int = 1):
    """Rows of width `width_step * k` for k in 1..max_width/width_step, one of `scales`, one of `layouts`."""
    from hypothesis import strategies as st

    return st.builds(Rows, tokens=st.integers(1, MAX_TOKENS),
                     width=st.integers(1, max_width // width_step).map(lambda k: k * width_step),
                     scale=st.sampled_from(scales), layout=st.sampled_from(layouts))


@functools.cache
def rope_heads(max_kv_heads: int = 4, max_group: int = 3, max_half_rotary: int = 64, max_pass_dims: int = 40):
    """Rotary shapes: GQA groups, even rotary dims up to 2*max_half_rotary, pass-through dims, both styles."""
    from hypothesis import strategies as st

    return st.builds(RopeHeads, tokens=st.integers(1, MAX_TOKENS), kv_heads=st.integers(1, max_kv_heads),
                     group=st.integers(1, max_group),
                     rotary_dim=st.integers(1, max_half_rotary).map(lambda h: 2 * h),
                     pass_dims=st.integers(0, max_pass_dims), neox=st.booleans())


@functools.cache
def flags():
    """An optional argument present or not (weight, per_token, ...)."""
    from hypothesis import strategies as st

    return st.booleans()


@functools.lru_cache(maxsize=4096)
def optional_size(max_size: int):
    """None, or a size in 1..max_size (variance_size)."""
    from hypothesis import strategies as st

    return st.one_of(st.none(), st.integers(1, max_size))


def conformance_settings(max_examples: int):
    """The registered profile with this run's example count: no example database (nothing written in the
    vendor's directory), no deadline (first calls compile kernels), the draw printed by the harness itself."""
    from hypothesis import HealthCheck, settings
    from hypothesis.errors import InvalidArgument

    try:
        profile = settings.get_profile(PROFILE)
    except InvalidArgument:
        settings.register_profile(
            PROFILE, database=None, deadline=None, print_blob=False,
            suppress_health_check=[
                HealthCheck.too_slow,          # every example builds tensors and runs a kernel (Triton interpreter)
                HealthCheck.filter_too_much,   # assume() drops draws the provider's supports_args declines
            ])
        profile = settings.get_profile(PROFILE)
    return settings(profile, max_examples=max_examples)


@contextlib.contextmanager
def draws_independent_of_loaded_code():
    """Hypothesis mixes literals of every loaded local module into its draws (its "local constants"), so the
    same seed would draw differently once a vendor's plugin, or any other module, is imported. Inside this block
    it sees none: the draws depend on the seed and hypothesis's version only. Hypothesis keeps this in private
    names; where they are missing (another version) the block changes nothing."""
    try:
        from hypothesis.internal.conjecture import providers
        empty = providers.Constants()
        saved = providers._get_local_constants
        cache = providers.CONSTANTS_CACHE.cache
    except (ImportError, AttributeError):
        yield
        return
    cache.clear()  # permitted-value pools computed from earlier local constants
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = saved
        cache.clear()
