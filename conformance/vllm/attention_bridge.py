"""vLLM's attention backends presented as our attention contract (reference_impl.attention), so the `attention`
family grades them unchanged under `--platform=vllm`.

An adapter backend wraps one vLLM backend class: its declarations are vLLM's (dtypes, KV dtypes, block sizes,
head sizes, capability predicates, validate_configuration); its impl builds a real vLLM `Attention` layer (vLLM
0.32's CPU backend needs one: its builder finds the layer in the config's static forward context and sets
`layer.isa`) inside a VllmConfig of the batch's model dtype, KV-cache dtype and block size, with a weightless
tmp LlamaConfig model; its builder is vLLM's builder over that layer, fed vLLM's `CommonAttentionMetadata`; cache
writes go through vLLM's `do_kv_cache_update` and attention through vLLM's `impl.forward(output=...)`.

Vendor hooks (`AttentionHooks`, looked up as the vLLM backend class's `conformance_attention_hooks`): the
metadata the builder takes (a backend with its own `CommonAttentionMetadata` subclass) and the cache object the
backend takes (a backend with its own cache layout, e.g. tuple K/V caches as views of the harness's tensor).
The defaults are vLLM 0.32's: the common metadata as is, the per-layer `[blocks, KVH, block, 2*D]` tensor.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import itertools
import json
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from conformance.collect.releases import ReleaseLacks
from reference_impl.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    MultipleOf,
)

MODULE = __name__
_COUNTER = itertools.count()


@dataclasses.dataclass(frozen=True)
class AttentionHooks:
    """What a vendor backend may need the harness to do its way; None = vLLM 0.32's behaviour.

    `common_metadata(ours, vllm_layer) -> object`: the metadata handed to the backend's builder (default: vLLM's
    `CommonAttentionMetadata` with our fields). `kv_cache(cache, vllm_layer) -> object`: what the backend's writer
    and forward take for the layer's cache; it must be views of `cache` (the harness checks that tensor's bytes).
    """

    common_metadata: Callable[[Any, Any], Any] | None = None
    kv_cache: Callable[[torch.Tensor, Any], Any] | None = None


def hooks_of(vllm_backend: type) -> AttentionHooks:
    found = getattr(vllm_backend, "conformance_attention_hooks", None)
    return found if isinstance(found, AttentionHooks) else AttentionHooks()


# ----- the VllmConfig a layer is built in ------------------------------------------------------------------------
@functools.cache
def _model_dir() -> str:
    """A scratch directory holding a small LlamaConfig config.json and no weights (vLLM's ModelConfig reads only
    that), kept as long as the process."""
    from conformance import scratch_dirs

    d = scratch_dirs.new_directory("vllm-model", remove_at_exit=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
              "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 1,
              "vocab_size": 1024, "max_position_embeddings": 65536, "rms_norm_eps": 1e-5, "torch_dtype": "float32"}
    with open(f"{d}/config.json", "w") as f:
        json.dump(config, f)
    return d


MAX_MODEL_LEN = 16384


@functools.cache
def vllm_config(dtype: torch.dtype, kv_cache_dtype: str, block_size: int):
    """The VllmConfig for layers of one model dtype, KV-cache dtype and block size (vLLM's CPU builder reads the
    model dtype and cache dtype from it); compilation as the bridge's (custom ops all on)."""
    import copy

    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    from conformance.vllm import worker_setup

    d = _model_dir()
    model = ModelConfig(model=d, tokenizer=d, skip_tokenizer_init=True, dtype=dtype, max_model_len=MAX_MODEL_LEN)
    return VllmConfig(model_config=model, cache_config=CacheConfig(block_size=block_size, cache_dtype=kv_cache_dtype),
                      scheduler_config=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=MAX_MODEL_LEN,
                                                       max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False),
                      compilation_config=copy.deepcopy(worker_setup.vllm_config().compilation_config))


