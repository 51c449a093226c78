"""The small decoder: semantics against an independent float64 Llama, residual form, compile, loading,
generation, and the harness's model family (fixed model invariants, cpu passes, a wrong rms_norm fails).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conformance.checks import model as model_check
from conformance.checks.common import native_only
from harness_runner import run_harness
from reference_impl import ir
from reference_impl.compilation import compile_module
from reference_impl.config import CompilationConfig, CompilationMode, RuntimeConfig
from reference_impl.ir.tolerances import MODEL_TOLERANCES
from reference_impl.attention.reference import ReferenceAttentionBackend, ReferenceAttentionMetadataBuilder
from reference_impl.models import DecoderConfig, LlamaForCausalLM, build_model, greedy_generate, random_checkpoint
from reference_impl.platforms import activate_platform

CONFIG = DecoderConfig()   # the tiny default: hidden 64, 2 layers, vocab 300
AOT_EAGER = RuntimeConfig(CompilationConfig(mode=CompilationMode.REFERENCE_COMPILE, backend="aot_eager"))


def _llama_float64(ckpt: dict[str, torch.Tensor], cfg: DecoderConfig, ids: torch.Tensor) -> torch.Tensor:
    """Llama written out with plain torch ops (no project code): the logits of every position."""
    w = {k: v.double() for k, v in ckpt.items()}
    n, d, eps = ids.numel(), cfg.head_dim, cfg.rms_norm_eps

    def rms(x, weight):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq[None]
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]

    def rope(x):   # neox style: rotate the two halves of every head
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    causal = torch.ones(n, n, dtype=torch.bool).tril()
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        h = rms(x, w[f"{p}.input_layernorm.weight"])
        q = rope((h @ w[f"{p}.self_attn.q_proj.weight"].T).view(n, cfg.num_heads, d))
        k = rope((h @ w[f"{p}.self_attn.k_proj.weight"].T).view(n, cfg.num_kv_heads, d))
        v = (h @ w[f"{p}.self_attn.v_proj.weight"].T).view(n, cfg.num_kv_heads, d)
        group = cfg.num_heads // cfg.num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / d ** 0.5
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        attn = torch.einsum("hqk,khd->qhd", probs, v).reshape(n, -1)
        x = x + attn @ w[f"{p}.self_attn.o_proj.weight"].T
        h = rms(x, w[f"{p}.post_attention_layernorm.weight"])
        gate, up = h @ w[f"{p}.mlp.gate_proj.weight"].T, h @ w[f"{p}.mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[f"{p}.mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def _prompt(n=7, seed=0):
    return torch.randint(0, CONFIG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def test_logits_match_an_independent_float64_llama():
    ckpt = random_checkpoint(CONFIG, seed=5, dtype=torch.float64)
    model = build_model(CONFIG, torch.float64, checkpoint=ckpt)
    ids = _prompt()
    logits = model(ids, torch.arange(ids.numel()))
    assert logits.shape == (ids.numel(), CONFIG.vocab_size) and logits.dtype == torch.float64
    # 1e-5: IR rms_norm computes its statistics in float32 even for float64 inputs (as vLLM's native does)
    torch.testing.assert_close(logits, _llama_float64(ckpt, CONFIG, ids), atol=1e-5, rtol=1e-5)
    assert 1.5 < float(logits.std()) < 6   # the checkpoint spreads logits over a few units


def test_softcap_scale_and_tied_embeddings():
    cfg = DecoderConfig(tie_word_embeddings=True, final_logit_softcap=5.0, logit_scale=0.5)
    ckpt = random_checkpoint(cfg, seed=6, dtype=torch.float64)
    assert "lm_head.weight" not in ckpt
    model = build_model(cfg, torch.float64, checkpoint=ckpt)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = _prompt()
    raw = _llama_float64({**ckpt, "lm_head.weight": ckpt["model.embed_tokens.weight"]}, cfg, ids)
    torch.testing.assert_close(model(ids, torch.arange(ids.numel())), torch.tanh(raw / 5.0) * 5.0 * 0.5,
                               atol=1e-5, rtol=1e-5)


class _IrCalls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "reference_ir":
            self.calls.append(f"{func._overloadpacket.__name__}.{func._overloadname}")
        return func(*args, **(kwargs or {}))


def test_residual_stream_uses_the_fused_in_place_norm():
    model = build_model(CONFIG, torch.float32, seed=1)
    ids = _prompt()
    with _IrCalls() as probe, torch.no_grad():
        model(ids, torch.arange(ids.numel()))
    calls = probe.calls
    # layer 0's input norm has no residual yet; every other norm (2 per layer - 1, plus the final) is fused
    assert calls.count("rms_norm.default") == 1
    assert calls.count("fused_add_rms_norm.maybe_inplace") == 2 * CONFIG.num_layers
    assert "fused_add_rms_norm.default" not in calls
    assert calls.count("silu_and_mul.default") == CONFIG.num_layers
    assert calls.count("rotary_embedding.default") == CONFIG.num_layers


def test_compiled_matches_eager_without_recompiling_as_the_sequence_grows():
    model = build_model(CONFIG, torch.float32, seed=2)
    prompt = _prompt(5, seed=3)
    eager = greedy_generate(model, prompt, 4)
    torch._dynamo.reset()
    compiled = compile_module(model, AOT_EAGER)
    got = greedy_generate(compiled, prompt, 4)
    assert got.tokens == eager.tokens
    torch.testing.assert_close(got.step_logits, eager.step_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.prompt_logits, eager.prompt_logits, atol=1e-5, rtol=1e-5)
    assert compiled.backend.num_compilations == 1   # lengths 5..8 share one graph (dynamic length)
    lowered = str(list(compiled.backend.graph_snapshots.values())[-1])
    assert "reference_ir" not in lowered   # every IR op lowered to the selected provider


def test_greedy_generation_appends_the_argmax():
    model = build_model(CONFIG, torch.float64, seed=4)
    prompt = _prompt(4, seed=4)
    gen = greedy_generate(model, prompt, 3)
    ids = torch.cat([prompt, torch.tensor(gen.tokens[:-1])])
    logits = model(ids, torch.arange(ids.numel()))
    assert gen.tokens == [int(logits[3 + i].argmax()) for i in range(3)]
    torch.testing.assert_close(gen.step_logits, logits[3:], atol=1e-12, rtol=1e-12)
    assert gen.prompt_logits.shape == (4, CONFIG.vocab_size)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        greedy_generate(model, prompt[None], 1)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        greedy_generate(model, prompt, 0)


def test_load_weights_names_unknown_missing_and_misshapen_tensors():
    ckpt = random_checkpoint(CONFIG, seed=0)
    model = LlamaForCausalLM(CONFIG)
    with pytest.raises(KeyError, match="model.layers.0.self_attn.extra.weight"):
        model.load_weights({**ckpt, "model.layers.0.self_attn.extra.weight": torch.zeros(1)})
    partial = dict(ckpt)
    del partial["model.norm.weight"], partial["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match=r"did not provide: \['model.norm.weight'\]"):
        model.load_weights(partial)   # up_proj only fills half of gate_up_proj: not detectable per tensor
    with pytest.raises(ValueError, match=r"model.norm.weight has shape \(3,\)"):
        model.load_weights({**ckpt, "model.norm.weight": torch.zeros(3)})
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        DecoderConfig(num_kv_heads=3)


# ----- the harness's model family -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", list(MODEL_TOLERANCES), ids=lambda d: str(d).removeprefix("torch."))
def test_fixed_model_greedy_margins_exceed_twice_the_tolerance(dtype):
    """No platform within tolerance of native can flip a token of the model family's decoder, in any sequence."""
    from reference_impl.models import generate

    cfg = model_check.model_config()
    ckpt = random_checkpoint(cfg, model_check.MODEL_SEED, dtype)
    ref = model_check.build_reference(cfg, dtype, ckpt)
    batch = model_check.prompts(cfg)
    assert [len(p) for p in batch] == list(model_check.PROMPT_LENS)
    with native_only():
        gen = generate(ref, batch, model_check.NEW_TOKENS, cache=ref.allocate_kv_cache(len(batch), 16))
    atol, rtol = MODEL_TOLERANCES[dtype]
    for s, tokens in enumerate(gen.tokens):
        assert len(set(tokens)) >= 3, tokens   # a real continuation, not one repeated token
        top = gen.step_logits[:, s].double().topk(2, dim=-1).values
        # a flip needs both logits to move toward each other by their allowed error
        flip_needs = 2 * atol + rtol * top.abs().sum(-1)
        assert bool(((top[:, 0] - top[:, 1]) > 2 * flip_needs).all()), (s, top, flip_needs)


