"""The shared hypothesis strategies of the IR ops and the one settings profile the harness uses."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_impl.ir.op import IrOp
from reference_impl.ir import strategies


def test_profile_writes_no_database_and_suppresses_only_named_health_checks():
    s = strategies.conformance_settings(7)
    assert s.max_examples == 7
    assert s.database is None and s.deadline is None
    assert set(s.suppress_health_check) == {HealthCheck.too_slow, HealthCheck.filter_too_much}
    assert strategies.conformance_settings(3).max_examples == 3   # registered once, reused


@given(r=strategies.rows(1024, (1.0, 2.0), layouts=(None,), width_step=128))
def test_rows_respect_their_bounds(r):
    assert 1 <= r.tokens <= strategies.MAX_TOKENS
    assert r.width % 128 == 0 and 128 <= r.width <= 1024
    assert r.scale in (1.0, 2.0) and r.layout is None
    assert repr(r).startswith("Rows(tokens=")   # the failure message lists every drawn field


@given(h=strategies.rope_heads())
def test_rope_heads_are_consistent(h):
    assert h.rotary_dim % 2 == 0 and h.head_size == h.rotary_dim + h.pass_dims
    assert h.q_heads % h.kv_heads == 0


@pytest.mark.parametrize("name", sorted(n for n, op in IrOp.registry.items() if op.property_args is not None))
def test_every_property_draw_labels_what_it_draws(name):
    op = IrOp.registry[name]

    @settings(strategies.conformance_settings(3))
    @given(st.data())
    def check(data):
        labels = []

        def draw(strategy, label=None):
            labels.append(label)
            return data.draw(strategy, label=label)

        args = op.property_args(draw, torch.float32, "cpu", torch.Generator().manual_seed(0))
        assert isinstance(args, tuple) and labels and all(labels), (name, labels)

    check()


def _seeded_draws() -> list:
    """100 seeded examples of integers and floats, as the property check draws them."""
    from hypothesis import seed

    seen = []

    @settings(strategies.conformance_settings(100))
    @seed(1234)
    @given(st.integers(0, 10**9), st.floats(-1e6, 1e6, allow_nan=False))
    def prop(i, f):
        seen.append((i, f))

    with strategies.draws_independent_of_loaded_code():
        prop()
    return seen


def test_draws_do_not_depend_on_the_literals_of_modules_loaded_later(tmp_path, monkeypatch):
    """A vendor's plugin module full of literals, imported between two runs, leaves the seeded draws as they were
    (hypothesis otherwise mixes every loaded local module's constants into its draws)."""
    import importlib
    import sys

    before = _seeded_draws()
    (tmp_path / "vendor_literals_mod.py").write_text(
        "".join(f"C{i} = {v!r}\n" for i, v in enumerate([123456789, 987654321, 31337, 0.987654321, -4242.5, 777.0])))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("vendor_literals_mod")
    try:
        assert _seeded_draws() == before
    finally:
        sys.modules.pop("vendor_literals_mod", None)
