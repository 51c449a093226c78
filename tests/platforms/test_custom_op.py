"""CustomOp and PluggableLayer: registries, register_oot forms, replacement, enablement, dispatch."""

from __future__ import annotations

import itertools

import pytest
import torch

from reference_impl.config import CompilationConfig, CompilationMode, RuntimeConfig, set_current_config
from reference_impl.custom_op import CustomOp, PluggableLayer
from reference_impl.layers.layernorm import RMSNorm
from reference_impl.platforms import (
    CpuPlatform,
    CudaPlatform,
    Platform,
    PlatformEnum,
    RocmPlatform,
    TpuPlatform,
    XpuPlatform,
    activate_platform,
)

_ids = itertools.count()


class OotPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name = "fakeoot"


def _config(*custom_ops, mode=CompilationMode.NONE):
    return set_current_config(RuntimeConfig(CompilationConfig(mode=mode, custom_ops=list(custom_ops))))


def _new_op_class(with_cuda=True, with_hip=False):
    """A fresh in-tree CustomOp class whose forwards return their own name."""
    name = f"toy_op_{next(_ids)}"
    body = {
        "forward_native": lambda self, x: "native",
        "forward_cpu": lambda self, x: "cpu",
        "forward_xpu": lambda self, x: "xpu",
    }
    if with_cuda:
        body["forward_cuda"] = lambda self, x: "cuda"
    if with_hip:
        body["forward_hip"] = lambda self, x: "hip"
    cls = type(f"Toy{next(_ids)}", (CustomOp,), body)
    return CustomOp.register(name)(cls)


@pytest.mark.parametrize("platform, expected", [
    (CpuPlatform(), "cpu"),
    (CudaPlatform(), "cuda"),
    (RocmPlatform(), "cuda"),        # no forward_hip: falls back to forward_cuda
    (XpuPlatform(), "xpu"),
    (TpuPlatform(), "native"),       # no forward_tpu: falls back to forward_native
    (OotPlatform(), "native"),       # no forward_oot: falls back to forward_native
])
def test_dispatch_per_platform_with_fallbacks(platform, expected):
    cls = _new_op_class()
    with activate_platform(platform), _config("all"):
        assert cls()(None) == expected


def test_rocm_prefers_forward_hip_and_cuda_missing_falls_to_native():
    with activate_platform(RocmPlatform()), _config("all"):
        assert _new_op_class(with_hip=True)()(None) == "hip"
    with activate_platform(CudaPlatform()), _config("all"):
        assert _new_op_class(with_cuda=False)()(None) == "native"


def test_enablement_from_custom_ops():
    cls = _new_op_class()
    name = cls.name
    with activate_platform(CpuPlatform()):
        with _config("none"):
            assert cls()(None) == "native" and not cls.enabled()
        with _config("none", f"+{name}"):
            assert cls()(None) == "cpu" and cls.enabled()
        with _config("all", f"-{name}"):
            assert cls()(None) == "native"
        with _config(mode=CompilationMode.REFERENCE_COMPILE):   # inductor + compile: none by default
            assert cls()(None) == "native" and not cls.default_on()
        with _config(mode=CompilationMode.NONE):                # eager: all by default
            assert cls()(None) == "cpu" and cls.default_on()
        with _config("none"):
            assert cls(enforce_enable=True)(None) == "cpu"


def test_register_duplicate_name_raises():
    cls = _new_op_class()
    other = type("Other", (CustomOp,), {"forward_native": lambda self, x: x})
    with pytest.raises(ValueError, match=f"'{cls.name}' is already registered"):
        CustomOp.register(cls.name)(other)
    assert CustomOp.op_registry[cls.name] is cls


def _replacement_forms():
    def positional(base):
        @CustomOp.register_oot(base.__name__)
        class R(base):
            def forward_oot(self, x):
                return "oot"
        return R

    def keyword(base):
        @CustomOp.register_oot(name=base.__name__)
        class R(base):
            def forward_oot(self, x):
                return "oot"
        return R

    def on_class(base):
        @base.register_oot
        class R(base):
            def forward_oot(self, x):
                return "oot"
        return R

    def no_decorator(base):
        class R(base):
            def forward_oot(self, x):
                return "oot"
        return CustomOp.register_oot(_decorated_op_cls=R, name=base.__name__)

    return [positional, keyword, on_class, no_decorator]


