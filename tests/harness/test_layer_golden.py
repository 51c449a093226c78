"""numerics.layer_case grades a replacement against the float64 run of the in-tree layer, also when the
replacement's class cannot be built without its own constructor (as the vLLM bridge's wrappers, whose state
lives in attributes set there): the float64 copy of the reference layer is the in-tree class, not the
replacement a deep copy would otherwise construct through CustomOp.__new__."""

from __future__ import annotations

import torch

from conformance.checks import CheckContext, run_unit
from conformance.collect.units import Unit
from reference_impl.custom_op import CustomOp
from reference_impl.layers.rotary_embedding import RotaryEmbedding
from reference_impl.platforms import Platform, PlatformEnum, activate_platform
from reference_impl.ir.ops.rotary import apply_rope


class _Oot(Platform):
    _enum = PlatformEnum.OOT
    device_name = device_type = "cpu"
    supported_dtypes = [torch.float32, torch.float16, torch.bfloat16]


class PreciseRotary(RotaryEmbedding):
    """Rotates in float64 and rounds once (closer to float64 than native at large magnitudes), and like the
    bridge's wrappers keeps state that only its constructor sets."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "helper", object())

    def _apply(self, fn, recurse=True):
        self.helper   # noqa: B018 - raises AttributeError on an instance its constructor did not build
        return super()._apply(fn, recurse)

    def forward_oot(self, positions, query, key=None):
        cache = self.cos_sin_cache.double()
        out = [apply_rope(positions, t.double(), self.head_size, cache, self.is_neox_style).to(t.dtype)
               for t in (query, key)]
        return out[0], out[1]


def test_a_replacement_closer_to_float64_than_native_passes_through_the_golden_run():
    CustomOp.register_oot(_decorated_op_cls=PreciseRotary, name="RotaryEmbedding")
    try:
        with activate_platform(_Oot()) as platform:
            ctx = CheckContext("oot", platform, seed=1234, level="standard")
            unit = Unit("numerics", "layer_case", "rotary_embedding", "PreciseRotary", "bfloat16",
                        "tokens=3,heads=2/1,head=64,large,neox")
            verdict, _ = run_unit(ctx, unit)
    finally:
        CustomOp.unregister_oot("RotaryEmbedding")
    assert verdict.outcome.name == "PASS", verdict.message
    assert "at least as close to the float64 result as native" in verdict.message
