"""Which of the vLLM APIs the bridge (conformance/vllm/) uses exist in the installed vLLM, and with what signature.

Run it with the Python of an environment that has one vLLM release installed (and this project, editable):

    $VENVS/vllm-0.28.0/bin/python scripts/vllm_release_probe.py              # a markdown table for that release
    $VENVS/vllm-0.28.0/bin/python scripts/vllm_release_probe.py --json o.json  # the same facts, as JSON

Every row is one thing the bridge, its engine runner or the vLLM plugins the tests use touch: an import path, a
class, a function or method (its parameters, and whether it takes the ones the bridge passes), a platform hook, the
attention backend API, the `vllm.ir` ops, CustomOp, CpuPlatform, the engine arguments. The status is what was
observed, nothing is assumed: `ok`, `missing` (the import or attribute fails, with the error), `lacks` (it exists
but does not take a parameter or field the bridge passes, named) or `error` (probing it raised, with the error).

Several releases side by side, written into docs/vllm-releases.md between its probe markers (the rest of the page,
the hand-written findings, is kept):

    .venv/bin/python scripts/vllm_release_probe.py --doc docs/vllm-releases.md \\
        --python $VENVS/vllm-0.28.0/bin/python ... --python .venv/bin/python

Each --python runs this script in a process of its own (`--json`); the page then gets one table with a column per
release, the rows whose signature or status moved between releases (named by the first release that has the new
form), and each release's parameters the bridge passes that it lacks.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

BEGIN = "<!-- vllm_release_probe: begin (generated; edit scripts/vllm_release_probe.py, not this part) -->"
END = "<!-- vllm_release_probe: end -->"


@dataclasses.dataclass
class Row:
    """One observed API: `name` is how the doc lists it, `group` its section, `used_by` the project file using it."""

    name: str
    group: str
    used_by: str
    status: str = "ok"            # ok | missing | lacks | error
    signature: str | None = None  # normalised: parameter names, kinds and defaults, no annotations
    params: list[str] | None = None  # the same, one entry a parameter (what the moves compare)
    detail: str = ""


ROWS: list[Row] = []


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:240]}" if text else type(exc).__name__


def _resolve(target: str):
    """`module:attr.attr` -> the object (AttributeError / ImportError as they come)."""
    module, _, path = target.partition(":")
    obj = importlib.import_module(module)
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def signature_of(obj) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def parameters(sig: inspect.Signature | None) -> list[str] | None:
    """A signature's parameters without annotations (their reprs change between releases for no change of the API):
    `name`, `name=default`, `*args`, `**kwargs`, and `*` / `/` markers where keyword-only or positional-only begin."""
    if sig is None:
        return None
    parts: list[str] = []
    star_done = False
    params = list(sig.parameters.values())
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
        star_done = star_done or p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL)
        name = {p.VAR_POSITIONAL: f"*{p.name}", p.VAR_KEYWORD: f"**{p.name}"}.get(p.kind, p.name)
        if p.default is not p.empty:
            name += "=" + _ADDRESS.sub("", repr(p.default))[:60]
        parts.append(name)
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY):
            parts.append("/")
    return parts


def normalised(sig: inspect.Signature | None) -> str | None:
    params = parameters(sig)
    return None if params is None else "(" + ", ".join(params) + ")"


def lacking(sig: inspect.Signature | None, needs=(), positional=()) -> list[str]:
    """What of `needs` (passed by keyword) and `positional` (passed in that order) the signature does not take."""
    if sig is None:
        return []
    params = [p for p in sig.parameters.values() if p.name not in ("self", "cls")]
    by_name = {p.name: p for p in params}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    out = [f"no parameter {n!r}" for n in needs
           if not takes_any and (n not in by_name or by_name[n].kind is inspect.Parameter.POSITIONAL_ONLY)]
    ordered = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if list(positional) != ordered[:len(positional)]:
        out.append(f"positional order {ordered[:len(positional)]} where the bridge passes {list(positional)}")
    return out


def api(name: str, group: str, used_by: str, target: str | None = None, needs=(), positional=()) -> Row:
    """Resolve `target` (default: `name`), record its signature and what of `needs` / `positional` it lacks."""
    row = Row(name, group, used_by)
    ROWS.append(row)
    try:
        obj = _resolve(target or name)
    except (ImportError, AttributeError) as exc:
        row.status, row.detail = "missing", _line(exc)
        return row
    except Exception as exc:  # noqa: BLE001 - recorded as observed
        row.status, row.detail = "error", _line(exc)
        return row
    if callable(obj):
        sig = signature_of(obj)
        row.signature, row.params = normalised(sig), parameters(sig)
        problems = lacking(sig, needs, positional)
        if problems:
            row.status, row.detail = "lacks", "; ".join(problems)
    return row


def observe(name: str, group: str, used_by: str, fn: Callable[[], tuple[str, str] | str | None]) -> Row:
    """A row whose fact `fn` computes: it returns a detail (ok), (status, detail), or raises (missing / error)."""
    row = Row(name, group, used_by)
    ROWS.append(row)
    try:
        got = fn()
    except (ImportError, AttributeError, KeyError) as exc:
        row.status, row.detail = "missing", _line(exc)
        return row
    except Exception as exc:  # noqa: BLE001
        row.status, row.detail = "error", _line(exc)
        return row
    if isinstance(got, tuple):
        row.status, row.detail = got
    elif got:
        row.detail = got
    return row


def fields_of(cls) -> set[str]:
    """The fields a config-like class takes: dataclass fields, NamedTuple fields, or constructor parameters."""
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    if hasattr(cls, "_fields"):
        return set(cls._fields)
    sig = signature_of(cls)
    return set(sig.parameters) if sig else set()


def need_fields(cls, names) -> tuple[str, str]:
    have = fields_of(cls)
    missing = [n for n in names if n not in have]
    return ("lacks", "no field " + ", ".join(repr(n) for n in missing)) if missing else ("ok", "")


# ----- the probes, by part of the bridge --------------------------------------------------------------------------
DISCOVER = "conformance/vllm/discover.py"
WORKER = "conformance/vllm/worker_setup.py"
IR = "conformance/vllm/ir_bridge.py"
LAYERS = "conformance/vllm/layer_bridge.py"
COVERAGE = "conformance/vllm/coverage.py"
ATTN = "conformance/vllm/attention_bridge.py"
PLATFORM = "conformance/vllm/platform.py"
ENGINE = "conformance/vllm/engine_runner.py"
PLUGINS = "examples/vllm_plugin, tests/plugins/vllm_*"

PLATFORM_HOOKS_GRADED = ("get_attn_backend_cls", "get_default_ir_op_priority", "opaque_attention_op",
                         "check_and_update_config", "import_ir_kernels")
PLATFORM_HOOKS_OTHER = ("get_device_communicator_cls", "use_custom_op_collectives",
                        "stateless_init_device_torch_dist_pg", "get_punica_wrapper", "get_static_graph_wrapper_cls",
                        "support_static_graph_mode", "get_pass_manager_cls", "get_compile_backend",
                        "register_triton_kernel_overrides", "import_kernels", "fp8_dtype", "is_fp8_fnuz",
                        "supports_fp8", "manual_seed_all", "inference_mode", "update_block_size_for_backend",
                        "make_synced_weight_loader", "set_additional_forward_context", "use_all_gather",
                        "validate_request", "get_device_capability", "is_out_of_tree")
BACKEND_CLASSMETHODS = ("get_name", "get_supported_kernel_block_sizes", "get_supported_head_sizes", "supports_sink",
                        "supports_sliding_window", "supports_non_causal", "supports_alibi_sqrt", "supports_mm_prefix",
                        "supports_per_head_quant_scales", "is_mla", "is_sparse", "supports_attn_type",
                        "get_builder_cls", "get_impl_cls")
BACKEND_ATTRIBUTES = ("supported_dtypes", "supported_kv_cache_dtypes", "forward_includes_kv_cache_update")
VALIDATE_POSITIONAL = ("head_size", "dtype", "kv_cache_dtype", "block_size", "use_mla", "has_sink", "use_sparse",
                       "use_mm_prefix", "use_per_head_quant_scales", "device_capability", "attn_type")
COMMON_METADATA_FIELDS = ("query_start_loc", "query_start_loc_cpu", "seq_lens", "num_reqs", "num_actual_tokens",
                          "max_query_len", "max_seq_len", "block_table_tensor", "slot_mapping", "causal",
                          "encoder_seq_lens", "positions")
ATTENTION_ARGS = ("num_heads", "head_size", "scale", "num_kv_heads", "alibi_slopes", "cache_config",
                  "logits_soft_cap", "per_layer_sliding_window", "prefix", "attn_type", "attn_backend")
LLM_ARGS = ("model", "skip_tokenizer_init", "dtype", "seed", "enforce_eager", "max_model_len", "enable_prefix_caching",
            "enable_chunked_prefill", "max_num_batched_tokens", "max_num_seqs", "kv_cache_memory_bytes")
ENV_NAMES = ("VLLM_PLUGINS", "VLLM_TARGET_DEVICE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL")


def probe_imports_and_discovery() -> None:
    g = "discovery and imports"
    observe("vllm.__version__", g, DISCOVER, lambda: str(_resolve("vllm").__version__))
    api("vllm.config", g, DISCOVER)
    import vllm.envs as envs

    for name in ENV_NAMES:
        observe(f"vllm.envs {name}", g, f"{DISCOVER}, {ENGINE}",
                lambda name=name: "" if name in envs.environment_variables
                else ("missing", f"not in vllm.envs.environment_variables"))
    api("vllm.platforms:current_platform", g, DISCOVER)
    api("vllm.plugins:load_general_plugins", g, DISCOVER)
    observe("entry-point groups vllm.platform_plugins, vllm.general_plugins", g, DISCOVER, _plugin_groups)
    api("vllm.utils.import_utils:resolve_obj_by_qualname", g, ATTN, needs=("qualname",))


def _plugin_groups() -> tuple[str, str] | str:
    import vllm.plugins as plugins

    text = inspect.getsource(plugins)
    missing = [g for g in ("vllm.platform_plugins", "vllm.general_plugins") if g not in text]
    return ("missing", f"vllm/plugins names no group {', '.join(missing)}") if missing else ""


def probe_platform() -> None:
    g = "platform hooks (vllm.platforms.interface.Platform; CpuPlatform's override)"
    from vllm.platforms.cpu import CpuPlatform

    for hook in (*PLATFORM_HOOKS_GRADED, *PLATFORM_HOOKS_OTHER):
        row = api(f"Platform.{hook}", g, PLATFORM if hook in PLATFORM_HOOKS_GRADED else "not graded (spec list)",
                  f"vllm.platforms.interface:Platform.{hook}",
                  needs={"get_attn_backend_cls": ("num_heads",)}.get(hook, ()),
                  positional={"get_attn_backend_cls": ("selected_backend", "attn_selector_config"),
                              "get_default_ir_op_priority": ("vllm_config",)}.get(hook, ()))
        if row.status == "ok":
            row.detail = "CpuPlatform overrides it" if hook in vars(CpuPlatform) else "CpuPlatform inherits it"
    for attr in ("device_name", "device_type", "dispatch_key", "supported_dtypes"):
        observe(f"CpuPlatform.{attr}", g, PLATFORM, lambda attr=attr: repr(getattr(CpuPlatform, attr))[:80])
    observe("current_platform is a CpuPlatform", g, PLATFORM, lambda: type(_resolve("vllm.platforms:current_platform"))
            .__qualname__)


def probe_config() -> None:
    g = "config (worker_setup)"
    api("vllm.config:CompilationConfig", g, WORKER, needs=("custom_ops",))
    api("vllm.config:VllmConfig", g, WORKER, needs=("compilation_config", "model_config", "cache_config",
                                                    "scheduler_config"))
    api("vllm.config:set_current_vllm_config", g, LAYERS)
    api("vllm.config:CacheConfig", g, ATTN, needs=("block_size", "cache_dtype"))
    api("vllm.config:ModelConfig", g, ATTN, needs=("model", "tokenizer", "skip_tokenizer_init", "dtype",
                                                   "max_model_len"))
    api("vllm.config:SchedulerConfig", g, ATTN, needs=("max_num_seqs", "max_num_batched_tokens", "max_model_len",
                                                       "is_encoder_decoder"))
    api("vllm.config.kernel:IrOpPriorityConfig", g, PLUGINS)
    observe("VllmConfig(compilation_config=CompilationConfig(custom_ops=['all']))", g, WORKER, _bridge_config)
    observe("vllm_config.kernel_config.ir_op_priority.set_default()", g, WORKER,
            lambda: _config().kernel_config.ir_op_priority.set_default() or "")
    observe("compilation_config.enabled_custom_ops / disabled_custom_ops", g, LAYERS,
            lambda: f"{type(_config().compilation_config.enabled_custom_ops).__name__}, "
                    f"{type(_config().compilation_config.disabled_custom_ops).__name__}")
    observe("parallel_config.worker_cls", g, ATTN, lambda: repr(_config().parallel_config.worker_cls))
    observe("current_platform.get_default_ir_op_priority(vllm_config) is a dataclass", g, WORKER, _priorities)


_CONFIG = []


def _config():
    if not _CONFIG:
        from vllm.config import CompilationConfig, VllmConfig

        _CONFIG.append(VllmConfig(compilation_config=CompilationConfig(custom_ops=["all"])))
    return _CONFIG[0]


def _bridge_config() -> str:
    return f"custom_ops={_config().compilation_config.custom_ops}"


def _priorities() -> tuple[str, str] | str:
    from vllm.platforms import current_platform

    got = current_platform.get_default_ir_op_priority(_config())
    if not dataclasses.is_dataclass(got):
        return "lacks", f"returns {type(got).__qualname__}, not a dataclass"
    return ", ".join(f"{k}: {'/'.join(v)}" for k, v in dataclasses.asdict(got).items())[:200]


def probe_ir() -> None:
    g = "vllm.ir"
    api("vllm.ir", g, IR)
    api("vllm.ir.op:IrOp", g, IR)
    api("vllm.ir.op:IrOp.registry", g, IR)
    api("vllm.ir.op:IrOp.register_impl", g, PLUGINS, needs=("provider", "supported", "supports_args", "inplace"))
    api("vllm.ir.op:IrOpImpl", g, IR)
    observe("IrOpImpl instance: impl_fn, supported, _supports_args, inplace, provider, op", g, IR, _impl_attrs)
    try:
        from vllm.ir.op import IrOp
        from vllm.platforms import current_platform

        current_platform.import_ir_kernels()
        ops = sorted(IrOp.registry.items())
    except Exception:  # noqa: BLE001 - the rows above say why
        return
    for name, op in ops:
        def fact(op=op):
            row_sig = normalised(signature_of(op.impls["native"].impl_fn))
            providers = ", ".join(p for p in op.impls if p != "native") or "native only"
            return f"providers: {providers}; native {row_sig}"
        row = observe(f"vllm.ir op {name}", g, IR, fact)
        if "native" in op.impls:
            sig = signature_of(op.impls["native"].impl_fn)
            row.signature, row.params = normalised(sig), parameters(sig)


def _impl_attrs() -> tuple[str, str] | str:
    from vllm.ir.op import IrOp

    if not IrOp.registry:
        return "error", "IrOp.registry is empty"
    op = next(iter(IrOp.registry.values()))
    impl = op.impls["native"]
    missing = [a for a in ("impl_fn", "supported", "_supports_args", "inplace", "provider", "op")
               if not hasattr(impl, a)]
    return ("lacks", "no attribute " + ", ".join(missing)) if missing else f"checked on {op.name}"


def probe_custom_op() -> None:
    g = "CustomOp and the layer registry"
    for name in ("CustomOp", "op_registry", "op_registry_oot", "PluggableLayer"):
        api(f"vllm.model_executor.custom_op:{name}", g, f"{LAYERS}, {COVERAGE}")
    api("vllm.model_executor.custom_op:CustomOp.dispatch_forward", g, LAYERS, needs=("compile_native",))
    api("vllm.model_executor.custom_op:CustomOp.enabled", g, LAYERS)
    api("vllm.model_executor.custom_op:CustomOp.register_oot", g, PLUGINS)
    api("vllm.model_executor.custom_op:CustomOp.forward_oot", g, LAYERS)
    observe("CustomOp instance: _enforce_enable, _forward_method", g, LAYERS, _custom_op_instance)
    observe("layer library: files with CustomOp.register( / PluggableLayer.register(", g, COVERAGE, _layer_files)
    api("vllm.model_executor.layers.quantization.utils.quant_utils:GroupShape", g, LAYERS)


def _custom_op_instance() -> tuple[str, str] | str:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.custom_op import CustomOp
    from vllm.model_executor.layers.activation import SiluAndMul

    with set_current_vllm_config(_config()):
        layer = SiluAndMul()
        picked = CustomOp.dispatch_forward(layer, compile_native=False).__name__
    missing = [a for a in ("_enforce_enable", "_forward_method") if not hasattr(layer, a)]
    return ("lacks", "no attribute " + ", ".join(missing)) if missing else f"SiluAndMul dispatches to {picked}"


def _layer_files() -> str:
    from conformance.vllm.coverage import layer_modules

    return f"{len(layer_modules())} modules"


def probe_layers() -> None:
    g = "layers the bridge builds (layer_bridge.SPECS)"
    from vllm.model_executor.custom_op import op_registry

    from conformance.collect.inventory import import_catalog
    from conformance.vllm.layer_bridge import SPECS
    from reference_impl.custom_op import CustomOp as OurCustomOp

    import_catalog()   # the reference layers registered, as the harness has them when it bridges

    for spec in SPECS:
        row = api(f"{spec.module}:{spec.cls}", g, LAYERS)
        if row.status != "ok":
            continue
        cls = _resolve(f"{spec.module}:{spec.cls}")
        row.signature, row.params = normalised(signature_of(cls.__init__)), parameters(signature_of(cls.__init__))
        registered = [n for n, c in op_registry.items() if isinstance(c, type) and issubclass(cls, c)]
        notes = [f"registered as {', '.join(registered)}" if registered else "not in op_registry"]
        ours = OurCustomOp.op_registry.get(spec.name)
        if ours is not None:
            theirs = signature_of(cls.__init__)
            takes_any = any(p.kind is p.VAR_KEYWORD for p in theirs.parameters.values())
            params = list(signature_of(ours.__init__).parameters.values())[1:]
            untaken = [p for p in params if not takes_any and p.name not in theirs.parameters
                       and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY)]   # ours only
            required = [p.name for p in untaken if p.default is p.empty]
            optional = [p.name for p in untaken if p.default is not p.empty]
            adapted = spec.moved is not None and spec.moved.applies(theirs.parameters)
            if required:
                row.status = "lacks"
                notes.append(f"no parameter {', '.join(map(repr, required))} (the reference's)"
                             + (f": the bridge's release adapter for vLLM before {spec.moved.release} maps it"
                                if adapted else ""))
            if optional:
                notes.append(f"takes none of the reference's {', '.join(optional)} (dropped when at our default"
                             + (", or fixed by the release adapter" if adapted and spec.moved.fixed else "") + ")")
        row.detail = "; ".join(notes)


def probe_attention() -> None:
    g = "attention backend API (vllm/v1/attention/)"
    api("vllm.v1.attention.backend:AttentionBackend", g, ATTN)
    for m in BACKEND_CLASSMETHODS:
        api(f"vllm.v1.attention.backend:AttentionBackend.{m}", g, ATTN)
    from reference_impl.attention.backend import AttentionSelectorConfig as Ours

    # the bridge passes these positionally, then every other field of the reference's selector config by keyword
    api("vllm.v1.attention.backend:AttentionBackend.validate_configuration", g, ATTN, positional=VALIDATE_POSITIONAL,
        needs=tuple(f for f in Ours._fields if f not in VALIDATE_POSITIONAL))
    for a in BACKEND_ATTRIBUTES:
        observe(f"AttentionBackend.{a}", g, ATTN,
                lambda a=a: repr(getattr(_resolve("vllm.v1.attention.backend:AttentionBackend"), a))[:80])
    api("vllm.v1.attention.backend:MultipleOf", g, ATTN)
    api("vllm.v1.attention.backend:AttentionType", g, ATTN)
    api("vllm.v1.attention.backend:AttentionType.ENCODER_ONLY", g, ATTN)
    row = api("vllm.v1.attention.backend:CommonAttentionMetadata", g, ATTN, needs=COMMON_METADATA_FIELDS)
    api("vllm.v1.attention.backend:AttentionImpl.forward", g, ATTN,
        needs=("output", "output_scale", "output_block_scale"),
        positional=("layer", "query", "key", "value", "kv_cache", "attn_metadata"))
    cpu = "vllm.v1.attention.backends.cpu_attn"
    api(f"{cpu}:CPUAttentionBackend", g, ATTN)
    api(f"{cpu}:CPUAttentionBackendImpl.forward", g, ATTN, needs=("output", "output_scale", "output_block_scale"),
        positional=("layer", "query", "key", "value", "kv_cache", "attn_metadata"))
    api(f"{cpu}:CPUAttentionBackendImpl.do_kv_cache_update", g, ATTN,
        positional=("layer", "key", "value", "kv_cache", "slot_mapping"))
    api(f"{cpu}:CPUAttentionMetadataBuilder.build", g, ATTN, needs=("fast_build",),
        positional=("common_prefix_len", "common_attn_metadata"))
    api("vllm.v1.attention.backend:AttentionMetadataBuilder.__init__", g, ATTN,
        positional=("kv_cache_spec", "layer_names", "vllm_config", "device"))
    api("vllm.v1.attention.backend:AttentionMetadataBuilder.build", g, ATTN,
        needs=("fast_build",), positional=("common_prefix_len", "common_attn_metadata"))
    api("vllm.v1.attention.backends.registry:AttentionBackendEnum", g, ATTN)
    observe("AttentionBackendEnum.CPU_ATTN.get_class()", g, ATTN, _cpu_attn)
    api("vllm.v1.attention.selector:AttentionSelectorConfig", g, ATTN)
    observe("AttentionSelectorConfig fields: the reference's that vLLM lacks (dropped)", g, ATTN, _selector_fields)
    api("vllm.v1.kv_cache_interface:EncoderOnlyAttentionSpec", g, ATTN,
        needs=("block_size", "num_kv_heads", "head_size", "dtype"))
    api("vllm.model_executor.layers.attention:Attention", g, ATTN, needs=ATTENTION_ARGS)
    api("vllm.model_executor.layers.attention:Attention.get_kv_cache_spec", g, ATTN, positional=("vllm_config",))
    api("vllm.model_executor.layers.attention.encoder_only_attention:create_encoder_only_attention_backend", g, ATTN)
    observe("Attention layer built as the bridge builds it (float32, CPU_ATTN, block 32)", g, ATTN, _attention_layer)
    del row


def _cpu_attn() -> str:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    cls = AttentionBackendEnum["CPU_ATTN"].get_class()
    builder = cls.get_builder_cls()
    impl = cls.get_impl_cls()
    return (f"{cls.__module__}.{cls.__qualname__}; builder {builder.__qualname__} build"
            f"{normalised(signature_of(builder.build))}; impl forward{normalised(signature_of(impl.forward))}")


def _selector_fields() -> tuple[str, str] | str:
    from vllm.v1.attention.selector import AttentionSelectorConfig

    from reference_impl.attention.backend import AttentionSelectorConfig as Ours

    dropped = [f for f in Ours._fields if f not in fields_of(AttentionSelectorConfig)]
    return ("lacks", "no field " + ", ".join(dropped)) if dropped else "takes every field of the reference's"


def _attention_layer() -> str:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from conformance.vllm.attention_bridge import vllm_config

    cfg = vllm_config(torch.float32, "auto", 32)
    with set_current_vllm_config(cfg):
        layer = Attention(4, 64, 0.125, 2, None, cache_config=cfg.cache_config, logits_soft_cap=None,
                          per_layer_sliding_window=None, prefix="probe.attn", attn_type=AttentionType.DECODER,
                          attn_backend=AttentionBackendEnum["CPU_ATTN"].get_class())
        spec = layer.get_kv_cache_spec(cfg)
    missing = [a for a in ("impl", "layer_name", "attn_backend", "num_kv_heads", "head_size", "kv_cache_torch_dtype",
                           "_q_scale", "_q_scale_float", "_k_scale", "_k_scale_float", "_v_scale", "_v_scale_float",
                           "attn_type") if not hasattr(layer, a)]
    if missing:
        return "lacks", "no attribute " + ", ".join(missing)
    return f"impl {type(layer.impl).__qualname__}, kv cache spec {type(spec).__qualname__}"


def probe_engine() -> None:
    g = "engine (engine_runner: LLM, sampling, outputs)"
    row = api("vllm:LLM", g, ENGINE)
    observe("LLM(...) arguments the runner passes (EngineArgs fields)", g, ENGINE,
            lambda: need_fields(_resolve("vllm.engine.arg_utils:EngineArgs"), LLM_ARGS))
    api("vllm:LLM.generate", g, ENGINE, needs=("use_tqdm",), positional=("prompts", "sampling_params"))
    api("vllm:SamplingParams", g, ENGINE)
    observe("SamplingParams fields the runner passes", g, ENGINE,
            lambda: need_fields(_resolve("vllm:SamplingParams"),
                                ("temperature", "max_tokens", "logprobs", "ignore_eos", "detokenize")))
    api("vllm.inputs:TokensPrompt", g, ENGINE)
    observe("TokensPrompt key prompt_token_ids", g, ENGINE,
            lambda: "" if "prompt_token_ids" in _resolve("vllm.inputs:TokensPrompt").__annotations__
            else ("lacks", "no key 'prompt_token_ids'"))
    api("vllm.outputs:RequestOutput", g, ENGINE, needs=("num_cached_tokens", "outputs"))
    api("vllm.outputs:CompletionOutput", g, ENGINE, needs=("token_ids", "logprobs"))
    api("vllm.v1.engine.core_client:InprocClient.shutdown", g, ENGINE)
    observe("InprocClient keeps its shutdown in self._finalizer", g, ENGINE,
            lambda: "" if "self._finalizer" in inspect.getsource(_resolve("vllm.v1.engine.core_client:InprocClient"))
            else ("missing", "InprocClient has no _finalizer"))
    api("vllm.v1.worker.cpu_worker:CPUWorker", g, PLUGINS)
    api("vllm.v1.worker.cpu_worker:CPUWorker._maybe_get_memory_pool_context", g, PLUGINS, positional=("tag",))
    del row


PROBES = (probe_imports_and_discovery, probe_platform, probe_config, probe_ir, probe_custom_op, probe_layers,
          probe_attention, probe_engine)


def run_probes() -> dict:
    """Every probe, in this process; vLLM's own import failing is one row, and nothing else runs."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    warnings.simplefilter("ignore")
    import platform

    facts = {"python": platform.python_version(), "vllm": None, "torch": None}
    try:
        import torch
        import vllm
        import vllm.config  # noqa: F401

        facts["vllm"], facts["torch"] = str(vllm.__version__), str(torch.__version__)
    except Exception as exc:  # noqa: BLE001
        ROWS.append(Row("import vllm, vllm.config", "discovery and imports", DISCOVER, "error", None, None, _line(exc)))
        return {**facts, "rows": [dataclasses.asdict(r) for r in ROWS]}
    for probe in PROBES:
        try:
            probe()
        except Exception as exc:  # noqa: BLE001 - a probe that cannot even start is one row, the others go on
            ROWS.append(Row(probe.__name__, "probe", "scripts/vllm_release_probe.py", "error", None, None, _line(exc)))
    return {**facts, "rows": [dataclasses.asdict(r) for r in ROWS]}


