"""Plugin discovery through entry points (docs/plugin-api.md §1).

`REFERENCE_IMPL_PLUGINS` is an allowlist of entry-point names: unset loads every plugin, an empty
string loads none. A plugin that fails to import is reported with its name and the cause; an
allowlist name that no installed plugin declares is warned about (never a silent fallback), and
the harness says when an explicit `--platform` bypasses the allowlist.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points

logger = logging.getLogger(__name__)

PLATFORM_PLUGINS_GROUP = "reference_impl.platform_plugins"
GENERAL_PLUGINS_GROUP = "reference_impl.general_plugins"
PLUGINS_ENV = "REFERENCE_IMPL_PLUGINS"


class PluginLoadError(RuntimeError):
    """A plugin's entry point could not be imported, or its register function raised."""

    def __init__(self, name: str, entry_point: str, group: str, cause: BaseException):
        self.plugin_name = name
        self.entry_point = entry_point
        self.group = group
        self.cause = cause
        super().__init__(
            f"plugin '{name}' (entry point '{entry_point}' in group '{group}') failed: "
            f"{type(cause).__name__}: {cause}"
        )


def allowed_plugin_names() -> set[str] | None:
    """The allowlist from `REFERENCE_IMPL_PLUGINS`, or None when unset (everything allowed)."""
    value = os.environ.get(PLUGINS_ENV)
    if value is None:
        return None
    return {name.strip() for name in value.split(",") if name.strip()}


def discover_entry_points(group: str) -> list[EntryPoint]:
    """Every installed entry point of `group`, before the allowlist is applied."""
    return list(entry_points(group=group))


def unknown_allowlist_names() -> list[str]:
    """Allowlist names that no installed entry point of either plugin group declares (sorted)."""
    allowed = allowed_plugin_names()
    if not allowed:
        return []
    known = {ep.name for group in (PLATFORM_PLUGINS_GROUP, GENERAL_PLUGINS_GROUP)
             for ep in discover_entry_points(group)}
    return sorted(allowed - known)


def unknown_allowlist_message() -> str | None:
    """One line naming the allowlist entries that match no installed plugin, or None when all match."""
    unknown = unknown_allowlist_names()
    if not unknown:
        return None
    known = sorted({ep.name for group in (PLATFORM_PLUGINS_GROUP, GENERAL_PLUGINS_GROUP)
                    for ep in discover_entry_points(group)})
    return (f"{PLUGINS_ENV}={os.environ.get(PLUGINS_ENV)} names {', '.join(repr(n) for n in unknown)}, which no "
            f"installed plugin declares (installed: {', '.join(known) or 'none'}); platform resolution goes on "
            "without it and may pick a built-in platform")


def allowlist_bypass_message(platform_name: str, builtin_names) -> str | None:
    """One line when an explicitly named plugin platform is outside a set allowlist, else None."""
    allowed = allowed_plugin_names()
    if allowed is None or platform_name in allowed or platform_name in builtin_names:
        return None
    return (f"--platform={platform_name} is not in {PLUGINS_ENV}={os.environ.get(PLUGINS_ENV)}: an explicit "
            f"platform bypasses the allowlist, so plugin '{platform_name}' and its distribution's general plugins "
            "are loaded anyway")


def platform_distribution(platform_name: str) -> dict[str, str] | None:
    """{"distribution", "version"} of the installed distribution declaring platform plugin `platform_name`;
    None for built-in platforms (no such entry point) or an entry point without distribution metadata."""
    for ep in discover_entry_points(PLATFORM_PLUGINS_GROUP):
        dist = getattr(ep, "dist", None)
        if ep.name == platform_name and dist is not None:
            return {"distribution": dist.metadata["Name"] or dist.name, "version": dist.version}
    return None


_warned_unknown: set[str] = set()


def load_plugins_by_group(group: str) -> dict[str, Callable]:
    """Load the allowed entry points of `group`: entry-point name -> the loaded callable."""
    allowed = allowed_plugin_names()
    message = unknown_allowlist_message()
    if message and message not in _warned_unknown:   # once per process and allowlist
        _warned_unknown.add(message)
        logger.warning(message)
    plugins: dict[str, Callable] = {}
    for ep in discover_entry_points(group):
        if allowed is not None and ep.name not in allowed:
            logger.debug("plugin %s skipped: not in %s", ep.name, PLUGINS_ENV)
            continue
        try:
            plugins[ep.name] = ep.load()
        except Exception as exc:
            raise PluginLoadError(ep.name, ep.value, group, exc) from exc
        logger.info("loaded plugin %s (%s) from group %s", ep.name, ep.value, group)
    return plugins


def call_plugin(name: str, fn: Callable, group: str):
    """Call a plugin's function, reporting a raise as `PluginLoadError` naming the plugin."""
    try:
        return fn()
    except Exception as exc:
        value = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
        raise PluginLoadError(name, value, group, exc) from exc


_general_plugins_loaded: set[str] = set()


def load_general_plugins(names: set[str] | None = None) -> list[str]:
    """Run each allowed general plugin's function once per process; return the names run now."""
    ran = []
    for name, fn in load_plugins_by_group(GENERAL_PLUGINS_GROUP).items():
        if name in _general_plugins_loaded or (names is not None and name not in names):
            continue
        call_plugin(name, fn, GENERAL_PLUGINS_GROUP)
        _general_plugins_loaded.add(name)
        ran.append(name)
    return ran