def _run(dtype: str, case: str, platform=None):
    """The model family's unit on the built-in cpu platform (or `platform`), activated whatever this machine's
    default is."""
    from conformance.checks import CheckContext, run_unit
    from conformance.collect.units import Unit
    from reference_impl.platforms import CpuPlatform, activate_platform

    with activate_platform(platform or CpuPlatform()) as platform:
        ctx = CheckContext("cpu", platform)
        verdict, _ = run_unit(ctx, Unit("model", "decoder", model_check.MODEL_NAME, None, dtype, case))
    return verdict


class _DeviceAudit(TorchDispatchMode):
    """Records every op that sees a tensor (argument or result) off `device_type`."""

    def __init__(self, device_type: str):
        super().__init__()
        self.device_type = device_type
        self.stray: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor) and t.device.type != self.device_type:
                self.stray.append(f"{func}: {t.device.type}")
        return out


@pytest.fixture
def default_device_meta():
    """Tensors created without an explicit device land on `meta`: mixing them with the platform's fails loudly."""
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


@pytest.mark.parametrize("case", ["eager", "compiled"])
def test_model_family_builds_every_tensor_on_the_platform_device(default_device_meta, case):
    """The platform's device (cpu) differs from where tensors land by default (meta), as on a GPU run."""
    assert torch.empty(1).device.type == "meta"
    audit = _DeviceAudit("cpu")
    with audit if case == "eager" else contextlib.nullcontext():
        verdict = _run("float32", case)
    assert verdict.outcome.value == "PASS", verdict.message
    assert audit.stray == []