# ----- markdown ---------------------------------------------------------------------------------------------------
def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def release_table(facts: dict) -> str:
    """One release's rows as a markdown table."""
    lines = [f"vLLM {facts['vllm']} (torch {facts['torch']}, Python {facts['python']})", "",
             "| API | used by | status | signature / detail |", "| --- | --- | --- | --- |"]
    for r in facts["rows"]:
        text = " ".join(x for x in (f"`{r['signature']}`" if r["signature"] else "", r["detail"]) if x)
        lines.append(f"| `{_cell(r['name'])}` | {r['used_by']} | {r['status']} | {_cell(text)} |")
    return "\n".join(lines)


def _version_key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in re.split(r"[.+]", v)[:3])


def matrix(runs: list[dict]) -> str:
    """All releases side by side, the moves between them, and each release's lacks: the doc's generated part."""
    runs = sorted(runs, key=lambda f: _version_key(f["vllm"] or "0"))
    versions = [f["vllm"] for f in runs]
    keyed = [{(r["group"], r["name"]): r for r in f["rows"]} for f in runs]
    order: list[tuple[str, str]] = []
    for rows in keyed:
        order += [k for k in rows if k not in order]
    newest = keyed[-1]
    out = [f"Releases probed: {', '.join(versions)} (torch {', '.join(sorted({f['torch'] for f in runs}))}). "
           f"A cell is `ok` when the API exists and takes what the bridge passes; `ok*` when it does but its "
           f"signature differs from {versions[-1]}'s (see the moves below); `missing`, `lacks` and `error` as "
           "observed, explained below the table; `-` when the probe had no row for it there (an IR op that release "
           "does not register).", ""]
    group = None
    for key in order:
        if key[0] != group:
            group = key[0]
            out += ["", f"### {group}", "", f"| API | used by | {' | '.join(versions)} |",
                    "| --- | --- | " + " | ".join("---" for _ in versions) + " |"]
        cells = []
        for rows in keyed:
            r = rows.get(key)
            if r is None:
                cells.append("-")
            elif r["status"] == "ok" and newest.get(key) and r["signature"] != newest[key]["signature"]:
                cells.append("ok*")
            else:
                cells.append(r["status"])
        used = next(rows[key]["used_by"] for rows in keyed if key in rows)
        out.append(f"| `{_cell(key[1])}` | {used} | {' | '.join(cells)} |")
    out += ["", "### What moved, and in which release", "",
            "Each line: the API, and for each release where it changed, what changed from the release before "
            "(`+name` a parameter added, `-name` one removed, `old -> new` a default or kind changed, or the "
            "status).", ""]
    for key in order:
        steps = []
        for (_, before), (version, after) in zip(zip(versions, keyed), zip(versions[1:], keyed[1:])):
            change = _change(before.get(key), after.get(key))
            if change:
                steps.append(f"**{version}** {change}")
        if steps:
            out.append(f"- `{_cell(key[1])}`: {'; '.join(steps)}")
    out += ["", "### What each release lacks", ""]
    for version, rows in zip(versions, keyed):
        bad = [r for r in rows.values() if r["status"] != "ok"]
        out.append(f"- **{version}**: " + ("nothing the bridge uses" if not bad else
                                           "; ".join(f"`{_cell(r['name'])}` {r['status']}: {_cell(r['detail'])}"
                                                     for r in bad)))
    return "\n".join(out)


