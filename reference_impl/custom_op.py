"""`CustomOp` and `PluggableLayer`: layer classes that out-of-tree plugins can replace (docs/plugin-api.md §4).

As in vLLM 0.32, both kinds share one in-tree registry (registered name -> class) and one
out-of-tree registry (replaced class's `__name__` -> replacement class); constructing a replaced
class builds the replacement. `CustomOp` additionally dispatches `forward` to `forward_<platform>`
when enabled by `CompilationConfig.custom_ops`, and to `forward_native` when disabled;
`PluggableLayer` (a layer composed of sub-layers) has no per-platform dispatch: a plugin replaces
the whole class.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch.nn as nn

from reference_impl.config import get_current_config
from reference_impl.platforms import get_current_platform

logger = logging.getLogger(__name__)


class _ReplaceableMixin:
    """Registries and construction-time replacement shared by CustomOp and PluggableLayer."""

    op_registry: dict[str, type]
    op_registry_oot: dict[str, type]
    name: str

    def __new__(cls, *args, **kwargs):
        replacement = cls.op_registry_oot.get(cls.__name__)
        if replacement is not None and replacement is not cls:
            logger.debug("constructing %s in place of %s (register_oot)", replacement.__qualname__, cls.__name__)
            instance = super().__new__(replacement)
            if not isinstance(instance, cls):
                # Python only calls __init__ itself when the object is an instance of `cls`.
                instance.__init__(*args, **kwargs)
            return instance
        return super().__new__(cls)

    @classmethod
    def register(cls, name: str) -> Callable[[type], type]:
        """Register an in-tree class under `name`; a second class under the same name raises."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{cls.__name__}.register needs a non-empty name, got {name!r}")

        def decorator(op_cls: type) -> type:
            existing = cls.op_registry.get(name)
            if existing is not None and existing is not op_cls:
                raise ValueError(f"{cls.__name__} name '{name}' is already registered by "
                                 f"{existing.__module__}.{existing.__qualname__}")
            op_cls.name = name
            cls.op_registry[name] = op_cls
            return op_cls

        return decorator

    @classmethod
    def register_oot(cls, _decorated_op_cls: type | str | None = None, name: str | None = None):
        """Register a replacement for the in-tree class whose `__name__` is `name`.

        Forms: `@CustomOp.register_oot("SiluAndMul")`, `@CustomOp.register_oot(name="SiluAndMul")`,
        `@SiluAndMul.register_oot` (the name is the class it is called on), and
        `CustomOp.register_oot(_decorated_op_cls=Cls, name="SiluAndMul")`.
        """
        if isinstance(_decorated_op_cls, str):
            name, _decorated_op_cls = _decorated_op_cls, None
        base = cls._registry_owner()
        if name is None:
            if cls is base:
                raise ValueError(f"{base.__name__}.register_oot needs the name of the class it replaces")
            name = cls.__name__

        def decorator(op_cls: type) -> type:
            existing = base.op_registry_oot.get(name)
            if existing is not None and existing is not op_cls:
                logger.warning("register_oot(%r): %s replaces earlier replacement %s", name,
                               op_cls.__qualname__, existing.__qualname__)
            base.op_registry_oot[name] = op_cls
            return op_cls

        if _decorated_op_cls is not None:
            return decorator(_decorated_op_cls)
        return decorator

    @classmethod
    def unregister_oot(cls, name: str) -> None:
        """Drop a replacement (used by the harness and tests to undo a plugin's registration)."""
        cls._registry_owner().op_registry_oot.pop(name, None)

    @classmethod
    def _registry_owner(cls) -> type:
        for klass in cls.__mro__:
            if "op_registry_oot" in vars(klass):
                return klass
        raise TypeError(f"{cls.__name__} has no registry")


class CustomOp(_ReplaceableMixin, nn.Module):
    """A layer whose forward dispatches per platform; see the module docstring."""

    op_registry: dict[str, type[CustomOp]] = {}
    op_registry_oot: dict[str, type[CustomOp]] = {}

    def __init__(self, *, enforce_enable: bool = False, compile_native: bool = False):
        """`compile_native` is vLLM's request to torch.compile forward_native when disabled inside an
        opaque op; the reference accepts it (for vLLM's signatures) and runs forward_native eagerly."""
        super().__init__()
        self._enforce_enable = enforce_enable
        self._compile_native = compile_native
        self._forward_method = self.dispatch_forward()

    def forward(self, *args, **kwargs):
        return self._forward_method(*args, **kwargs)

    def forward_native(self, *args, **kwargs):
        """The PyTorch-native semantics of this op; every subclass defines it."""
        raise NotImplementedError(f"{type(self).__name__} does not define forward_native")

    def forward_cuda(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)

    def forward_hip(self, *args, **kwargs):
        return self.forward_cuda(*args, **kwargs)

    def forward_xpu(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)

    def forward_tpu(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)

    def forward_cpu(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)

    def forward_oot(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)

    def dispatch_forward(self) -> Callable:
        """Pick the forward method for the current platform and config (done once, at construction)."""
        if not (self._enforce_enable or self.enabled()):
            return self.forward_native
        platform = get_current_platform()
        if platform.is_rocm():
            return self.forward_hip
        if platform.is_cuda():
            return self.forward_cuda
        if platform.is_cpu():
            return self.forward_cpu
        if platform.is_xpu():
            return self.forward_xpu
        if platform.is_tpu():
            return self.forward_tpu
        if platform.is_out_of_tree():
            return self.forward_oot
        return self.forward_native

    @classmethod
    def enabled(cls) -> bool:
        name = getattr(cls, "name", None)
        if name is None:
            return cls.default_on()
        return get_current_config().compilation_config.custom_op_enabled(name, cls.default_on())

    @staticmethod
    def default_on() -> bool:
        """Whether ops not named in custom_ops are on: `all` (explicit or defaulted) vs `none`."""
        return get_current_config().compilation_config.all_enabled_by_default()


class PluggableLayer(_ReplaceableMixin, nn.Module):
    """A module-composing layer replaced whole by an out-of-tree class at construction (vLLM 0.32's
    PluggableLayer): no `forward_<platform>` dispatch and no custom_ops enablement.

    Registered with `@PluggableLayer.register(name)` into the registries CustomOp uses (vLLM keeps one
    `op_registry` / `op_registry_oot` for both), so `CustomOp.register_oot("ReplicatedLinear")`,
    `@ReplicatedLinear.register_oot` and `PluggableLayer.register_oot(...)` all replace it. The
    reference's pluggable layers define `forward_native`, their semantics with every sub-layer run
    native (what a replacement's `forward` is compared with), and `forward`, the same computation
    with sub-layers dispatched; `forward` defaults to `forward_native`.
    """

    op_registry = CustomOp.op_registry
    op_registry_oot = CustomOp.op_registry_oot

    def forward(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)

    def forward_native(self, *args, **kwargs):
        """The PyTorch-native semantics of this layer; every reference subclass defines it."""
        raise NotImplementedError(f"{type(self).__name__} does not define forward_native")