def test_model_family_units_per_level():
    from conformance.checks import units
    from conformance.collect.inventory import Inventory
    from reference_impl.platforms import CpuPlatform

    inv = Inventory("cpu", CpuPlatform(), {}, {}, {})
    quick = {(u.dtype, u.case) for u in units(inv, "model", "decoder", "quick")}
    assert quick == {("float32", "eager"), ("float16", "eager"), ("bfloat16", "eager"), ("float32", "compiled")}
    standard = units(inv, "model", "decoder", "standard")
    assert {(u.dtype, u.case) for u in standard} == {(d, c) for d in ("float32", "float16", "bfloat16")
                                                      for c in ("eager", "compiled")}
    assert {(u.op, u.provider) for u in standard} == {("decoder", None)}


@pytest.mark.parametrize("dtype,case", [("float32", "compiled"), ("bfloat16", "eager")])
def test_model_family_passes_on_the_cpu_platform(dtype, case):
    verdict = _run(dtype, case)
    assert verdict.outcome.value == "PASS", verdict.message
    assert "rms_norm: cpp" in verdict.message and "fused_add_rms_norm: cpp" in verdict.message
    assert "attention backend: CPP" in verdict.message
    assert verdict.max_abs_err is not None and verdict.max_abs_err < MODEL_TOLERANCES[
        getattr(torch, dtype)][0]


# ----- the decoder's attention through the platform's backend -----------------------------------------
class NoDecodeContextBuilder(ReferenceAttentionMetadataBuilder):
    """The planted bug: in a decode batch every request attends as if it had no context (seq_len = 1)."""

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        md = super().build(common_prefix_len, common_attn_metadata, fast_build)
        if md.max_query_len == 1:
            md.seq_lens = [1] * len(md.seq_lens)
        return md


class NoDecodeContextBackend(ReferenceAttentionBackend):
    @staticmethod
    def get_name():
        return "NO_DECODE_CONTEXT"

    @staticmethod
    def get_builder_cls():
        return NoDecodeContextBuilder


def _platform_with_attention(backend: str):
    from reference_impl.platforms import CpuPlatform

    class WithBackend(CpuPlatform):
        def get_attn_backend_cls(self, selected_backend, selector_config, num_heads=None):
            return backend

    return WithBackend()