def _change(before: dict | None, after: dict | None) -> str:
    """What changed in one API between two consecutive releases ('' for nothing)."""
    if before is None and after is None:
        return ""
    if before is None or after is None:
        return "appears" if before is None else "is gone"
    status = ""
    if before["status"] != after["status"]:
        status = f"{before['status']} -> {after['status']}"
        status += f" ({_cell(after['detail'])})" if after["status"] != "ok" and after["detail"] else ""
    old, new = before.get("params"), after.get("params")
    if old is None or new is None:   # an API that appears or goes: its status says so
        if old != new and not status:
            status = f"signature {_cell(before['signature'])} -> {_cell(after['signature'])}"
        return status
    if old == new:
        return status
    name = lambda p: p.split("=")[0]  # noqa: E731
    old_by, new_by = {name(p): p for p in old}, {name(p): p for p in new}
    parts = [f"+`{_cell(new_by[n])}`" for n in new_by if n not in old_by]
    parts += [f"-`{_cell(n)}`" for n in old_by if n not in new_by]
    parts += [f"`{_cell(old_by[n])}` -> `{_cell(new_by[n])}`" for n in new_by if n in old_by and old_by[n] != new_by[n]]
    shared = [n for n in new_by if n in old_by]
    if not parts and [n for n in old_by if n in new_by] != shared:
        parts.append(f"order {', '.join(shared)}")
    return ", ".join(filter(None, (status, *parts))) or (f"signature {_cell(before['signature'])} -> "
                                                          f"{_cell(after['signature'])}")


