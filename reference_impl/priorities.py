"""The runtime's IR provider priorities: the current config's user priorities, then the current
platform's defaults (docs/plugin-api.md §3).

`RuntimePriorities` is the priority source that `reference_impl/__init__.py` installs into the IR
(reference_impl/ir/priority.py). Its generation moves whenever the current config or the current
platform changes, so IR ops select again after `set_current_config` or `activate_platform`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from reference_impl.config import ConfigError, config_generation, get_current_config
from reference_impl.platforms import get_current_platform, platform_generation

logger = logging.getLogger(__name__)


class RuntimePriorities:
    """User priorities of the current config first, then the platform's defaults not named yet."""

    def priority(self, op_name: str, registered: Collection[str]) -> list[str]:
        """A user priority naming an unregistered provider is an error (the user asked for it); a
        platform default naming one is skipped with a warning (the platform's kernels may be off)."""
        platform = get_current_platform()      # first: resolving it registers its kernels into `registered`
        user = get_current_config().kernel_config.ir_op_priority.get(op_name, [])
        unknown = [p for p in user if p not in registered]
        if unknown:
            raise ConfigError(f"ir_op_priority for op '{op_name}' names unknown providers {unknown}; "
                              f"registered: {sorted(registered)}")
        merged = list(user)
        for provider in platform.get_default_ir_op_priority().get(op_name, []):
            if provider in merged:
                continue
            if provider not in registered:
                logger.warning("platform default priority for op %s names provider %r, which is not "
                               "registered; skipping it", op_name, provider)
                continue
            merged.append(provider)
        return merged

    def generation(self) -> int:
        """Moves with either counter (both only grow), so their sum does too."""
        return config_generation() + platform_generation()