class _default_dtype:
    """`torch.set_default_dtype(dtype)` inside the block (vLLM's layer reads the model dtype from it)."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def __enter__(self):
        self.previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.previous)


# ----- the adapter's impl and builder ----------------------------------------------------------------------------
class BridgedImpl(AttentionImpl):
    """Our impl contract over a vLLM `Attention` layer of the wrapped backend, built on first use (it needs the
    model dtype, block size and scales, which our layer carries)."""

    backend: ClassVar[type]   # the adapter backend

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None, sliding_window=None,
                 kv_cache_dtype="auto", logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
                 sinks=None, **extra):
        self.args = dict(num_heads=num_heads, head_size=head_size, scale=scale,
                         num_kv_heads=num_heads if num_kv_heads is None else num_kv_heads, alibi_slopes=alibi_slopes,
                         sliding_window=sliding_window, kv_cache_dtype=kv_cache_dtype, logits_soft_cap=logits_soft_cap,
                         attn_type=str(getattr(attn_type, "value", attn_type)), sinks=sinks, extra=extra)
        self.sliding_window = sliding_window
        self.vllm_layer = None
        self.config = None

    def layer_for(self, layer):
        """The vLLM layer behind our `layer` (built the first time), with our layer's q/k/v scales."""
        if self.vllm_layer is None:
            self._build(layer)
        v = self.vllm_layer
        for name in ("q", "k", "v"):
            value = float(getattr(layer, f"_{name}_scale_float", 1.0))
            getattr(v, f"_{name}_scale").fill_(value)
            setattr(v, f"_{name}_scale_float", value)
        return v

    def _build(self, layer) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.attention import Attention
        from vllm.v1.attention.backend import AttentionType

        a = self.args
        cfg = vllm_config(layer.dtype, a["kv_cache_dtype"], layer.block_size)
        extra = dict(a["extra"])
        if a["sinks"] is not None:
            extra["sinks"] = a["sinks"]
        backend = self.backend.vllm_backend
        if a["attn_type"] == AttentionType.ENCODER_ONLY.value:
            # what vLLM's EncoderOnlyAttention layer runs: the backend with a builder that sets causal=False
            from vllm.model_executor.layers.attention.encoder_only_attention import (
                create_encoder_only_attention_backend,
            )

            backend = create_encoder_only_attention_backend(backend)
        with set_current_vllm_config(cfg), _default_dtype(layer.dtype):
            self.vllm_layer = Attention(a["num_heads"], a["head_size"], a["scale"], a["num_kv_heads"],
                                        a["alibi_slopes"], cache_config=cfg.cache_config,
                                        logits_soft_cap=a["logits_soft_cap"],
                                        per_layer_sliding_window=a["sliding_window"],
                                        prefix=f"conformance.attn.{next(_COUNTER)}",
                                        attn_type=AttentionType(a["attn_type"]),
                                        attn_backend=backend, **extra)
        self.config = cfg

    def _cache(self, kv_cache, vllm_layer):
        hook = hooks_of(self.backend.vllm_backend).kv_cache
        return kv_cache if hook is None else hook(kv_cache, vllm_layer)

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        from vllm.config import set_current_vllm_config

        v = self.layer_for(layer)
        with set_current_vllm_config(self.config):
            v.impl.do_kv_cache_update(v, key, value, self._cache(kv_cache, v), slot_mapping)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        from vllm.config import set_current_vllm_config

        v = self.layer_for(layer)
        with set_current_vllm_config(self.config):
            return v.impl.forward(v, query, key, value, self._cache(kv_cache, v), attn_metadata, output=output,
                                  output_scale=output_scale, output_block_scale=output_block_scale)


class BridgedBuilder(AttentionMetadataBuilder):
    """vLLM's metadata builder of the wrapped backend over the vLLM layers behind `layer_names` (our layers)."""

    backend: ClassVar[type]

    def __init__(self, kv_cache_spec, layer_names, config, device):
        from vllm.config import set_current_vllm_config

        from reference_impl.attention import forward_context

        super().__init__(kv_cache_spec, layer_names, config, device)
        ours = [forward_context.layer_named(name) for name in layer_names]
        self.vllm_layers = [layer.impl.layer_for(layer) for layer in ours]
        first = self.vllm_layers[0]
        self.vllm_config = ours[0].impl.config
        with set_current_vllm_config(self.vllm_config):
            spec = first.get_kv_cache_spec(self.vllm_config)
            self.encoder_only = spec is None and str(first.attn_type.value) == "encoder_only"
            if self.encoder_only:
                # no KV cache of its own: vLLM's runner gives such layers an EncoderOnlyAttentionSpec group
                from vllm.v1.kv_cache_interface import EncoderOnlyAttentionSpec

                spec = EncoderOnlyAttentionSpec(block_size=kv_cache_spec.block_size, num_kv_heads=first.num_kv_heads,
                                                head_size=first.head_size, dtype=first.kv_cache_torch_dtype)
            if spec is None:
                raise NotImplementedError(f"the bridge builds no KV-cache spec for attention type "
                                          f"{first.attn_type.value} (vLLM's layer has none)")
            if spec.block_size != kv_cache_spec.block_size:
                # vLLM picks a sliding-window layer's block size itself (Attention.get_kv_cache_spec); the harness
                # hands the backend caches of the case's block size, so the builder is told that one
                spec = dataclasses.replace(spec, block_size=kv_cache_spec.block_size)
            builder_cls = first.attn_backend.get_builder_cls()
            self.vllm_builder = builder_cls(spec, [v.layer_name for v in self.vllm_layers], self.vllm_config,
                                            torch.device(device))

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        from vllm.config import set_current_vllm_config

        hook = hooks_of(self.backend.vllm_backend).common_metadata
        md = (hook or vllm_common_metadata)(common_attn_metadata, self.vllm_layers[0])
        if self.encoder_only:
            # vLLM's runner hands an encoder-only group its own slot mapping, which the builder fills (CPU_ATTN:
            # compute_slot_mapping_kernel_impl), and the token positions
            md = dataclasses.replace(md, slot_mapping=md.slot_mapping.clone(),
                                     positions=md.positions if md.positions is not None else positions_of(md))
        with set_current_vllm_config(self.vllm_config):
            return self.vllm_builder.build(common_prefix_len, md, fast_build=fast_build)


