"""The runtime config: which CustomOps are enabled and which IR providers are preferred.

`CompilationConfig.custom_ops` and `KernelConfig.ir_op_priority` follow docs/plugin-api.md §3-4.
A current config is held per process; `set_current_config` installs one for a block.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
from collections.abc import Iterator, Sequence


class ConfigError(ValueError):
    """A config value is invalid; the message names the value and the rule it breaks."""


class CompilationMode(enum.IntEnum):
    NONE = 0                  # eager
    STOCK_TORCH_COMPILE = 1   # plain torch.compile
    DYNAMO_TRACE_ONCE = 2     # torch.compile, traced once
    REFERENCE_COMPILE = 3     # torch.compile through this project's backend and passes


def normalize_custom_ops(custom_ops: Sequence[str] | str) -> list[str]:
    """Split comma-joined entries, strip blanks, and validate the list; return the entries."""
    if isinstance(custom_ops, str):
        custom_ops = [custom_ops]
    entries: list[str] = []
    for item in custom_ops:
        if not isinstance(item, str):
            raise ConfigError(f"custom_ops entries must be strings, got {item!r}")
        entries.extend(part.strip() for part in item.split(",") if part.strip())
    for entry in entries:
        if entry not in ("all", "none") and (entry[0] not in "+-" or len(entry) < 2):
            raise ConfigError(f"invalid custom_ops entry {entry!r}: expected 'all', 'none', '+name' or '-name'")
    if "all" in entries and "none" in entries:
        raise ConfigError(f"custom_ops {entries!r} holds both 'all' and 'none'; keep one of them")
    enabled = {e[1:] for e in entries if e.startswith("+")}
    disabled = {e[1:] for e in entries if e.startswith("-")}
    both = sorted(enabled & disabled)
    if both:
        raise ConfigError(f"custom_ops {entries!r} both enables and disables {', '.join(both)}")
    return entries


@dataclasses.dataclass
class CompilationConfig:
    mode: CompilationMode = CompilationMode.NONE
    backend: str = "inductor"
    custom_ops: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.mode = CompilationMode(self.mode)
        self.custom_ops = normalize_custom_ops(self.custom_ops)

    def resolved_custom_ops(self) -> list[str]:
        """`custom_ops` with the default `all`/`none` added when neither is given."""
        if "all" in self.custom_ops or "none" in self.custom_ops:
            return list(self.custom_ops)
        default = "none" if (self.backend == "inductor" and self.mode != CompilationMode.NONE) else "all"
        return [*self.custom_ops, default]

    def custom_op_enabled(self, name: str, default_on: bool) -> bool:
        if f"-{name}" in self.custom_ops:
            return False
        return default_on or f"+{name}" in self.custom_ops

    def all_enabled_by_default(self) -> bool:
        return "all" in self.resolved_custom_ops()


def normalize_priority(ir_op_priority: dict[str, Sequence[str] | str]) -> dict[str, list[str]]:
    result: dict[str, list[str]] = {}
    for op_name, providers in ir_op_priority.items():
        if isinstance(providers, str):
            providers = [p.strip() for p in providers.split(",") if p.strip()]
        providers = list(providers)
        if not providers:
            raise ConfigError(f"ir_op_priority for op '{op_name}' is empty")
        bad = [p for p in providers if not isinstance(p, str) or not p]
        if bad:
            raise ConfigError(f"ir_op_priority for op '{op_name}' holds invalid provider names {bad!r}")
        dupes = sorted({p for p in providers if providers.count(p) > 1})
        if dupes:
            raise ConfigError(f"ir_op_priority for op '{op_name}' names {', '.join(dupes)} more than once")
        result[op_name] = providers
    return result


@dataclasses.dataclass
class KernelConfig:
    """User IR priorities: op name -> providers, prepended to the platform's defaults."""

    ir_op_priority: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.ir_op_priority = normalize_priority(self.ir_op_priority)


@dataclasses.dataclass
class RuntimeConfig:
    compilation_config: CompilationConfig = dataclasses.field(default_factory=CompilationConfig)
    kernel_config: KernelConfig = dataclasses.field(default_factory=KernelConfig)

    @classmethod
    def from_cli_args(cls, argv: Sequence[str]) -> RuntimeConfig:
        return parse_cli_args(argv)


def _parse_custom_ops_value(value: str) -> list[str]:
    value = value.strip()
    if value.startswith("["):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"custom_ops value {value!r} is not a JSON list: {exc}") from exc
        if not isinstance(parsed, list):
            raise ConfigError(f"custom_ops value {value!r} must be a JSON list")
        return parsed
    return [value]


def parse_cli_args(argv: Sequence[str]) -> RuntimeConfig:
    """Parse `--compilation-config.custom_ops '["none,+rms_norm"]'`, `--compilation-config '{...}'`,
    `--compilation-config.mode=3`, `--compilation-config.backend=eager` and
    `--ir-op-priority.rms_norm=a,b` (with `=` or as two words; `_` and `-` interchangeable)."""
    comp_kwargs: dict = {}
    priority: dict[str, list[str]] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}")
        key, sep, value = arg[2:].partition("=")
        if not sep:
            if i + 1 >= len(args):
                raise ConfigError(f"option {arg!r} needs a value")
            value = args[i + 1]
            i += 1
        i += 1
        head, _, field = key.replace("_", "-").partition(".")
        if head == "compilation-config":
            if not field:
                try:
                    data = json.loads(value)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"--compilation-config value {value!r} is not JSON: {exc}") from exc
                if not isinstance(data, dict):
                    raise ConfigError("--compilation-config expects a JSON object")
                for k, v in data.items():
                    comp_kwargs[k.replace("-", "_")] = v
            elif field == "custom-ops":
                comp_kwargs["custom_ops"] = _parse_custom_ops_value(value)
            elif field == "mode":
                comp_kwargs["mode"] = CompilationMode[value.upper()] if not value.isdigit() else int(value)
            elif field == "backend":
                comp_kwargs["backend"] = value
            else:
                raise ConfigError(f"unknown compilation-config field {field!r}")
        elif head == "ir-op-priority":
            if not field:
                raise ConfigError("--ir-op-priority needs an op name: --ir-op-priority.<op>=a,b")
            op_name = key.partition(".")[2]
            priority[op_name] = [p.strip() for p in value.split(",") if p.strip()]
        else:
            raise ConfigError(f"unknown option {arg!r}")
    unknown = set(comp_kwargs) - {f.name for f in dataclasses.fields(CompilationConfig)}
    if unknown:
        raise ConfigError(f"unknown compilation-config fields {sorted(unknown)}")
    return RuntimeConfig(CompilationConfig(**comp_kwargs), KernelConfig(priority))


_current_config = RuntimeConfig()
_generation = 0


def get_current_config() -> RuntimeConfig:
    return _current_config


def config_generation() -> int:
    """A counter that moves whenever the current config changes (`set_current_config` entry and
    exit): caches keyed on the config (IR selections) compare it. In-place edits of a config
    object are not seen; install a new config instead."""
    return _generation


@contextlib.contextmanager
def set_current_config(config: RuntimeConfig, *, check_platform: bool = True) -> Iterator[RuntimeConfig]:
    """Install `config` for the block (after the current platform's `check_and_update_config`)."""
    global _current_config, _generation
    if check_platform:
        from reference_impl.platforms import get_current_platform

        type(get_current_platform()).check_and_update_config(config)
    previous = _current_config
    _current_config = config
    _generation += 1
    try:
        yield config
    finally:
        _current_config = previous
        _generation += 1
