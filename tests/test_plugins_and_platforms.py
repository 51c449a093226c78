"""Plugin discovery through real entry points and the platform resolution rules (docs/plugin-api.md §1-2)."""

from __future__ import annotations

import itertools
import logging

import pytest
import torch

from _dist import make_distribution
from reference_impl import platforms
from reference_impl.platforms import (
    CpuPlatform,
    Platform,
    PlatformActivationError,
    PlatformEnum,
    activate_platform,
    get_current_platform,
    resolve_current_platform_cls_qualname,
)
from reference_impl.plugins import (
    GENERAL_PLUGINS_GROUP,
    PLATFORM_PLUGINS_GROUP,
    PluginLoadError,
    load_plugins_by_group,
)

_ids = itertools.count()


def _platform_module(cls_name: str, device_name: str) -> str:
    return f"""
from reference_impl.platforms import Platform, PlatformEnum

class {cls_name}(Platform):
    _enum = PlatformEnum.OOT
    device_name = "{device_name}"
    device_type = "cpu"
    imported_kernels = 0

    def import_ir_kernels(self):
        type(self).imported_kernels += 1

    def get_default_ir_op_priority(self):
        return {{"rms_norm": ["native"]}}
"""


@pytest.fixture
def vendor(tmp_path, monkeypatch):
    """Factory: install a fake vendor distribution on sys.path; returns (entry-point name, module name)."""
    monkeypatch.delenv("REFERENCE_IMPL_PLUGINS", raising=False)

    def install(active=True, register_body=None, general=False, broken_import=False):
        n = next(_ids)
        mod, ep = f"vendor_{n}_{tmp_path.name[-6:]}".replace("-", "_"), f"plat{n}"
        qual = f"{mod}.platform.VendorPlatform{n}"
        body = register_body or (f"return {qual!r}" if active else "return None")
        modules = {
            f"{mod}.__init__": ("import does_not_exist_anywhere\n" if broken_import else "")
            + f"CALLS = []\ndef register():\n    CALLS.append('register')\n    {body}\n"
            + "def register_ops():\n    CALLS.append('general')\n",
            f"{mod}.platform": _platform_module(f"VendorPlatform{n}", ep),
        }
        eps = {PLATFORM_PLUGINS_GROUP: {ep: f"{mod}:register"}}
        if general:
            eps[GENERAL_PLUGINS_GROUP] = {f"{ep}_ops": f"{mod}:register_ops"}
        root = make_distribution(tmp_path / f"site{n}", f"vendor-dist-{n}", modules, eps)
        monkeypatch.syspath_prepend(str(root))
        return ep, mod

    return install


@pytest.fixture
def fresh_platform(monkeypatch):
    """Forget the resolved platform for the test; the previous one is restored afterwards."""
    monkeypatch.setattr(platforms, "_current_platform", None)
    yield
    platforms._generation += 1


def test_builtin_detection_is_truthful_here():
    assert resolve_current_platform_cls_qualname().endswith("CpuPlatform")
    assert not torch.cuda.is_available()
    p = get_current_platform()
    assert p.is_cpu() and not p.is_cuda_alike() and not p.is_out_of_tree()


def test_entry_points_are_discovered_and_loaded(vendor):
    ep, mod = vendor()
    plugins = load_plugins_by_group(PLATFORM_PLUGINS_GROUP)
    assert ep in plugins
    assert plugins[ep]() == f"{mod}.platform.VendorPlatform{ep[4:]}"


def test_allowlist_env(vendor, monkeypatch):
    ep1, _ = vendor()
    ep2, _ = vendor()
    monkeypatch.setenv("REFERENCE_IMPL_PLUGINS", ep1)
    assert set(load_plugins_by_group(PLATFORM_PLUGINS_GROUP)) == {ep1}
    monkeypatch.setenv("REFERENCE_IMPL_PLUGINS", "")
    assert load_plugins_by_group(PLATFORM_PLUGINS_GROUP) == {}
    monkeypatch.delenv("REFERENCE_IMPL_PLUGINS")
    assert {ep1, ep2} <= set(load_plugins_by_group(PLATFORM_PLUGINS_GROUP))


def test_plugin_that_fails_to_import_is_reported_with_its_name(vendor):
    ep, mod = vendor(broken_import=True)
    with pytest.raises(PluginLoadError) as info:
        load_plugins_by_group(PLATFORM_PLUGINS_GROUP)
    msg = str(info.value)
    assert ep in msg and f"{mod}:register" in msg and "does_not_exist_anywhere" in msg


