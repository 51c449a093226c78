"""The attention-backend registry: names to class paths, overridable, as vLLM 0.32's `AttentionBackendEnum`.

`AttentionBackendEnum[name]` is a member (an error lists the valid names); a member's `get_class()` imports
its class, honouring overrides; `register_backend` adds a name or overrides one, as a decorator or with a
class path. `resolve(name_or_qualname)` is the one way the layer and the harness turn what
`Platform.get_attn_backend_cls` returned (a qualname) or a name into a backend class.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator

REFERENCE_BACKEND = "reference_impl.attention.reference.ReferenceAttentionBackend"


class BackendMember:
    """One registered backend: its name and default class path (None for the CUSTOM placeholder)."""

    def __init__(self, name: str, value: str | None):
        self.name = name
        self.value = value

    def get_path(self, include_classname: bool = True) -> str:
        path = _OVERRIDES.get(self.name, self.value)
        if not path:
            raise ValueError(f"attention backend {self.name} must be registered before use: "
                             f"register_backend(AttentionBackendEnum.{self.name}, 'your.module.YourBackend')")
        return path if include_classname else path.rpartition(".")[0]

    def get_class(self) -> type:
        return import_qualname(self.get_path())

    def is_overridden(self) -> bool:
        return self.name in _OVERRIDES

    def clear_override(self) -> None:
        _OVERRIDES.pop(self.name, None)

    def __repr__(self) -> str:
        return f"<AttentionBackendEnum.{self.name}>"


class _RegistryMeta(type):
    def __getitem__(cls, name: str) -> BackendMember:
        try:
            return cls._members[name]
        except KeyError:
            raise ValueError(f"unknown attention backend {name!r}; valid names: {', '.join(cls._members)}") from None

    def __getattr__(cls, name: str) -> BackendMember:
        members = cls.__dict__.get("_members", {})
        if name in members:
            return members[name]
        raise AttributeError(name)

    def __iter__(cls) -> Iterator[BackendMember]:
        return iter(list(cls._members.values()))

    def __contains__(cls, name: object) -> bool:
        return name in cls._members

    def __len__(cls) -> int:
        return len(cls._members)


class AttentionBackendEnum(metaclass=_RegistryMeta):
    """The backends by name. Built in: REFERENCE (the pure-torch paged backend) and CUSTOM, the placeholder an
    out-of-tree backend registers into; kernel providers add their own names (`register_backend("NAME", path)`)."""

    _members: dict[str, BackendMember] = {"REFERENCE": BackendMember("REFERENCE", REFERENCE_BACKEND),
                                          "CUSTOM": BackendMember("CUSTOM", None)}

    @classmethod
    def register(cls, name: str, value: str | None) -> BackendMember:
        """Add member `name` (a Python identifier not taken yet) with default class path `value`."""
        if not name.isidentifier():
            raise ValueError(f"attention backend name {name!r} is not an identifier")
        old = cls._members.get(name)
        if old is not None:
            if old.value == value or value is None:
                return old
            raise ValueError(f"attention backend {name} already exists (class path {old.value}); override it with "
                             f"register_backend(AttentionBackendEnum.{name}, {value!r})")
        member = cls._members[name] = BackendMember(name, value)
        return member


_OVERRIDES: dict[str, str] = {}


def register_backend(backend: BackendMember | str, class_path: str | None = None) -> Callable[[type], type]:
    """Register or override a backend. `backend` a member overrides it; a string adds a new name. With
    `class_path` the path is recorded now and an identity decorator returned; without, use it as a decorator
    (the decorated class's qualname is recorded)."""
    member = AttentionBackendEnum.register(backend, class_path) if isinstance(backend, str) else backend
    if not isinstance(member, BackendMember):
        raise TypeError(f"register_backend takes an AttentionBackendEnum member or a name, not {type(backend).__name__}")

    if class_path is not None:
        _OVERRIDES[member.name] = class_path
        return lambda cls: cls

    def decorator(cls: type) -> type:
        _OVERRIDES[member.name] = f"{cls.__module__}.{cls.__qualname__}"
        return cls

    return decorator


def import_qualname(path: str) -> type:
    """The object a dotted `module.Class` path names; an error names the path and what is missing."""
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"attention backend path {path!r} is not a dotted module.Class path")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ImportError(f"attention backend {path!r} cannot be imported: {type(exc).__name__}: {exc}") from exc


def resolve(name: str) -> type:
    """The backend class for a registry name (`"REFERENCE"`) or a qualname (`"pkg.mod.Backend"`)."""
    if name in AttentionBackendEnum:
        return AttentionBackendEnum[name].get_class()
    if "." in name:
        return import_qualname(name)
    raise ValueError(f"unknown attention backend {name!r}; valid names: {', '.join(m.name for m in AttentionBackendEnum)}")


def name_of(backend_cls: type) -> str | None:
    """The registry name whose (overridden) path names `backend_cls`, or None."""
    qualname = f"{backend_cls.__module__}.{backend_cls.__qualname__}"
    for member in AttentionBackendEnum:
        if _OVERRIDES.get(member.name, member.value) == qualname:
            return member.name
    return None
