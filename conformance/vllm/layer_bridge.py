"""vLLM's CustomOp layers, as `register_oot` replacements of the reference layers of the same name.

For each vLLM layer in `SPECS` that vLLM registers, a replacement class is registered with the
reference `CustomOp.register_oot` on our in-tree class. Constructing it builds our layer and
vLLM's the way vLLM builds it: our constructor arguments mapped onto vLLM's signature by name,
inside the bridge's `VllmConfig` (custom ops all on), so vLLM's own `CustomOp.__new__` picks the
class a vendor's `register_oot` put in its place and vLLM's dispatch picks `forward_<platform>`.
vLLM's layer shares our parameters and buffers (same tensors), and our `forward_oot` calls its
`forward`; the numerics check then compares that against our `forward_native` with the same
parameters, the dispatch checks see it run, and the model check builds the decoder with it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from conformance.collect.releases import ReleaseLacks

PREFIX = "vllm:"


@dataclasses.dataclass(frozen=True)
class Moved:
    """A vLLM constructor as it was before `release` gave it the reference's arguments (a release adapter).

    It applies when the installed class's constructor lacks the first of `renamed`'s reference names and takes its
    old name: `renamed` maps our argument names to the old ones; `fixed` names our arguments the old constructor did
    not take because its layer fixed them, with the values that match what it fixed (dropped when given one of
    them; any other value cannot be built by that release, and construction raises ReleaseLacks, a NotImplementedError
    naming the installed release, which the checks grade NOT_SUPPORTED)."""

    release: str                                        # the first vLLM release with the reference's arguments
    renamed: tuple[tuple[str, str], ...]                # (ours, vLLM's before `release`)
    fixed: tuple[tuple[str, tuple[Any, ...], str], ...] = ()   # (ours, values matching the old layer, what it has)

    def applies(self, accepted) -> bool:
        ours, old = self.renamed[0]
        return ours not in accepted and old in accepted


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """A vLLM layer the bridge builds; `name` is the registered name, the same in vLLM and our catalog."""

    name: str
    module: str                       # where the vLLM class lives
    cls: str                          # the class vLLM's models construct (a subclass of the registered one)
    mutates: tuple[int, ...] = ()     # forward arguments vLLM writes in place (ours are functional): cloned
    convert: Callable[[dict[str, Any]], dict[str, Any]] | None = None   # our argument values -> vLLM's types
    moved: Moved | None = None        # its constructor before the release that gave it our arguments


def _vllm_group_shape(kwargs: dict[str, Any]) -> dict[str, Any]:
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    return {**kwargs, "group_shape": GroupShape(*kwargs["group_shape"])}


_ACT = "vllm.model_executor.layers.activation"
_ROPE = "vllm.model_executor.layers.rotary_embedding"
SPECS = (
    *(LayerSpec(name, _ACT, cls) for name, cls in (
        ("silu_and_mul", "SiluAndMul"), ("mul_and_silu", "MulAndSilu"), ("gelu_and_mul", "GeluAndMul"),
        ("gelu_and_mul_sparse", "GeluAndMulSparse"), ("gelu_new", "NewGELU"), ("gelu_fast", "FastGELU"),
        ("quick_gelu", "QuickGELU"), ("relu2", "ReLUSquaredActivation"), ("swigluoai_and_mul", "SwigluOAIAndMul"),
        ("fatrelu_and_mul", "FatreluAndMul"), ("xielu", "XIELU"))),
    LayerSpec("rms_norm", "vllm.model_executor.layers.layernorm", "RMSNorm"),
    LayerSpec("gemma_rms_norm", "vllm.model_executor.layers.layernorm", "GemmaRMSNorm"),
    LayerSpec("rms_norm_gated", "vllm.model_executor.layers.layernorm", "RMSNormGated"),
    # vLLM's rotary forward rotates query and key in place (its _C kernel writes them)
    LayerSpec("rotary_embedding", f"{_ROPE}.base", "RotaryEmbedding", mutates=(1, 2)),
    LayerSpec("dual_chunk_rotary_embedding", f"{_ROPE}.dual_chunk_rope", "DualChunkRotaryEmbedding",
              mutates=(1, 2)),
    LayerSpec("apply_rotary_emb", f"{_ROPE}.common", "ApplyRotaryEmb"),
    LayerSpec("quant_fp8", "vllm.model_executor.layers.quantization.input_quant_fp8", "QuantFP8",
              convert=_vllm_group_shape),
    LayerSpec("conv2d", "vllm.model_executor.layers.conv", "Conv2dLayer"),
    LayerSpec("conv3d", "vllm.model_executor.layers.conv", "Conv3dLayer"),
    # the elementwise and norm layers the catalog gained for vLLM 0.32 parity
    *(LayerSpec(name, _ACT, cls) for name, cls in (
        ("gelu", "GELU"), ("gelu_tanh", "GELUTanh"), ("silu_and_mul_with_clamp", "SiluAndMulWithClamp"),
        ("situ_and_mul", "SituAndMul"), ("swiglustep_and_mul", "SwigluStepAndMul"))),
    # vLLM 0.32 made both CustomOps with the reference's arguments; before it LayerNorm(dim, eps) was a plain module
    # with float32 weight and bias always, and NemotronLayerNorm1P an nn.LayerNorm (normalized_shape, ...)
    LayerSpec("layer_norm", "vllm.model_executor.layers.layernorm", "LayerNorm",
              moved=Moved("0.32", (("hidden_size", "dim"),), (
                  ("dtype", (None, torch.float32), "float32 weight and bias"),
                  ("elementwise_affine", (True,), "a weight always"), ("bias", (True,), "a bias always")))),
    LayerSpec("nemotron_layer_norm", "vllm.model_executor.models.nemotron", "NemotronLayerNorm1P",
              moved=Moved("0.32", (("hidden_size", "normalized_shape"),))),
    LayerSpec("fused_rms_norm_gated", "vllm.third_party.flash_linear_attention.ops.fused_norm_gate",
              "FusedRMSNormGated"),
    LayerSpec("fused_mm_input_norm", "vllm.model_executor.layers.fusion.mm_input_norm", "FusedMMInputNorm"),
)


def vllm_class(spec: LayerSpec) -> type:
    return getattr(importlib.import_module(spec.module), spec.cls)


def constructed_class(vllm_cls: type) -> type:
    """The class vLLM's CustomOp.__new__ builds for `vllm_cls`: a vendor's register_oot replacement if any."""
    from vllm.model_executor.custom_op import op_registry_oot

    return op_registry_oot.get(vllm_cls.__name__, vllm_cls)


def vllm_arguments(ours: type, theirs: type, args: tuple, kwargs: dict,
                   convert: Callable | None = None, moved: Moved | None = None) -> dict[str, Any]:
    """Our constructor arguments (defaults applied) as keyword arguments of vLLM's constructor.

    An argument vLLM's constructor does not take is dropped when it has our default value (ours
    adds `enforce_enable`, for example), and is a TypeError naming it otherwise. Where `moved` applies
    (an older vLLM whose constructor had other arguments), its renames and fixed values come first."""
    sig = inspect.signature(ours.__init__)
    bound = sig.bind(None, *args, **kwargs)
    bound.apply_defaults()
    values = dict(list(bound.arguments.items())[1:])
    accepted = inspect.signature(theirs.__init__).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    if moved is not None and moved.applies(accepted):
        values = _before(moved, theirs, values)
    out = {}
    for name, value in values.items():
        if name in accepted or takes_any:
            out[name] = value
        elif value != sig.parameters[name].default:
            raise TypeError(f"{theirs.__module__}.{theirs.__qualname__} takes no argument {name!r} "
                            f"(the reference {ours.__name__} was given {name}={value!r})")
    return convert(out) if convert else out


def _before(moved: Moved, theirs: type, values: dict[str, Any]) -> dict[str, Any]:
    """Our argument values as the constructor of a vLLM release before `moved.release` takes them."""
    renamed = dict(moved.renamed)
    out = {renamed.get(name, name): value for name, value in values.items()}
    for name, matching, has in moved.fixed:
        if name not in out:
            continue
        value = out.pop(name)
        if not any(value is m or value == m for m in matching):
            from conformance.vllm.discover import installed_version

            raise ReleaseLacks(
                "vLLM", installed_version(),
                f"{name}={value!r} in {theirs.__module__}.{theirs.__qualname__} (it takes no {name!r} before vLLM "
                f"{moved.release}: its layer has {has})", moved.release)
    return out


def share_tensors(ours: nn.Module, theirs: nn.Module) -> None:
    """Point vLLM's parameters and buffers at ours where the name and shape agree (the same tensors, so
    loading our state or seeding our parameters sets vLLM's too)."""
    for name, tensor in [*ours.named_parameters(), *ours.named_buffers()]:
        path, _, leaf = name.rpartition(".")
        try:
            owner = theirs.get_submodule(path)
        except AttributeError:
            continue
        current = owner._parameters.get(leaf, owner._buffers.get(leaf, owner.__dict__.get(leaf)))
        if not isinstance(current, torch.Tensor) or current.shape != tensor.shape:
            continue
        if leaf in owner._parameters:
            owner._parameters[leaf] = (tensor if isinstance(tensor, nn.Parameter)
                                       else nn.Parameter(tensor, requires_grad=False))
        elif leaf in owner._buffers:
            owner._buffers[leaf] = tensor.detach() if isinstance(tensor, nn.Parameter) else tensor
        else:
            owner.__dict__[leaf] = tensor