def positions_of(md) -> torch.Tensor:
    """Each token's position in its request (context length + its index among the new tokens); 0 for padding."""
    qsl = md.query_start_loc_cpu.tolist()
    seqs = md.seq_lens.cpu().tolist()
    positions = torch.zeros(md.slot_mapping.shape[0], dtype=torch.int64)
    for i, s in enumerate(seqs):
        q = qsl[i + 1] - qsl[i]
        positions[qsl[i]: qsl[i + 1]] = torch.arange(s - q, s)
    return positions.to(md.seq_lens.device)


def vllm_common_metadata(ours, vllm_layer=None):
    """vLLM 0.32's `CommonAttentionMetadata` with our fields (the same tensors: a builder that changes them is
    seen by the aliasing check)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    return CommonAttentionMetadata(
        query_start_loc=ours.query_start_loc, query_start_loc_cpu=ours.query_start_loc_cpu, seq_lens=ours.seq_lens,
        num_reqs=ours.num_reqs, num_actual_tokens=ours.num_actual_tokens, max_query_len=ours.max_query_len,
        max_seq_len=ours.max_seq_len, block_table_tensor=ours.block_table_tensor, slot_mapping=ours.slot_mapping,
        causal=ours.causal, encoder_seq_lens=ours.encoder_seq_lens, positions=ours.positions)


# ----- the adapter backend ---------------------------------------------------------------------------------------
def _ours(size):
    """vLLM's block-size declaration as ours (MultipleOf is a different class in each)."""
    base = getattr(size, "base", None)
    return MultipleOf(base) if base is not None else size


class BridgedBackend(AttentionBackend):
    """Base of the adapters; `vllm_backend` is the vLLM class graded. Declarations are vLLM's."""

    vllm_backend: ClassVar[type]

    @classmethod
    def get_name(cls) -> str:
        return cls.vllm_backend.get_name()

    @classmethod
    def get_supported_kernel_block_sizes(cls, kv_cache_spec=None):
        return [_ours(s) for s in cls.vllm_backend.get_supported_kernel_block_sizes()]

    @classmethod
    def get_supported_head_sizes(cls):
        return list(cls.vllm_backend.get_supported_head_sizes())

    @classmethod
    def supports_sink(cls):
        return bool(cls.vllm_backend.supports_sink())

    @classmethod
    def supports_sliding_window(cls):
        return bool(cls.vllm_backend.supports_sliding_window())

    @classmethod
    def supports_non_causal(cls):
        return bool(cls.vllm_backend.supports_non_causal())

    @classmethod
    def supports_alibi_sqrt(cls):
        return bool(cls.vllm_backend.supports_alibi_sqrt())

    @classmethod
    def supports_mm_prefix(cls):
        return bool(cls.vllm_backend.supports_mm_prefix())

    @classmethod
    def supports_per_head_quant_scales(cls):
        return bool(cls.vllm_backend.supports_per_head_quant_scales())

    @classmethod
    def is_mla(cls):
        return bool(cls.vllm_backend.is_mla())

    @classmethod
    def is_sparse(cls):
        return bool(cls.vllm_backend.is_sparse())

    @classmethod
    def supports_attn_type(cls, attn_type):
        return bool(cls.vllm_backend.supports_attn_type(str(getattr(attn_type, "value", attn_type))))

    @classmethod
    def validate_configuration(cls, head_size, dtype, kv_cache_dtype, block_size, use_mla=False, has_sink=False,
                               use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
                               device_capability=None, attn_type="decoder", **flags):
        """vLLM's own validate_configuration (with the current platform's device capability).

        Only the selector flags the installed vLLM's validate_configuration takes are passed (older releases lack
        later ones: use_dcp before 0.29, use_rswa before 0.30). A flag it lacks that is off is left out (the release
        behaves as if it were off); one that is set makes the answer a reason naming the release, so the case is
        NOT_SUPPORTED there rather than graded as if the flag were off."""
        taken, absent = split_flags(cls.vllm_backend, flags)
        if absent:
            return [str(flag_lacks(name)) for name in absent]
        if device_capability is None:
            from vllm.platforms import current_platform

            device_capability = current_platform.get_device_capability()
        return list(cls.vllm_backend.validate_configuration(
            head_size, dtype, kv_cache_dtype, block_size, use_mla, has_sink, use_sparse, use_mm_prefix,
            use_per_head_quant_scales, device_capability, str(getattr(attn_type, "value", attn_type)), **taken))