def test_model_family_is_not_implemented_when_everything_runs_native():
    with native_only():
        verdict = _run("float32", "eager", _platform_with_attention("REFERENCE"))
    assert verdict.outcome.value == "NOT_IMPLEMENTED", verdict.message
    assert "ran entirely on native" in verdict.message and "attention backend: REFERENCE" in verdict.message


@pytest.mark.parametrize("case", ["eager", "compiled"])
def test_model_family_fails_a_backend_that_ignores_the_context_in_decode(case):
    """Every IR op native, so the planted backend is all the platform brings: the decoder check runs it end to end
    over the paged cache (prefill right, decode wrong) and fails on the logits; the reference run stays on
    REFERENCE under the same platform."""
    platform = _platform_with_attention(f"{__name__}.NoDecodeContextBackend")
    with native_only():
        verdict = _run("float32", case, platform)
    assert verdict.outcome.value == "FAIL", verdict.message
    assert verdict.message.startswith("logits of sequence") and "attention backend: NO_DECODE_CONTEXT" in verdict.message
    assert "over the paged KV cache" in verdict.message
    with activate_platform(platform):
        cfg = model_check.model_config()
        native = model_check.build_reference(cfg, torch.float32, random_checkpoint(cfg, model_check.MODEL_SEED))
        assert native.attention_backends == ["REFERENCE"]
        assert build_model(cfg, torch.float32).attention_backends == ["NO_DECODE_CONTEXT"]


class Head64OnlyBackend(ReferenceAttentionBackend):
    @staticmethod
    def get_name():
        return "HEAD64_ONLY"

    @classmethod
    def get_supported_head_sizes(cls):
        return [64]


def test_model_family_leaves_a_backend_refusing_the_decoder_to_the_attention_family():
    """As vLLM's CPU_ATTN declares head size 16 unsupported: the rest of the platform is still graded, the
    message says why its backend did not run; with nothing else brought, the unit is NOT_IMPLEMENTED."""
    platform = _platform_with_attention(f"{__name__}.Head64OnlyBackend")
    verdict = _run("float32", "eager", platform)
    assert verdict.outcome.value == "PASS", verdict.message
    assert ("attention backend: REFERENCE (the platform's HEAD64_ONLY declares this decoder's attention (head size "
            "16, block 16, float32) unsupported: head_size not supported, so the decoder attended on REFERENCE)"
            in verdict.message) and "rms_norm: cpp" in verdict.message
    with native_only():
        verdict = _run("float32", "eager", platform)
    assert verdict.outcome.value == "NOT_IMPLEMENTED", verdict.message


def test_model_family_passes_the_cpu_platforms_attention_backend_alone():
    with native_only():
        verdict = _run("float32", "eager")
    assert verdict.outcome.value == "PASS", verdict.message
    assert "attention backend: CPP" in verdict.message and "rms_norm: native" in verdict.message


@pytest.fixture
def negated_rms_norm():
    """A provider preferred for IR rms_norm that returns minus native: big logit changes, no error."""
    from reference_impl import ir

    op = ir.ops.rms_norm

    def negated(x, weight, epsilon, variance_size=None):
        return -op.native_fn(x, weight, epsilon, variance_size)

    op.register_impl("model_test_negated")(negated)
    try:
        with op.set_priority(["model_test_negated"]):
            yield
    finally:
        op.remove_impl("model_test_negated")


def test_model_family_fails_on_wrong_logits_and_on_other_tokens(negated_rms_norm, monkeypatch):
    verdict = _run("float32", "eager")
    assert verdict.outcome.value == "FAIL" and verdict.message.startswith("logits"), verdict.message
    assert "rms_norm: model_test_negated" in verdict.message and "model seed" in verdict.message
    # with a tolerance that accepts any logits, the greedy tokens still have to agree
    monkeypatch.setitem(MODEL_TOLERANCES, torch.float32, (1e6, 1.0))
    verdict = _run("float32", "eager")
    assert verdict.outcome.value == "FAIL" and "greedy tokens differ at step" in verdict.message, verdict.message