def write_doc(path: Path, pythons: list[str]) -> None:
    """Probe each Python in a process of its own and put the matrix between the page's markers."""
    runs = []
    for python in pythons:
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "probe.json"
            proc = subprocess.run([os.path.abspath(python), str(Path(__file__).resolve()), "--json", str(out)], cwd=d,
                                  capture_output=True, text=True, timeout=900)
            if proc.returncode != 0 or not out.exists():
                raise SystemExit(f"the probe failed under {python} (exit {proc.returncode}): {proc.stderr[-2000:]}")
            runs.append(json.loads(out.read_text()))
    command = ("    .venv/bin/python scripts/vllm_release_probe.py --doc docs/vllm-releases.md \\\n"
               + " \\\n".join(f"        --python {_portable(p)}" for p in pythons))
    body = f"{BEGIN}\n\nRegenerate this part with:\n\n{command}\n\n{matrix(runs)}\n\n{END}"
    text = path.read_text() if path.exists() else ""
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        text = head + body + tail
    else:
        text = (text.rstrip() + "\n\n" if text else "") + body + "\n"
    path.write_text(text)


def _portable(python: str) -> str:
    """The interpreter path as the doc prints it: inside the repository relative, elsewhere under $VENVS."""
    p = Path(python)
    root = Path(__file__).resolve().parents[1]
    try:
        return str(p.absolute().relative_to(root))
    except ValueError:
        return f"$VENVS/{p.parent.parent.name}/bin/python"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH", help="write this release's facts as JSON to PATH")
    parser.add_argument("--doc", metavar="PAGE", help="probe each --python and write the matrix into PAGE")
    parser.add_argument("--python", action="append", default=[], help="an interpreter with one vLLM release (--doc)")
    args = parser.parse_args(argv)
    if args.doc:
        if not args.python:
            parser.error("--doc needs at least one --python")
        write_doc(Path(args.doc), args.python)
        return 0
    facts = run_probes()
    if args.json:
        Path(args.json).write_text(json.dumps(facts, indent=1))
    else:
        print(release_table(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
