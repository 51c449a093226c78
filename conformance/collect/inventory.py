"""What the platform brings, and the units each suite body runs over.

`activate(name)` snapshots the IR providers and CustomOp replacements, makes the platform current
(which imports its kernels and, for a plugin, runs the general plugins of its distribution), and
diffs: what appeared is what the platform brings. The `Inventory`'s unit enumerators list the units
each check runs over; a check's record (conformance.checks.record) names its enumerator.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any

import torch

from conformance.collect.units import Unit, dtype_name


class PlatformSetupError(RuntimeError):
    """The named platform could not be activated; the message is one line naming plugin and cause."""


# Platforms of other runtimes, translated into ours by a bridge: --platform name -> factory (module:function)
BRIDGES = {"vllm": "conformance.vllm.platform:make_platform"}


def bridge_factory(name: str):
    """The factory of bridged platform `name`, or None; its module (and runtime) is imported only here."""
    target = BRIDGES.get(name)
    if target is None:
        return None
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def import_catalog() -> None:
    """Import every declared IR op and every in-tree layer module, so the snapshot sees them all."""
    import reference_impl.ir.ops  # noqa: F401
    import reference_impl.layers as layers

    for info in pkgutil.iter_modules(layers.__path__):
        importlib.import_module(f"{layers.__name__}.{info.name}")


@dataclasses.dataclass
class Inventory:
    name: str
    platform: Any
    ir_providers: dict[str, list[str]]        # op -> providers the platform brought
    oot: dict[str, type]                      # register_oot key -> replacement the platform brought
    defaults: dict[str, list[str]]            # the platform's default IR priorities

    # ----- description -------------------------------------------------------------------------
    @property
    def platform_class(self) -> str:
        bridged = getattr(self.platform, "conformance_class", None)   # a bridge names the class it translates
        if isinstance(bridged, str):
            return bridged
        cls = type(self.platform)
        return f"{cls.__module__}.{cls.__qualname__}"

    def platform_info(self) -> dict[str, str]:
        return {"name": self.name, "class": self.platform_class, "device_type": str(self.platform.device_type)}

    def ir_ops(self):
        from reference_impl.ir.op import IrOp

        return list(IrOp.registry.values())

    def native_fallback_ops(self) -> list[str]:
        return [op.name for op in self.ir_ops() if not self.ir_providers.get(op.name)]

    def in_tree_layers(self) -> dict[str, type]:
        """Registered name -> in-tree CustomOp class, for classes that declare conformance cases."""
        from reference_impl.custom_op import CustomOp
        from reference_impl.layers.cases import conformance_of

        return {name: cls for name, cls in CustomOp.op_registry.items() if conformance_of(cls) is not None}

    def replaced_layers(self) -> dict[str, tuple[type, type]]:
        """Registered name -> (in-tree class, replacement) for replacements whose key matches a class."""
        from reference_impl.custom_op import CustomOp

        by_class = {cls.__name__: (name, cls) for name, cls in CustomOp.op_registry.items()}
        out = {}
        for key, rep in self.oot.items():
            if key in by_class:
                name, cls = by_class[key]
                out[name] = (cls, rep)
        return out

    def dtypes_for(self, tolerances) -> list[torch.dtype]:
        return [d for d in self.platform.supported_dtypes if d in tolerances]

    def op_dtypes(self, op) -> list[torch.dtype]:
        out = []
        for d in self.platform.supported_dtypes:
            try:
                op.get_tolerance(d)
            except KeyError:
                continue
            out.append(d)
        return out

    # ----- the catalog ------------------------------------------------------------------------
    # Unit enumerators, named by the check records (conformance.checks.record) of the checks that use them.

    def _provided(self, supported_only: bool = True):
        """(op, provider) the platform brings; `supported=False` ones only when asked for."""
        for op in self.ir_ops():
            for provider in self.ir_providers.get(op.name, []):
                if op.impls[provider].supported or not supported_only:
                    yield op, provider

    def unsupported_units(self, family, check, level):
        """One NOT_SUPPORTED per provider registered supported=False (its checks cannot run)."""
        return [Unit(family, check, op.name, provider) for op, provider in self._provided(False)
                if not op.impls[provider].supported]

    def ir_case_units(self, family, check, level):
        """op x provider x dtype x case at `level`; a case about size alone (numerics_only) in numerics only."""
        units = []
        for op, provider in self._provided():
            for dtype in self.op_dtypes(op):
                for case in op.cases:
                    if case.numerics_only and family != "numerics":
                        continue
                    if case.runs_at(level) and (case.dtypes is None or dtype in case.dtypes):
                        units.append(Unit(family, check, op.name, provider, dtype_name(dtype), case.name))
        return units

    def ir_property_units(self, family, check, level):
        return [Unit(family, check, op.name, provider, dtype_name(dtype), "property")
                for op, provider in self._provided() if op.property_args is not None
                for dtype in self.op_dtypes(op)]

    def ir_dtype_units(self, family, check, level):
        """op x provider x dtype, at every level."""
        return [Unit(family, check, op.name, provider, dtype_name(dtype))
                for op, provider in self._provided() for dtype in self.op_dtypes(op)]

    def ir_compile_units(self, family, check, level):
        units = []
        for op, provider in self._provided():
            dtypes = self.op_dtypes(op)
            if level == "quick":
                dtypes = dtypes[:1]
            units += [Unit(family, check, op.name, provider, dtype_name(d)) for d in dtypes]
        return units

    def layer_case_units(self, family, check, level):
        from reference_impl.layers.cases import conformance_of

        units = []
        for name, (cls, rep) in self.replaced_layers().items():
            record = conformance_of(cls)
            if record is None:
                continue
            for dtype in self.dtypes_for(record.tolerances):
                for case in record.cases:
                    if case.runs_at(level) and (case.dtypes is None or dtype in case.dtypes):
                        units.append(Unit(family, check, name, rep.__qualname__, dtype_name(dtype), case.name))
        return units

    def layer_compile_units(self, family, check, level):
        """Per replaced layer and dtype (quick: the first dtype only): one compiled-against-eager unit."""
        from reference_impl.layers.cases import conformance_of

        units = []
        for name, (cls, rep) in self.replaced_layers().items():
            record = conformance_of(cls)
            dtypes = self.dtypes_for(record.tolerances) if record is not None else []
            units += [Unit(family, check, name, rep.__qualname__, dtype_name(d))
                      for d in (dtypes[:1] if level == "quick" else dtypes)]
        return units

    def coverage_units(self, family, check, level):
        return [Unit(family, check, name) for name in self.native_fallback_ops()]

    def layer_coverage_units(self, family, check, level):
        replaced = self.replaced_layers()
        return [Unit(family, check, name) for name in self.in_tree_layers() if name not in replaced]

    def not_covered_units(self, family, check, level):
        """What a bridged platform's runtime has that the catalog cannot grade (op: its name, case: its kind)."""
        listed = getattr(self.platform, "conformance_not_covered", list)()
        return [Unit(family, check, item.name, None, None, item.kind) for item in listed]

    def provider_units(self, family, check, level):
        """One unit per provider the platform brings, supported=False ones included."""
        return [Unit(family, check, op.name, provider) for op, provider in self._provided(False)]

    def runs_units(self, family, check, level):
        return [Unit(family, check, op.name, provider, dtype_name(d))
                for op, provider in self._provided() for d in self.op_dtypes(op)]

    def defaults_units(self, family, check, level):
        return [Unit(family, check, op_name, provider) for op_name, providers in self.defaults.items()
                for provider in providers if provider != "native"]

    def oot_registration_units(self, family, check, level):
        from reference_impl.custom_op import CustomOp

        by_class = {cls.__name__: name for name, cls in CustomOp.op_registry.items()}
        return [Unit(family, check, by_class.get(key, key), rep.__qualname__) for key, rep in self.oot.items()]

    def oot_dispatch_units(self, family, check, level):
        from reference_impl.layers.cases import conformance_of

        units = []
        for name, (cls, rep) in self.replaced_layers().items():
            record = conformance_of(cls)
            dtypes = (self.dtypes_for(record.tolerances) if record else []) or [torch.float32]
            units.append(Unit(family, check, name, rep.__qualname__, dtype_name(dtypes[0])))
        return units


