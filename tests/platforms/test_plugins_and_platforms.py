"""Plugin discovery through real entry points and the platform resolution rules (docs/plugin-api.md §1-2)."""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
import textwrap

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


def _devices_here() -> dict[str, bool]:
    """What this machine really has, asked of torch directly (not of the detectors under test)."""
    gpu = torch.cuda.is_available()
    xpu = getattr(torch, "xpu", None)
    return {"cuda": gpu and torch.version.cuda is not None,
            "rocm": gpu and getattr(torch.version, "hip", None) is not None,
            "xpu": xpu is not None and xpu.is_available()}


def test_builtin_detection_is_truthful_here(monkeypatch, fresh_platform):
    monkeypatch.setenv("REFERENCE_IMPL_PLUGINS", "")  # built-in detection only
    present = [name for name, here in _devices_here().items() if here]
    expected = {"cuda": "CudaPlatform", "rocm": "RocmPlatform", "xpu": "XpuPlatform"}[present[0]] if present \
        else "CpuPlatform"
    assert resolve_current_platform_cls_qualname() == f"reference_impl.platforms.builtin.{expected}"
    p = get_current_platform()
    assert p.is_cpu() is (not present)
    assert p.is_cuda_alike() is any(_devices_here()[n] for n in ("cuda", "rocm"))
    assert not p.is_out_of_tree()


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
    with activate_platform(CpuPlatform()) as before:  # a known current platform, whatever ran earlier
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


@pytest.mark.parametrize("name", ["cuda", "rocm", "xpu"])
def test_activate_builtin_needs_its_device(name):
    """Explicit activation of an accelerator platform works exactly where its device is present."""
    if _devices_here()[name]:
        with activate_platform(name) as p:
            assert get_current_platform() is p and p.device_name == name
    else:
        with pytest.raises(PlatformActivationError, match=f"'{name}' is not available in this process"):
            with activate_platform(name):
                pass


def test_cpu_platform_activates_on_any_machine():
    """The CPU is always usable: `--platform=cpu` runs on an accelerator machine too, where the
    CPU platform is not the default."""
    with activate_platform("cpu") as p:
        assert p.is_cpu() and get_current_platform() is p


def test_simulated_gpu_machine_resolves_cuda_and_still_activates_cpu():
    """On a machine whose torch reports a CUDA device (simulated in a child process), detection
    gives the cuda platform, `cpu` still activates explicitly, and an absent device is refused."""
    code = textwrap.dedent("""
        import os, torch
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: 1
        torch.version.cuda = torch.version.cuda or "13.0"
        os.environ["REFERENCE_IMPL_PLUGINS"] = ""
        from reference_impl.platforms import (PlatformActivationError, activate_platform, builtin,
                                              resolve_current_platform_cls_qualname)
        from reference_impl.platforms.builtin import builtin_device_available
        print("resolved", resolve_current_platform_cls_qualname())
        print("cpu detector", builtin.BUILTIN_PLATFORM_DETECTORS["cpu"]())
        print("cpu available", builtin_device_available("cpu"))
        with activate_platform(builtin.CpuPlatform()) as p:   # instance: skips kernel imports of cuda
            pass
        from reference_impl.platforms import load_platform
        print("load cpu", type(load_platform("cpu")).__name__)
        try:
            load_platform("xpu")
        except PlatformActivationError as exc:
            print("xpu refused:", exc)
    """)
    env = {**os.environ, "REFERENCE_IMPL_PLUGINS": ""}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "resolved reference_impl.platforms.builtin.CudaPlatform"
    assert lines[1:4] == ["cpu detector None", "cpu available True", "load cpu CpuPlatform"]
    assert lines[4] == "xpu refused: built-in platform 'xpu' is not available in this process " \
        "(its device was not detected)"


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