def test_scorecard_shows_the_model_column():
    from conformance.report.scorecard import render_scorecard
    from conformance.results.result import CheckResult

    results = [CheckResult("suites/test_model.py::test_decoder[decoder-float32-eager]", "model", "decoder", None,
                           "float32", "eager", "PASS"),
               CheckResult("x::test_ir_case[rms_norm]", "numerics", "rms_norm", "cpp", "float32", "c", "PASS")]
    card = render_scorecard(results, platform="cpu", ir_ops=["rms_norm"])
    header = card.splitlines()[1].split()
    assert header[-1] == "model" and "decoder (model)" in card
    assert "coverage: 1 / 1 IR ops implemented (rms_norm)" in card   # the model row is not an IR op


def test_model_family_catches_a_subtly_wrong_rms_norm(tmp_path):
    """broken_odd_numerics drops the last element of odd-sized means: the decoder's odd hidden size shows it."""
    run = run_harness(tmp_path, "broken_odd_numerics", "-k", "model and float32 and eager", dist="broken")
    assert run.returncode != 0 and run.doc["verdict"] == "NOT_CONFORMANT", run.output[-3000:]
    assert run.outcomes(check="model") == {"FAIL"}
    for r in run.where(check="model"):
        assert "logits" in r["message"] and "rms_norm: broken" in r["message"], r["message"]
        assert r["repro"].startswith("python -m conformance repro --platform broken_odd_numerics --check model.decoder")
    assert "decoder (model)" in run.output


def test_model_family_fails_when_the_compiled_decoder_recompiles_per_batch(monkeypatch):
    """A compiled decoder whose graph is specialized on the batch size compiles again for the second batch."""
    import functools

    import reference_impl.compilation as compilation

    monkeypatch.setattr(compilation, "compile_module",
                        functools.partial(compilation.compile_module, dynamic_batch=False))
    verdict = _run("float32", "compiled")
    assert verdict.outcome.value == "FAIL", verdict.message
    assert "more graph(s) when the batch went from 3 sequences of lengths [6, 2, 5] to 2" in verdict.message


def test_model_family_passes_at_decode_shapes_on_the_demo_plugin(tmp_path):
    run = run_harness(tmp_path, "demo", "-k", "model", dist="demo")
    assert run.returncode == 0 and run.doc["verdict"] == "CONFORMANT", run.output[-3000:]
    assert run.outcomes(check="model") == {"PASS"}
    units = {(r["dtype"], r["case"]) for r in run.where(check="model")}
    assert units >= {("float32", "eager"), ("float32", "compiled")}
    for r in run.where(check="model"):
        assert "CustomOp replacements: DemoRMSNorm" in r["message"] and "as native" in r["message"], r["message"]


@pytest.fixture
def counting_norm_predicates():
    """A provider 'probe' first on rms_norm and fused_add_rms_norm whose predicate counts its calls
    and declines (native runs): the decoder's weights reach it as nn.Parameter."""
    calls = {"n": 0}

    def declines(*args):
        calls["n"] += 1
        return False

    ops = [ir.ops.rms_norm, ir.ops.fused_add_rms_norm]
    with contextlib.ExitStack() as stack:
        for op in ops:
            op.register_impl("probe", supports_args=declines)(op.native_fn)
            stack.callback(op.remove_impl, "probe")
            stack.enter_context(op.set_priority(["probe", *op.get_priority()]))
        yield calls


def test_decoder_steps_run_no_predicate_once_their_signatures_are_cached(counting_norm_predicates):
    """Predicates answer once per static signature, also for parameter weights (every layer's): a
    repeated forward, and one at another sequence length, ask no predicate again."""
    calls = counting_norm_predicates
    with activate_platform("cpu"), torch.no_grad():
        model = build_model(CONFIG, torch.float32, seed=7)
        assert isinstance(model.model.norm.weight, torch.nn.Parameter)
        ids = _prompt(6, seed=1)
        model(ids, torch.arange(6))
        first = calls["n"]
        assert first > 0                                  # the probe is really consulted
        model(ids, torch.arange(6))
        longer = _prompt(9, seed=2)
        model(longer, torch.arange(9))                    # another batch size: the static signature
        assert calls["n"] == first
