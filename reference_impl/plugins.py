"""Plugin discovery through entry points (docs/plugin-api.md §1).

`REFERENCE_IMPL_PLUGINS` is an allowlist of entry-point names: unset loads every plugin, an empty
string loads none. A plugin that fails to import is reported with its name and the cause.
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


def load_plugins_by_group(group: str) -> dict[str, Callable]:
    """Load the allowed entry points of `group`: entry-point name -> the loaded callable."""
    allowed = allowed_plugin_names()
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