def test_register_that_raises_is_reported(vendor, monkeypatch):
    ep, _ = vendor(register_body="raise RuntimeError('driver missing')")
    monkeypatch.setenv("REFERENCE_IMPL_PLUGINS", ep)
    with pytest.raises(PluginLoadError, match=f"plugin '{ep}'.*driver missing"):
        resolve_current_platform_cls_qualname()


def test_one_active_oot_plugin_wins_over_builtins(vendor, fresh_platform):
    ep, mod = vendor()
    vendor(active=False)
    qual = resolve_current_platform_cls_qualname()
    assert qual.startswith(mod)
    p = get_current_platform()
    assert p.is_out_of_tree() and p.device_name == ep
    assert type(p).imported_kernels == 1
    assert get_current_platform() is p  # singleton
    assert platforms.current_platform is p  # lazy module attribute


def test_two_active_oot_plugins_raise_naming_both(vendor):
    ep1, _ = vendor()
    ep2, _ = vendor()
    with pytest.raises(RuntimeError) as info:
        resolve_current_platform_cls_qualname()
    assert ep1 in str(info.value) and ep2 in str(info.value)


def test_two_active_builtins_raise_naming_both(monkeypatch):
    from reference_impl.platforms import builtin

    monkeypatch.setenv("REFERENCE_IMPL_PLUGINS", "")
    monkeypatch.setitem(builtin.BUILTIN_PLATFORM_DETECTORS, "cuda", lambda: "x.CudaPlatform")
    monkeypatch.setitem(builtin.BUILTIN_PLATFORM_DETECTORS, "xpu", lambda: "x.XpuPlatform")
    with pytest.raises(RuntimeError, match="cuda.*xpu"):
        resolve_current_platform_cls_qualname()


def test_no_active_platform_gives_unspecified(monkeypatch, fresh_platform):
    from reference_impl.platforms import builtin

    monkeypatch.setenv("REFERENCE_IMPL_PLUGINS", "")
    for name in list(builtin.BUILTIN_PLATFORM_DETECTORS):
        monkeypatch.setitem(builtin.BUILTIN_PLATFORM_DETECTORS, name, lambda: None)
    assert get_current_platform().is_unspecified()


def test_activate_by_entry_point_name_loads_own_general_plugins_and_restores(vendor):
    ep, mod = vendor(general=True)
    other_ep, other_mod = vendor(general=True)
    before = get_current_platform()
    with activate_platform(ep) as p:
        assert get_current_platform() is p and p.device_name == ep
        import importlib

        calls = importlib.import_module(mod).CALLS
        assert calls == ["register", "general"]
        assert importlib.import_module(other_mod).CALLS == []  # other distributions untouched
    assert get_current_platform() is before


def test_activate_plugin_whose_register_returns_none(vendor):
    ep, _ = vendor(active=False)
    with pytest.raises(PlatformActivationError, match=f"'{ep}'.*returned None"):
        with activate_platform(ep):
            pass


def test_activate_unknown_name_lists_known_names():
    with pytest.raises(PlatformActivationError, match="unknown platform 'nope'.*cpu"):
        with activate_platform("nope"):
            pass


def test_activate_builtin_without_its_device():
    with pytest.raises(PlatformActivationError, match="'cuda' is not available"):
        with activate_platform("cuda"):
            pass


def test_platform_predicates_and_defaults():
    class P(Platform):
        _enum = PlatformEnum.ROCM

    p = P()
    assert p.is_rocm() and p.is_cuda_alike() and not p.is_cuda()
    assert p.get_default_ir_op_priority() == {}
    assert CpuPlatform().is_cpu()
    for enum_member in PlatformEnum:
        q = type("Q", (Platform,), {"_enum": enum_member})()
        flags = [q.is_cuda(), q.is_rocm(), q.is_tpu(), q.is_xpu(), q.is_cpu(), q.is_out_of_tree(),
                 q.is_unspecified()]
        assert sum(flags) == 1


def test_plugin_load_is_logged(vendor, caplog):
    ep, _ = vendor()
    with caplog.at_level(logging.INFO, logger="reference_impl.plugins"):
        load_plugins_by_group(PLATFORM_PLUGINS_GROUP)
    assert any(ep in r.getMessage() for r in caplog.records)