def make_replacement(spec: LayerSpec, ours: type, theirs: type) -> type:
    """A subclass of our in-tree class whose forward_oot runs vLLM's layer `theirs` (see the module doc)."""
    from vllm.config import set_current_vllm_config

    from conformance.vllm.worker_setup import vllm_config

    mutates = spec.mutates

    def __init__(self, *args, **kwargs):
        ours.__init__(self, *args, **kwargs)
        arguments = vllm_arguments(ours, theirs, args, kwargs, spec.convert, spec.moved)
        with set_current_vllm_config(vllm_config()):
            layer = theirs(**arguments)
        object.__setattr__(self, "vllm_layer", layer)   # not a submodule: our state_dict stays the reference's
        share_tensors(self, layer)

    def _apply(self, fn, recurse=True):
        ours._apply(self, fn, recurse)
        self.vllm_layer._apply(fn, recurse)
        share_tensors(self, self.vllm_layer)
        return self

    def forward_oot(self, *args, **kwargs):
        if mutates:
            args = tuple(a.clone() if i in mutates and isinstance(a, torch.Tensor) else a for i, a in enumerate(args))
        return self.vllm_layer(*args, **kwargs)

    def conformance_dispatch(self):
        return vllm_dispatch(self.vllm_layer, theirs)

    label = PREFIX + constructed_class(theirs).__name__
    doc = (f"vLLM's {theirs.__module__}.{theirs.__qualname__} (as vLLM constructs it) behind the reference "
           f"{ours.__name__}: forward_oot calls its forward.")
    cls = type(label, (ours,), {"__init__": __init__, "_apply": _apply, "forward_oot": forward_oot,
                                "conformance_dispatch": conformance_dispatch,
                                "__doc__": doc, "__module__": __name__, "__qualname__": label,
                                "vllm_spec": spec, "vllm_class": theirs,
                                # whose code runs (conformance.collect.origin): the class vLLM builds
                                "conformance_code": constructed_class(theirs),
                                "conformance_in_tree": constructed_class(theirs) is theirs})
    return cls