# The vLLM release that added each selector flag an older release lacks (scripts/vllm_release_probe.py,
# docs/vllm-releases.md); a flag not listed is named as "a later release".
FLAG_RELEASES = {"use_dcp": "0.29", "use_rswa": "0.30"}


@functools.cache
def validate_parameters(vllm_backend: type) -> frozenset[str] | None:
    """The keyword names `vllm_backend.validate_configuration` takes (its signature, read once per class); None
    when it takes any (**kwargs)."""
    params = inspect.signature(vllm_backend.validate_configuration).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(params)


def split_flags(vllm_backend: type, flags: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the flags `vllm_backend.validate_configuration` takes, the names of those it lacks that are set)."""
    accepted = validate_parameters(vllm_backend)
    if accepted is None:
        return dict(flags), []
    taken = {name: value for name, value in flags.items() if name in accepted}
    absent = sorted(name for name, value in flags.items() if name not in accepted and value)
    return taken, absent


def flag_lacks(name: str) -> ReleaseLacks:
    """The installed vLLM lacks selector flag `name`: what a case setting it is told (it names the release)."""
    from conformance.vllm.discover import installed_version

    return ReleaseLacks("vLLM", installed_version(), f"the attention selector flag {name} (the case sets it)",
                        FLAG_RELEASES.get(name))


def _registered_as(vllm_backend: type) -> bool:
    """Whether vLLM's registry holds `vllm_backend` itself under its name (vLLM's own backends, and a plugin's
    registered with `register_backend`); a plugin's platform may return any class path without registering it."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    name = vllm_backend.get_name()
    if name not in AttentionBackendEnum.__members__:
        return False
    try:
        return AttentionBackendEnum[name].get_class() is vllm_backend
    except (ValueError, ImportError, AttributeError):   # a CUSTOM placeholder nobody registered
        return False


def _attribute(vllm_backend: type) -> str:
    """The name the adapter is importable as under MODULE: vLLM's registry name where the registry holds this very
    class, else the class's own path with ':' for '.' (a vendor's `CUSTOM`, or its subclass keeping `CPU_ATTN`,
    must resolve to the vendor's class in every process, never to whatever vLLM registers under that name)."""
    if _registered_as(vllm_backend):
        return vllm_backend.get_name()
    return f"{vllm_backend.__module__}.{vllm_backend.__qualname__}".replace(".", ":")


@functools.cache
def adapter(vllm_backend: type) -> type:
    """The adapter backend class for one vLLM backend class (one per class, importable as MODULE.<attribute>)."""
    name = vllm_backend.get_name()
    attrs = {"vllm_backend": vllm_backend, "conformance_code": vllm_backend,
             "supported_dtypes": list(vllm_backend.supported_dtypes),
             "supported_kv_cache_dtypes": list(vllm_backend.supported_kv_cache_dtypes),
             "forward_includes_kv_cache_update": bool(vllm_backend.forward_includes_kv_cache_update),
             "__module__": MODULE, "__qualname__": _attribute(vllm_backend),
             "__doc__": f"vLLM's {vllm_backend.__module__}.{vllm_backend.__qualname__} as our attention contract."}
    backend = type(name, (BridgedBackend,), attrs)
    vllm_builder = vllm_backend.get_builder_cls()
    builder = type(f"{name}_builder", (BridgedBuilder,),
                   {"backend": backend, "__module__": MODULE, "__qualname__": f"{name}.builder",
                    "reorder_batch_threshold": getattr(vllm_builder, "reorder_batch_threshold", None)})
    impl = type(f"{name}_impl", (BridgedImpl,), {"backend": backend, "__module__": MODULE,
                                                 "__qualname__": f"{name}.impl"})
    backend.get_impl_cls = staticmethod(lambda: impl)
    backend.get_builder_cls = staticmethod(lambda: builder)
    return backend


