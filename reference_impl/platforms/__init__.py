"""Platforms: the base class, the built-ins, resolution of the current platform, and activation.

`current_platform` is resolved lazily on first access and is a singleton until a platform is
activated explicitly with `activate_platform(name)` (the harness and tests use that).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from importlib.metadata import EntryPoint

from reference_impl.platforms.builtin import (
    BUILTIN_PLATFORM_CLASSES,
    BUILTIN_PLATFORM_DETECTORS,
    CpuPlatform,
    CudaPlatform,
    RocmPlatform,
    TpuPlatform,
    UnspecifiedPlatform,
    XpuPlatform,
    builtin_device_available,
)
from reference_impl.platforms.interface import Platform, PlatformEnum
from reference_impl.plugins import (
    GENERAL_PLUGINS_GROUP,
    PLATFORM_PLUGINS_GROUP,
    PluginLoadError,
    call_plugin,
    discover_entry_points,
    load_plugins_by_group,
)
from reference_impl.utils import resolve_obj_by_qualname

__all__ = [
    "Platform",
    "PlatformEnum",
    "CpuPlatform",
    "CudaPlatform",
    "RocmPlatform",
    "XpuPlatform",
    "TpuPlatform",
    "UnspecifiedPlatform",
    "PlatformActivationError",
    "resolve_current_platform_cls_qualname",
    "get_current_platform",
    "activate_platform",
    "platform_generation",
]

logger = logging.getLogger(__name__)

_current_platform: Platform | None = None
# Bumped whenever the current platform changes; read it through platform_generation().
_generation = 0


class PlatformActivationError(RuntimeError):
    """A platform could not be activated by name: unknown, absent device, or a failing plugin."""


def platform_generation() -> int:
    """A counter that moves whenever the current platform changes (first resolution, activation,
    restore): caches keyed on the platform (IR selections) compare it instead of the platform."""
    return _generation


def resolve_current_platform_cls_qualname() -> str:
    """Ask every built-in detector and every loaded platform plugin; apply the resolution rules."""
    active_oot: dict[str, str] = {}
    for name, register in load_plugins_by_group(PLATFORM_PLUGINS_GROUP).items():
        qualname = call_plugin(name, register, PLATFORM_PLUGINS_GROUP)
        if qualname is not None:
            active_oot[name] = qualname
    if len(active_oot) > 1:
        listed = ", ".join(f"{n} ({q})" for n, q in active_oot.items())
        raise RuntimeError(f"more than one out-of-tree platform plugin is active: {listed}; "
                           "limit them with REFERENCE_IMPL_PLUGINS")
    if active_oot:
        (name, qualname), = active_oot.items()
        logger.info("platform plugin %s is active: %s", name, qualname)
        return qualname

    active_builtin = {}
    for name, detector in BUILTIN_PLATFORM_DETECTORS.items():
        qualname = detector()
        if qualname is not None:
            active_builtin[name] = qualname
    if len(active_builtin) > 1:
        listed = ", ".join(f"{n} ({q})" for n, q in active_builtin.items())
        raise RuntimeError(f"more than one built-in platform is active: {listed}")
    if active_builtin:
        (name, qualname), = active_builtin.items()
        return qualname
    return f"{UnspecifiedPlatform.__module__}.{UnspecifiedPlatform.__qualname__}"


def _install(platform: Platform) -> None:
    global _current_platform, _generation
    _current_platform = platform
    _generation += 1
    platform.import_ir_kernels()
    _generation += 1


def get_current_platform() -> Platform:
    """The current platform, resolved on first call."""
    if _current_platform is None:
        qualname = resolve_current_platform_cls_qualname()
        platform_cls = resolve_obj_by_qualname(qualname)
        _install(platform_cls())
    assert _current_platform is not None
    return _current_platform


def _find_platform_entry_point(name: str) -> EntryPoint:
    eps = {ep.name: ep for ep in discover_entry_points(PLATFORM_PLUGINS_GROUP)}
    if name not in eps:
        known = sorted(BUILTIN_PLATFORM_CLASSES) + sorted(eps)
        raise PlatformActivationError(
            f"unknown platform '{name}': not a built-in platform and no installed distribution "
            f"declares it in entry-point group '{PLATFORM_PLUGINS_GROUP}' (known: {', '.join(known)})")
    return eps[name]


def load_platform(name: str) -> Platform:
    """Build the platform named by a built-in name or a platform-plugin entry-point name.

    Only that plugin and the general plugins of its own distribution are loaded.
    """
    if name in BUILTIN_PLATFORM_CLASSES:
        if not builtin_device_available(name):
            raise PlatformActivationError(f"built-in platform '{name}' is not available in this process "
                                          "(its device was not detected)")
        return BUILTIN_PLATFORM_CLASSES[name]()

    ep = _find_platform_entry_point(name)
    try:
        register = ep.load()
    except Exception as exc:
        raise PluginLoadError(name, ep.value, PLATFORM_PLUGINS_GROUP, exc) from exc
    qualname = call_plugin(name, register, PLATFORM_PLUGINS_GROUP)
    if qualname is None:
        raise PlatformActivationError(
            f"platform plugin '{name}' (entry point '{ep.value}') returned None from register(): "
            "it reports its device as absent")
    try:
        platform_cls = resolve_obj_by_qualname(qualname)
    except Exception as exc:
        raise PluginLoadError(name, ep.value, PLATFORM_PLUGINS_GROUP, exc) from exc
    if not (isinstance(platform_cls, type) and issubclass(platform_cls, Platform)):
        raise PlatformActivationError(
            f"platform plugin '{name}' returned '{qualname}', which is not a Platform subclass")

    dist = getattr(ep, "dist", None)
    if dist is not None:
        for gep in discover_entry_points(GENERAL_PLUGINS_GROUP):
            gdist = getattr(gep, "dist", None)
            if gdist is not None and gdist.name == dist.name:
                try:
                    fn = gep.load()
                except Exception as exc:
                    raise PluginLoadError(gep.name, gep.value, GENERAL_PLUGINS_GROUP, exc) from exc
                call_plugin(gep.name, fn, GENERAL_PLUGINS_GROUP)
    return platform_cls()


@contextlib.contextmanager
def activate_platform(platform: str | Platform) -> Iterator[Platform]:
    """Make `platform` (a name or an instance) current inside the block; restore the previous after."""
    global _current_platform, _generation
    previous = _current_platform
    instance = load_platform(platform) if isinstance(platform, str) else platform
    _install(instance)
    try:
        yield instance
    finally:
        _current_platform = previous
        _generation += 1


def set_current_platform(platform: str | Platform) -> Platform:
    """Make `platform` current for the rest of the process (the harness uses this once per run)."""
    instance = load_platform(platform) if isinstance(platform, str) else platform
    _install(instance)
    return instance


def __getattr__(name: str):
    if name == "current_platform":
        return get_current_platform()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