@pytest.mark.parametrize("form", _replacement_forms(), ids=lambda f: f.__name__)
def test_register_oot_forms_replace_at_construction(form):
    base = _new_op_class()
    replacement = form(base)
    try:
        assert CustomOp.op_registry_oot[base.__name__] is replacement
        with activate_platform(OotPlatform()), _config("all"):
            layer = base()
            assert type(layer) is replacement
            assert layer(None) == "oot"
        with activate_platform(OotPlatform()), _config("none"):
            assert base()(None) == "native"
    finally:
        CustomOp.unregister_oot(base.__name__)
    assert type(base()) is base


def test_register_oot_without_name_on_base_class_is_an_error():
    with pytest.raises(ValueError, match="needs the name"):
        CustomOp.register_oot(_decorated_op_cls=type("X", (CustomOp,), {}))


def test_replacement_that_is_not_a_subclass_is_still_initialised():
    base = _new_op_class()

    class Standalone(CustomOp):
        def __init__(self, value=7):
            super().__init__()
            self.value = value

        def forward_native(self, x):
            return self.value

    CustomOp.register_oot(_decorated_op_cls=Standalone, name=base.__name__)
    try:
        layer = base(value=9)
        assert type(layer) is Standalone and layer.value == 9
    finally:
        CustomOp.unregister_oot(base.__name__)


def test_rmsnorm_replacement_forward_oot_runs_when_enabled_native_when_disabled():
    calls = []

    @CustomOp.register_oot("RMSNorm")
    class VendorRMSNorm(RMSNorm):
        def forward_oot(self, x, residual=None):
            calls.append("oot")
            return self.forward_native(x, residual)

    try:
        x = torch.randn(3, 16)
        with activate_platform(OotPlatform()):
            with _config("all"):
                layer = RMSNorm(16, eps=1e-5)
                assert type(layer) is VendorRMSNorm and layer.variance_epsilon == 1e-5
                out = layer(x)
            assert calls == ["oot"]
            with _config("none"):
                layer = RMSNorm(16)
                layer(x)
            assert calls == ["oot"]
            with _config("all", "-rms_norm"):
                RMSNorm(16)(x)
            assert calls == ["oot"]
        torch.testing.assert_close(out, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    finally:
        CustomOp.unregister_oot("RMSNorm")
    assert type(RMSNorm(16)) is RMSNorm


def test_pluggable_layers_share_customops_registries_and_are_replaced_whole():
    """As in vLLM 0.32: one registry for both kinds, so any register_oot form replaces a PluggableLayer;
    a PluggableLayer has no per-platform forward and forward defaults to forward_native."""
    name = f"pluggable_{next(_ids)}"

    @PluggableLayer.register(name)
    class Block(PluggableLayer):
        def forward_native(self, x):
            return "in-tree"

    @Block.register_oot
    class VendorBlock(Block):
        def forward(self, x):
            return "vendor"

    try:
        assert PluggableLayer.op_registry[name] is Block and CustomOp.op_registry[name] is Block
        assert CustomOp.op_registry_oot["Block"] is VendorBlock
        assert Block()(None) == "vendor" and not hasattr(Block(), "dispatch_forward")
        with pytest.raises(ValueError, match="already registered"):
            CustomOp.register(name)(type("Other", (CustomOp,), {}))
    finally:
        PluggableLayer.unregister_oot("Block")
    assert Block()(None) == "in-tree"
    CustomOp.register_oot(_decorated_op_cls=VendorBlock, name="Block")   # the CustomOp form works as well
    try:
        assert type(Block()) is VendorBlock
    finally:
        CustomOp.unregister_oot("Block")
        del CustomOp.op_registry[name]