# code that is not a vLLM plugin's own: vLLM, torch, and the bridge's wrapper classes
UPSTREAM = ("vllm.", "torch.", "builtins", "conformance.", "reference_impl.")


def vllm_dispatch(layer, theirs: type):
    """What vLLM built and picked for `layer` (conformance.collect.dispatch_target.DispatchTarget): its class (a vendor's
    register_oot class or vLLM's own), the forward vLLM's dispatch_forward chose at construction, the one
    vLLM's own CustomOp.dispatch_forward picks on this platform when enabled, and the class's enabled()."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.custom_op import CustomOp as VllmCustomOp

    from conformance.collect.dispatch_target import DispatchTarget
    from conformance.vllm.worker_setup import vllm_config

    if not isinstance(layer, VllmCustomOp):   # a PluggableLayer: no per-platform dispatch
        return DispatchTarget(layer, theirs, layer.forward, "forward", "vLLM", UPSTREAM, True)
    config = vllm_config()
    compilation = config.compilation_config
    counts = (compilation.enabled_custom_ops.copy(), compilation.disabled_custom_ops.copy())
    saved = layer._enforce_enable
    try:
        with set_current_vllm_config(config):
            enabled = bool(saved or type(layer).enabled())
            layer._enforce_enable = True
            platform_method = VllmCustomOp.dispatch_forward(layer, compile_native=False).__name__
    finally:
        layer._enforce_enable = saved
        compilation.enabled_custom_ops, compilation.disabled_custom_ops = counts   # as vLLM's construction left them
    return DispatchTarget(layer, theirs, layer._forward_method, platform_method, "vLLM", UPSTREAM, enabled)


@dataclasses.dataclass
class LayerBridge:
    """What the layer bridge did: the replacements it registered, by registered name."""

    replaced: dict[str, type] = dataclasses.field(default_factory=dict)


def bridge_layers() -> LayerBridge:
    """Register a replacement for every vLLM layer of SPECS that vLLM registers and our catalog declares."""
    from reference_impl.custom_op import CustomOp

    result = LayerBridge()
    for spec in SPECS:
        ours = CustomOp.op_registry.get(spec.name)
        if ours is None:
            continue
        try:
            theirs = vllm_class(spec)
        except (ImportError, AttributeError):   # this vLLM lacks it; if it registers it elsewhere, coverage lists it
            continue
        existing = CustomOp.op_registry_oot.get(ours.__name__)
        if existing is not None and getattr(existing, "vllm_spec", None) == spec:
            result.replaced[spec.name] = existing
            continue
        replacement = make_replacement(spec, ours, theirs)
        CustomOp.register_oot(_decorated_op_cls=replacement, name=ours.__name__)
        result.replaced[spec.name] = replacement
    return result