def activate(name: str, platform=None) -> Inventory:
    """Make platform `name` current and return what it brings; PlatformSetupError on any failure.

    `platform`, when given, is a zero-argument factory of the Platform instance to install under that
    name instead of resolving `name` through the built-ins and entry points (the in-process meta-tests
    use it). It is called after the snapshot, so what importing the plugin registers counts as brought."""
    from reference_impl.custom_op import CustomOp
    from reference_impl.ir.op import IrOp
    from reference_impl.platforms import set_current_platform

    if platform is None:
        platform = bridge_factory(name)
    import_catalog()
    before_ir = {op_name: set(op.impls) for op_name, op in IrOp.registry.items()}
    before_oot = dict(CustomOp.op_registry_oot)
    try:
        platform = set_current_platform(platform() if platform is not None else name)
        defaults = {k: list(v) for k, v in (platform.get_default_ir_op_priority() or {}).items()}
    except Exception as exc:  # noqa: BLE001 - every cause becomes one clear line
        raise PlatformSetupError(_one_line(name, exc)) from exc
    ir_providers = {}
    for op_name, op in IrOp.registry.items():
        named = set(defaults.get(op_name, []))   # also what the defaults name, if imported earlier
        new = [p for p in op.impls if p != "native" and (p not in before_ir.get(op_name, set()) or p in named)]
        if new:
            ir_providers[op_name] = new
    oot = {k: v for k, v in CustomOp.op_registry_oot.items() if before_oot.get(k) is not v}
    return Inventory(name, platform, ir_providers, oot, defaults)


def _one_line(name: str, exc: BaseException) -> str:
    from reference_impl.plugins import PLATFORM_PLUGINS_GROUP, PluginLoadError

    if isinstance(exc, (PlatformSetupError, PluginLoadError)):
        text = str(exc)
    else:
        text = f"{type(exc).__name__}: {exc}"
        if "entry point" not in text:
            text = f"platform '{name}' (entry-point group '{PLATFORM_PLUGINS_GROUP}'): {text}"
    return "cannot activate --platform=" + name + ": " + " ".join(text.split())