def adapter_path(vllm_backend: type) -> str:
    """The qualname the bridged platform returns for `vllm_backend`, registered in our registry under vLLM's name."""
    from reference_impl.attention.registry import AttentionBackendEnum, _OVERRIDES, register_backend

    cls = adapter(vllm_backend)
    path = f"{MODULE}.{cls.__qualname__}"
    name = vllm_backend.get_name()
    if name in AttentionBackendEnum:
        if _OVERRIDES.get(name, AttentionBackendEnum[name].value) != path:
            register_backend(AttentionBackendEnum[name], path)
    else:
        register_backend(name, path)
    return path


def __getattr__(name: str) -> type:
    """`MODULE.<vLLM backend name>`: the adapter of the class vLLM's registry names (so qualnames resolve in any
    process, e.g. a worker that imports them from a results file)."""
    if name.startswith("__"):
        raise AttributeError(name)
    if ":" in name:     # a class vLLM's registry does not hold under its name (see _attribute)
        module, _, qualname = name.replace(":", ".").rpartition(".")
        try:
            return adapter(getattr(importlib.import_module(module), qualname))
        except (ImportError, AttributeError) as exc:
            raise AttributeError(f"no attention backend class {module}.{qualname}: {exc}") from exc
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except ImportError as exc:
        raise AttributeError(name) from exc
    if name not in AttentionBackendEnum.__members__:
        raise AttributeError(f"vLLM has no attention backend named {name!r}")
    return adapter(AttentionBackendEnum[name].get_class())


# ----- selection -------------------------------------------------------------------------------------------------
def vllm_selector_config(ours):
    """Our AttentionSelectorConfig as the installed vLLM's (the same field names). A field that vLLM's lacks is
    left out when off; when set, ReleaseLacks naming the release (its platform cannot be asked about it)."""
    from vllm.v1.attention.selector import AttentionSelectorConfig

    fields = ours._asdict()
    fields["attn_type"] = str(getattr(fields["attn_type"], "value", fields["attn_type"]))
    absent = sorted(k for k, v in fields.items() if k not in AttentionSelectorConfig._fields and v)
    if absent:
        raise flag_lacks(absent[0])
    return AttentionSelectorConfig(**{k: v for k, v in fields.items() if k in AttentionSelectorConfig._fields})


def runner_attention(resolved, vllm_backend: type) -> str | None:
    """Why the backend a plugin's platform returns is not what it runs, or None: a plugin platform whose worker is
    its own (not vLLM's) and that returns one of vLLM's backends attends in its own model runner (vllm-metal
    returns CPU_ATTN and runs its own paged kernels; vllm-spyre attends inside its runner), which the
    AttentionBackend contract never sees. A plugin on vLLM's worker (a CpuPlatform subclass) runs the backend."""
    from conformance.vllm import worker_setup
    from conformance.vllm.discover import vllm_distribution

    plugin = dict(resolved.distribution).get("distribution")
    if vllm_backend.__module__.split(".")[0] != "vllm" or plugin == vllm_distribution()["distribution"]:
        return None
    worker = str(getattr(worker_setup.vllm_config().parallel_config, "worker_cls", "") or "")
    if not worker or worker == "auto" or worker.split(".")[0] == "vllm":
        return None
    return (f"{resolved.qualname} (from {plugin}) selects vLLM's own {vllm_backend.get_name()} "
            f"({vllm_backend.__module__}.{vllm_backend.__qualname__}) but runs its own worker ({worker}): its model "
            "runner attends by its own means, which the attention backend contract does not reach")


def select(vllm_platform, selected_backend, selector_config, num_heads=None) -> type:
    """The vLLM backend class `vllm_platform.get_attn_backend_cls` returns for our selector config."""
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    chosen = None if selected_backend is None else AttentionBackendEnum[selected_backend.name]
    qualname = vllm_platform.get_attn_backend_cls(chosen, vllm_selector_config(selector_config), num_heads)
    if not isinstance(qualname, str):
        raise TypeError(f"{type(vllm_platform).__qualname__}.get_attn_backend_cls returned "
                        f"{type(qualname).__name__}, not a class path string")
    return resolve_obj_by_qualname(qualname)
