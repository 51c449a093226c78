"""The reference as a runtime: KV-cache generation against full recompute, sampling, checkpoint directories
(round trip, errors), tensor parallelism on gloo, the compiled decode step's graphs, and the command."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import queue as queue_mod
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import _runtime_tp
from _rank_world import rank_context, rank_process
from reference_impl.models import (
    DecoderConfig,
    Sampler,
    SamplingParams,
    build_model,
    generate,
    greedy_generate,
    random_checkpoint,
)
from reference_impl.models.checkpoint import (
    CheckpointError,
    load_checkpoint,
    read_config,
    save_checkpoint,
    write_random_checkpoint,
)
from reference_impl.models.kv_cache import KVCache, using_kv_cache
from reference_impl.models.rope import RopeScaling

DENSE = DecoderConfig()
MOE = DecoderConfig(num_experts=4, num_experts_per_tok=2)
# Gemma-2 and gpt-oss shapes, windowed on layer 0 (shorter than the TP test's prompts)
GEMMA2 = DecoderConfig(head_dim=32, norm_style="gemma2", embedding_scale=64 ** 0.5, query_pre_attn_scalar=24,
                       attn_logit_softcap=3.0, final_logit_softcap=4.0, hidden_act="gelu_pytorch_tanh",
                       sliding_window=3, sliding_window_layers=(0,), tie_word_embeddings=True)
GPT_OSS = DecoderConfig(head_dim=32, num_experts=4, moe_style="gpt_oss", attention_sinks=True, qkv_bias=True,
                        o_proj_bias=True, sliding_window=3, sliding_window_layers=(0,),
                        rope_scaling=RopeScaling("yarn", 4.0, 32, truncate=False))
PROMPTS = _runtime_tp.PROMPTS


def _recompute(model, prompt, new_tokens):
    """Full recompute of one sequence (no cache): its positions' logits, as BatchGeneration.sequence_logits."""
    ref = greedy_generate(model, torch.tensor(prompt), new_tokens)
    return ref.tokens, torch.cat([ref.prompt_logits, ref.step_logits[1:]])


# ----- KV cache -----------------------------------------------------------------------------------
@pytest.mark.parametrize("config", [DENSE, MOE], ids=["dense", "moe"])
def test_kv_cache_decode_equals_full_recompute(config):
    model = build_model(config, torch.float32, seed=11)
    new = 3 if config.num_experts else 5   # the reference MoE experts loop in Python: slow to recompute
    out = generate(model, PROMPTS, new, cache=model.allocate_kv_cache(4, 16), prompt_logits=True)
    assert [len(t) for t in out.tokens] == [new] * 3 and out.step_logits.shape == (new, 3, config.vocab_size)
    assert [p.shape[0] for p in out.prompt_logits] == [len(p) for p in PROMPTS] and out.prompt_tokens == 14
    for s, prompt in enumerate(PROMPTS):
        tokens, logits = _recompute(model, prompt, new)
        assert out.tokens[s] == tokens, s
        torch.testing.assert_close(out.sequence_logits(s), logits, atol=2e-5, rtol=2e-5)


def test_cached_attention_errors_are_named():
    model = build_model(DENSE, torch.float32, seed=1)
    with pytest.raises(ValueError, match=r"4 sequences of up to 7 tokens do not fit the KV cache \(2 sequences"):
        generate(model, [[1, 2, 3]] * 4, 5, cache=model.allocate_kv_cache(2, 16))
    ids, pos = torch.tensor([1, 2]), torch.arange(2)
    with pytest.raises(RuntimeError, match="outside `using_kv_cache"):
        model(ids, pos, torch.tensor([0, 2]), torch.tensor([2]))
    with pytest.raises(ValueError, match="cu_seqlens and seq_lens go together"):
        model(ids, pos, torch.tensor([0, 2]))
    with using_kv_cache(model.allocate_kv_cache(1, 4)), pytest.raises(ValueError, match="position 5 does not fit"):
        model(ids, torch.tensor([4, 5]), torch.tensor([0, 2]), torch.tensor([6]))
    with pytest.raises(ValueError, match="exceeds max_position_embeddings=256"):
        model.allocate_kv_cache(1, 300)
    cache = KVCache.allocate(2, 3, 8, 2, 16, torch.float16, "cpu", block_size=4)
    # 2 layers x (the null block + 3 sequences x 2 blocks) x 2 kv heads x 4 tokens x (key + value) x 16 x 2 bytes
    assert (cache.max_seqs, cache.max_len, cache.num_blocks, cache.nbytes()) == (3, 8, 7, 2 * 7 * 2 * 4 * 2 * 16 * 2)
    assert cache.layers[0].shape == (7, 2, 4, 32) and cache.layers[0].dtype == torch.float16


# ----- sampling -----------------------------------------------------------------------------------
def test_sampling_greedy_seeded_and_top_k():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(Sampler()(logits), logits.argmax(-1))
    assert torch.equal(Sampler(SamplingParams(temperature=1.0, top_k=1, seed=3))(logits), logits.argmax(-1))
    draw = Sampler(SamplingParams(temperature=1.0, top_k=5, seed=7))(logits)
    top5 = logits.topk(5, dim=-1).indices
    assert bool((top5 == draw[:, None]).any(-1).all())                  # always among the 5 largest
    assert not torch.equal(draw, logits.argmax(-1))                    # and not always the largest
    assert torch.equal(draw, Sampler(SamplingParams(temperature=1.0, top_k=5, seed=7))(logits))   # seeded
    assert not torch.equal(draw, Sampler(SamplingParams(temperature=1.0, top_k=5, seed=8))(logits))
    with pytest.raises(ValueError, match="temperature=-1"):
        SamplingParams(temperature=-1)


def test_seeded_sampling_generation_is_reproducible():
    model = build_model(DENSE, torch.float32, seed=2)
    params = SamplingParams(temperature=0.8, top_k=20, seed=5)
    runs = [generate(model, PROMPTS, 6, cache=model.allocate_kv_cache(3, 16), sampler=Sampler(params)).tokens
            for _ in range(2)]
    assert runs[0] == runs[1]
    greedy = generate(model, PROMPTS, 6, cache=model.allocate_kv_cache(3, 16)).tokens
    assert runs[0] != greedy


# ----- checkpoints --------------------------------------------------------------------------------
@pytest.mark.parametrize("config", [DENSE, MOE], ids=["dense", "moe"])
def test_checkpoint_round_trip(tmp_path, config):
    write_random_checkpoint(tmp_path, config, seed=4)
    doc = json.loads((tmp_path / "config.json").read_text())
    assert doc["model_type"] == ("mixtral" if config.num_experts else "llama")
    assert read_config(tmp_path) == config
    loaded, fresh = load_checkpoint(tmp_path, cpu_gemm=False), build_model(config, torch.float32, seed=4)
    ids = torch.tensor(PROMPTS[0])
    assert torch.equal(loaded(ids, torch.arange(ids.numel())), fresh(ids, torch.arange(ids.numel())))
    # stored in bfloat16 and asked for in float32: loads as the weights rounded once
    save_checkpoint(tmp_path / "bf16", config, random_checkpoint(config, 4), torch.bfloat16)
    rounded = {k: v.to(torch.bfloat16).float() for k, v in random_checkpoint(config, 4).items()}
    torch.testing.assert_close(load_checkpoint(tmp_path / "bf16", torch.float32, cpu_gemm=False)(
                                   ids, torch.arange(ids.numel())),
                               build_model(config, checkpoint=rounded)(ids, torch.arange(ids.numel())),
                               atol=0, rtol=0)
    # by default in the dtype its config names
    assert load_checkpoint(tmp_path / "bf16").dtype == torch.bfloat16


VARIANTS = {
    "llama3 rope, gelu, biases": DecoderConfig(rope_theta=5e5, hidden_act="gelu", qkv_bias=True, o_proj_bias=True,
                                               mlp_bias=True, rope_scaling=RopeScaling("llama3", 8.0, 64, 1.0, 4.0)),
    "qwen2 window on layer 1, yarn": DecoderConfig(qkv_bias=True, sliding_window=4, sliding_window_layers=(1,),
                                                   rope_scaling=RopeScaling("yarn", 4.0, 64, attention_factor=1.2)),
    "mistral window": DecoderConfig(sliding_window=4, head_dim=24, tie_word_embeddings=True),
    "mixtral window": DecoderConfig(num_experts=4, sliding_window=3, hidden_act="gelu_pytorch_tanh"),
    "gemma2": GEMMA2,
    "gemma2 untied, biases, no soft caps, no window": dataclasses.replace(
        GEMMA2, tie_word_embeddings=False, qkv_bias=True, o_proj_bias=True, attn_logit_softcap=None,
        final_logit_softcap=None, sliding_window=None, sliding_window_layers=None),
    "gpt_oss": GPT_OSS,
    "gpt_oss no biases, plain rope, every layer windowed": dataclasses.replace(
        GPT_OSS, qkv_bias=False, o_proj_bias=False, rope_scaling=None, sliding_window_layers=None),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_config_variants_round_trip_through_config_json(tmp_path, name):
    config = VARIANTS[name]
    write_random_checkpoint(tmp_path, config, seed=2)
    assert read_config(tmp_path) == config
    ids = torch.tensor(PROMPTS[0])
    torch.testing.assert_close(load_checkpoint(tmp_path, cpu_gemm=False)(ids, torch.arange(ids.numel())),
                               build_model(config, seed=2)(ids, torch.arange(ids.numel())), atol=0, rtol=0)


def test_config_with_no_transformers_model_type_is_not_written(tmp_path):
    with pytest.raises(ValueError, match="no transformers model type holds this config"):
        write_random_checkpoint(tmp_path, DecoderConfig(sliding_window=4, mlp_bias=True))
    for config, message in [
            (DecoderConfig(final_logit_softcap=30.0), "final_logit_softcap is Gemma-2's"),
            (DecoderConfig(logit_scale=0.5), "no transformers model type holds logit_scale=0.5"),
            (dataclasses.replace(GEMMA2, embedding_scale=1.0), "a gemma2 config.json cannot hold this config's "
                                                               "embedding_scale"),
            (dataclasses.replace(GPT_OSS, attention_sinks=False), "a gpt_oss config.json cannot hold this config's "
                                                                  "attention_sinks"),
            (DecoderConfig(attention_sinks=True), "a gpt_oss config.json cannot hold this config's num_experts")]:
        with pytest.raises(ValueError, match=message):
            write_random_checkpoint(tmp_path, config)
    with pytest.raises(ValueError, match="hidden_act='relu' is not supported"):
        DecoderConfig(hidden_act="relu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_prepacked_cpu_gemms_compute_the_same_logits(tmp_path, dtype):
    from reference_impl.layers import cpu_gemm

    if not cpu_gemm.available():
        pytest.skip("this torch build has no oneDNN linear ops")
    config = dataclasses.replace(VARIANTS["llama3 rope, gelu, biases"], vocab_size=4096)
    write_random_checkpoint(tmp_path, config, seed=3)
    by_default = load_checkpoint(tmp_path, dtype)    # packs the weights of 2^18 elements or more: the LM head
    assert [n for n, m in by_default.named_modules() if "cpu_gemm" in m.__dict__] == ["lm_head"]
    packed, plain = load_checkpoint(tmp_path, dtype, cpu_gemm=False), load_checkpoint(tmp_path, dtype, cpu_gemm=False)
    assert cpu_gemm.pack_cpu_gemms(packed, min_elements=0) == 4 * config.num_layers + 1   # qkv, o, gate_up, down
    assert not any("cpu_gemm" in m.__dict__ for m in plain.modules())
    calls = []
    pack = packed.lm_head.cpu_gemm

    class Spy:
        is_current = pack.is_current

        def __call__(self, x, bias):
            calls.append(tuple(x.shape))
            return pack(x, bias)
    packed.lm_head.cpu_gemm = Spy()
    ids = torch.tensor(PROMPTS[0])
    got, want = packed(ids, torch.arange(ids.numel())), plain(ids, torch.arange(ids.numel()))
    assert calls == [(len(PROMPTS[0]), config.hidden_size)]        # the LM head ran through its pack
    tol = 2e-5 if dtype == torch.float32 else 0.1                     # summation order only
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    # a weight written after packing is used as written: the stale pack is bypassed
    packed.lm_head.cpu_gemm = pack
    with torch.no_grad():
        packed.lm_head.weight.mul_(2)
        plain.lm_head.weight.mul_(2)
    torch.testing.assert_close(packed(ids, torch.arange(ids.numel())).float(),
                               plain(ids, torch.arange(ids.numel())).float(), atol=2 * tol, rtol=tol)
    assert not pack.is_current(packed.lm_head.weight)
    cpu_gemm.unpack_cpu_gemms(packed)
    assert not any("cpu_gemm" in m.__dict__ for m in packed.modules())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_16bit_packs_follow_the_cpus_arithmetic(dtype):
    """Without the panel GEMM: a CPU with 16-bit arithmetic gets a 16-bit oneDNN pack; another gets a float32
    pack for every call of two rows or more (oneDNN's emulated 16-bit kernel is ~4x slower there) and, for
    one-row calls, keeps an emulated pack where oneDNN has one, else reads the 16-bit weight itself through
    F.linear (half the bytes of float32)."""
    from reference_impl.layers import cpu_gemm

    if not cpu_gemm.available():
        pytest.skip("this torch build has no oneDNN linear ops")
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 256, generator=gen).to(dtype), torch.randn(96, generator=gen).to(dtype)
    pack = cpu_gemm.PackedCpuGemm(weight, panels=False)
    assert pack.panels is None
    if cpu_gemm.computes_natively(dtype) and pack.compute_dtype == dtype:
        assert pack.one_row is None
    else:
        assert pack.compute_dtype == torch.float32 and pack.packed.dtype == torch.float32
        if cpu_gemm.computes_natively(dtype):
            assert pack.one_row is None and pack.one_row_weight is None  # oneDNN refused the native pack
        else:   # one of the two one-row paths, by whether oneDNN takes a 16-bit weight on this CPU
            assert (pack.one_row is None) != (pack.one_row_weight is None)
            if pack.one_row_weight is not None:
                assert pack.one_row_weight.data_ptr() == weight.data_ptr()   # the layer's weight, not a copy
    for rows in (1, 5):
        x = torch.randn(rows, 256, generator=gen).to(dtype)
        got = pack(x, bias)
        assert got.dtype == dtype and got.shape == (rows, 96)
        if pack.one_row is not None and rows == 1:
            want = torch.ops.mkldnn._linear_pointwise(x, pack.one_row, bias, "none", [], "")
        elif pack.one_row_weight is not None and rows == 1:
            want = F.linear(x, weight, bias)
        else:
            want = torch.ops.mkldnn._linear_pointwise(x.to(pack.compute_dtype), pack.packed,
                                                      bias.to(pack.compute_dtype), "none", [], "").to(dtype)
        assert torch.equal(got, want)                        # the pack the rule picks, and no other
        exact = F.linear(x.double(), weight.double(), bias.double())
        torch.testing.assert_close(got.double(), exact, atol=0.25, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_few_row_calls_take_the_panel_gemm_and_prefills_take_onednn(dtype):
    """With the C++ kernels, calls of up to PANEL_MAX_ROWS rows run the panel GEMM on the weight's own dtype
    (no emulated or one-row pack is kept then); longer calls run the oneDNN pack."""
    from reference_impl.kernels import cpu as cpu_kernels
    from reference_impl.layers import cpu_gemm

    if not cpu_gemm.available() or not cpu_kernels.SUPPORTED:
        pytest.skip("needs oneDNN's linear ops and the C++ CPU kernels")
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 256, generator=gen).to(dtype), torch.randn(96, generator=gen).to(dtype)
    pack = cpu_gemm.PackedCpuGemm(weight)
    ops = cpu_gemm.panel_ops()
    assert pack.panels is not None and pack.panels.dtype == dtype
    assert pack.one_row is None and pack.one_row_weight is None
    for rows in (1, 8, cpu_gemm.PANEL_MAX_ROWS):
        x = torch.randn(rows, 256, generator=gen).to(dtype)
        assert torch.equal(pack(x, bias), ops.panel_gemm(x, pack.panels, 96, bias))
        assert torch.equal(pack(x, None), ops.panel_gemm(x, pack.panels, 96, None))
    x = torch.randn(cpu_gemm.PANEL_MAX_ROWS + 1, 256, generator=gen).to(dtype)
    want = torch.ops.mkldnn._linear_pointwise(x.to(pack.compute_dtype), pack.packed, bias.to(pack.compute_dtype),
                                              "none", [], "").to(dtype)
    assert torch.equal(pack(x, bias), want)
    for rows in (1, 8, cpu_gemm.PANEL_MAX_ROWS + 1):
        x = torch.randn(rows, 256, generator=gen).to(dtype)
        exact = F.linear(x.double(), weight.double(), bias.double())
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(pack(x, bias).double(), exact, atol=tol * 16, rtol=tol)


def _edit_config(directory, **changes):
    doc = json.loads((directory / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            doc.pop(key)
        else:
            doc[key] = value
    (directory / "config.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("changes,message", [
    ({"num_hidden_layers": None}, "required key 'num_hidden_layers' is missing"),
    ({"hidden_size": "64"}, "key 'hidden_size' must be a positive integer, got '64'"),
    ({"rms_norm_eps": -1}, "key 'rms_norm_eps' must be a positive number"),
    ({"model_type": "gpt2"}, "key 'model_type' is 'gpt2'"),
    ({"num_key_value_heads": 3}, "num_heads=4 is not a multiple of num_kv_heads=3"),
], ids=["missing", "type", "value", "model_type", "heads"])
def test_bad_config_names_the_key(tmp_path, changes, message):
    write_random_checkpoint(tmp_path, DENSE, seed=0)
    _edit_config(tmp_path, **changes)
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_checkpoint(tmp_path)


def test_checkpoint_tensor_errors_name_the_tensor(tmp_path):
    ckpt = random_checkpoint(MOE, 0)
    bad = dict(ckpt, **{"model.layers.1.block_sparse_moe.experts.3.w2.weight": torch.zeros(64, 100)})
    save_checkpoint(tmp_path / "shape", MOE, bad)
    with pytest.raises(CheckpointError, match=r"model.layers.1.block_sparse_moe.experts.3.w2.weight has shape "
                                              r"\(64, 100\), the config expects \(64, 128\)"):
        load_checkpoint(tmp_path / "shape")
    save_checkpoint(tmp_path / "extra", MOE, dict(ckpt, **{"model.layers.0.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=r"with no parameter in LlamaForCausalLM: \['model.layers.0.extra"):
        load_checkpoint(tmp_path / "extra")
    partial = {k: v for k, v in ckpt.items() if k != "model.layers.0.block_sparse_moe.gate.weight"}
    save_checkpoint(tmp_path / "missing", MOE, partial)
    with pytest.raises(CheckpointError, match=r"did not provide: \['model.layers.0.block_sparse_moe.gate.weight'\]"):
        load_checkpoint(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="does not exist .*nothing is downloaded"):
        load_checkpoint(tmp_path / "meta-llama/Llama-3-8B")
    (tmp_path / "nofile").mkdir()
    (tmp_path / "nofile" / "config.json").write_text((tmp_path / "shape" / "config.json").read_text())
    with pytest.raises(CheckpointError, match="has no model.safetensors"):
        load_checkpoint(tmp_path / "nofile")


# ----- tensor parallelism -------------------------------------------------------------------------
def test_tp2_on_gloo_equals_tp1(tmp_path):
    directories = {"dense": str(write_random_checkpoint(tmp_path / "dense", DENSE, seed=21)),
                   "moe": str(write_random_checkpoint(tmp_path / "moe", MOE, seed=22)),
                   "gemma2": str(write_random_checkpoint(tmp_path / "gemma2", GEMMA2, seed=23)),
                   "gpt_oss": str(write_random_checkpoint(tmp_path / "gpt_oss", GPT_OSS, seed=24))}
    ctx = rank_context()
    results = ctx.Queue()
    procs = [rank_process(ctx, _runtime_tp.run_rank, (r, 2, str(tmp_path / "store"), directories, results))
             for r in range(2)]
    for p in procs:
        p.start()
    got: dict[tuple[int, str], tuple] = {}
    try:
        while len(got) < 2 * len(directories):
            rank, name, result, error = results.get(timeout=180)
            assert error is None, f"rank {rank}, {name}:\n{error}"
            got[rank, name] = result
    except queue_mod.Empty:
        pytest.fail(f"no result from some rank: got {sorted(got)}")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    for name, directory in directories.items():
        tokens, prompt_logits, step_logits = _runtime_tp.generate_from(directory)
        tp_tokens, tp_prompt, tp_steps = got[0, name]
        assert tp_tokens == tokens, name
        torch.testing.assert_close(torch.tensor(tp_steps), torch.tensor(step_logits), atol=1e-4, rtol=1e-4)
        for a, b in zip(tp_prompt, prompt_logits):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=1e-4)


# ----- compiled decode ----------------------------------------------------------------------------
def test_compiled_decode_does_not_recompile_as_batch_and_lengths_change():
    from reference_impl.compilation import compile_module
    from reference_impl.config import CompilationConfig, CompilationMode, RuntimeConfig

    model = build_model(DENSE, torch.float32, seed=9)
    eager = generate(model, PROMPTS, 4, cache=model.allocate_kv_cache(4, 24))
    torch._dynamo.reset()
    compiled = compile_module(model, RuntimeConfig(CompilationConfig(mode=CompilationMode.REFERENCE_COMPILE,
                                                                     backend="aot_eager")))
    got = generate(compiled, PROMPTS, 4, cache=model.allocate_kv_cache(4, 24))
    assert got.tokens == eager.tokens
    torch.testing.assert_close(got.step_logits, eager.step_logits, atol=1e-5, rtol=1e-5)
    graphs = compiled.backend.num_compilations
    assert graphs == 1   # prefill and decode share one graph: tokens and sequences are dynamic
    generate(compiled, [[3, 4], [9, 9, 9, 9, 9, 9, 9, 9], [1], [7, 7, 7]], 6, cache=model.allocate_kv_cache(4, 24))
    generate(compiled, [[3, 4, 5], [10, 11]], 3, cache=model.allocate_kv_cache(4, 24))
    assert compiled.backend.num_compilations == graphs
    lowered = str(list(compiled.backend.graph_snapshots.values())[-1])
    assert "reference_ir" not in lowered and "reference_model.paged_attention" in lowered


# ----- the command --------------------------------------------------------------------------------
def _command(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "reference_impl.generate", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_command_end_to_end(tmp_path):
    directory = write_random_checkpoint(tmp_path / "ckpt", DENSE, seed=31)
    batch = tmp_path / "prompts.jsonl"
    batch.write_text(json.dumps(PROMPTS[1]) + "\n" + json.dumps({"prompt_ids": PROMPTS[2]}) + "\n")
    out_json = tmp_path / "out.json"
    run = _command("--checkpoint", str(directory), "--platform", "cpu", "--prompt-ids",
                   ",".join(map(str, PROMPTS[0])), "--batch-file", str(batch), "--max-new-tokens", "4",
                   "--json", str(out_json))
    assert run.returncode == 0, run.stderr
    report = json.loads(out_json.read_text())
    model = load_checkpoint(directory)
    expected = generate(model, PROMPTS, 4, cache=model.allocate_kv_cache(3, 16)).tokens
    assert report["tokens"] == expected
    for s, (prompt, tokens) in enumerate(zip(PROMPTS, expected)):
        assert f"sequence {s}: prompt {prompt} -> {tokens}" in run.stdout
    assert "IR providers selected: fused_add_rms_norm: cpp, rms_norm: cpp" in run.stdout
    assert "RMSNorm: forward_cpu" in run.stdout and report["custom_op_paths"]["RMSNorm"] == ["forward_cpu"]
    assert report["attention_backends"] == ["CPP"] and report["kv_cache_block_size"] == 16
    assert "attention: CPP backend over a paged KV cache (blocks of 16 tokens)" in run.stdout
    assert "prefill: 14 tokens in" in run.stdout and "decode: 9 tokens of 3 sequences (up to 3 steps) in" in run.stdout
    assert report["stop_token_ids"] == [] and "stop tokens" not in run.stdout
    assert report["prefill_tokens"] == 14 and report["decode_tokens"] == 9 and report["decode_seconds"] > 0
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert report["host_memory"] == ("kept for reuse" if glibc else "system")   # models/host_memory.py


def test_command_tp2_gives_the_single_process_tokens(tmp_path):
    from reference_impl.generate import PRESETS

    out = tmp_path / "tp2.json"
    run = _command("--random", "tiny", "--platform", "cpu", "--prompt-ids", "1,2,3,4", "--max-new-tokens", "3",
                   "--tp", "2", "--json", str(out))
    assert run.returncode == 0, run.stderr
    model = build_model(PRESETS["tiny"], torch.float32, seed=0)
    expected = generate(model, [[1, 2, 3, 4]], 3, cache=model.allocate_kv_cache(1, 8)).tokens
    report = json.loads(out.read_text())
    assert report["tp"] == 2 and report["tokens"] == expected
    assert run.stdout.count("sequence 0:") == 1   # rank 0 prints, rank 1 does not
    # each rank its share of the cores (N ranks of every core's threads oversubscribe the machine)
    cores = len(os.sched_getaffinity(0))
    expected_threads = int(os.environ["OMP_NUM_THREADS"]) if os.environ.get("OMP_NUM_THREADS", "").isdigit() \
        else max(1, cores // 2)
    said = f"tp 2 ({expected_threads} thread{'s' if expected_threads != 1 else ''} a rank)"
    assert report["threads"] == expected_threads and said in run.stdout, run.stdout


def test_rank_threads_split_the_cores_unless_omp_num_threads_says(monkeypatch):
    from reference_impl.generate import rank_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert (rank_threads(1), rank_threads(2), rank_threads(3), rank_threads(16)) == (8, 4, 2, 1)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert rank_threads(2) == 3


@pytest.mark.parametrize("args,message", [
    (["--random", "tiny", "--prompt-ids", "1,x", "--max-new-tokens", "2"], "--prompt-ids: '1,x' is not a comma"),
    (["--random", "tiny", "--prompt-ids", "1,300", "--max-new-tokens", "2"], "token ids [300] are outside"),
    (["--random", "tiny", "--prompt-ids", "1", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["--random", "tiny", "--max-new-tokens", "2"], "give --prompt, --prompt-ids or --batch-file"),
    (["--random", "tiny", "--prompt-ids", "1", "--max-new-tokens", "2", "--platform", "nope"],
     "--platform nope: unknown platform 'nope'"),
    (["--random", "tiny", "--prompt-ids", "1", "--max-new-tokens", "2", "--tp", "3"],
     "--tp 3 does not divide the model's num_attention_heads (4)"),
    (["--checkpoint", "/nonexistent/dir", "--prompt-ids", "1", "--max-new-tokens", "2"],
     "does not exist (only local directories are read; nothing is downloaded)"),
    (["--random", "tiny", "--checkpoint", "x", "--prompt-ids", "1", "--max-new-tokens", "2"], "not allowed with"),
    (["--random", "tiny", "--batch-file", "/nonexistent.jsonl", "--max-new-tokens", "2"], "--batch-file"),
    (["--random", "tiny", "--prompt-ids", "1", "--max-new-tokens", "2", "--stop-token-ids", "2,y"],
     "--stop-token-ids: '2,y' is not a comma"),
    (["--random", "tiny", "--prompt-ids", "1", "--max-new-tokens", "2", "--stop-token-ids", "7,999"],
     "stop token ids [999] are outside the vocabulary"),
    (["--random", "tiny", "--prompt-ids", "1", "--max-new-tokens", "2", "--stop-token-ids", "7", "--ignore-eos"],
     "--stop-token-ids and --ignore-eos contradict"),
], ids=["ids", "vocab", "tokens", "prompt", "platform", "tp", "checkpoint", "exclusive", "batch-file", "stop-ids",
        "stop-vocab", "stop-and-ignore"])
def test_command_bad_arguments_give_one_line(capsys, args, message):
    from reference_impl.generate import main

    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m reference_impl.generate: error: "), err
    assert message in err


# ----- end of sequence ----------------------------------------------------------------------------
def test_sequences_end_at_their_first_stop_token_and_the_batch_at_the_last():
    model = build_model(DENSE, torch.float32, seed=11)
    full = generate(model, PROMPTS, 6, cache=model.allocate_kv_cache(4, 16), prompt_logits=True)
    stop = full.tokens[0][2]                       # sequence 0 ends at its third token
    out = generate(model, PROMPTS, 6, cache=model.allocate_kv_cache(4, 16), stop_token_ids={stop},
                   prompt_logits=True)
    for s, tokens in enumerate(full.tokens):
        cut = tokens.index(stop) + 1 if stop in tokens else len(tokens)
        assert out.tokens[s] == tokens[:cut], s
        torch.testing.assert_close(out.sequence_logits(s), full.sequence_logits(s)[:len(PROMPTS[s]) + cut - 1])
    assert out.decode_tokens == sum(len(t) - 1 for t in out.tokens)
    assert out.step_logits.shape[0] == max(len(t) for t in out.tokens)


def test_generation_stops_early_once_every_sequence_has_ended():
    model = build_model(DENSE, torch.float32, seed=11)
    first = [t[0] for t in generate(model, PROMPTS, 1, cache=model.allocate_kv_cache(4, 16)).tokens]
    calls = []

    def counting(*args):
        calls.append(args[0].shape[0])
        return model(*args)

    out = generate(counting, PROMPTS, 8, cache=model.allocate_kv_cache(4, 16), stop_token_ids=set(first))
    assert out.tokens == [[t] for t in first] and len(calls) == 1      # the prefill only
    assert out.step_logits.shape == (1, 3, DENSE.vocab_size) and out.decode_tokens == 0


def test_command_stops_at_the_checkpoints_eos_unless_told_not_to(tmp_path):
    directory = write_random_checkpoint(tmp_path / "ckpt", DENSE, seed=31)
    model = load_checkpoint(directory)
    full = generate(model, PROMPTS[:1], 5, cache=model.allocate_kv_cache(1, 16)).tokens[0]
    _edit_config(directory, eos_token_id=[full[1]])
    prompt = ",".join(map(str, PROMPTS[0]))
    stopped = _command("--checkpoint", str(directory), "--platform", "cpu", "--prompt-ids", prompt,
                       "--max-new-tokens", "5", "--json", str(tmp_path / "a.json"))
    assert stopped.returncode == 0, stopped.stderr
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["tokens"] == [full[:full.index(full[1]) + 1]] and report["stop_token_ids"] == [full[1]]
    assert f"stop tokens [{full[1]}]: 1 of 1 sequences ended on one" in stopped.stdout
    ignored = _command("--checkpoint", str(directory), "--platform", "cpu", "--prompt-ids", prompt,
                       "--max-new-tokens", "5", "--ignore-eos", "--json", str(tmp_path / "b.json"))
    assert ignored.returncode == 0, ignored.stderr
    assert json.loads((tmp_path / "b.json").read_text())["tokens"] == [full]


def test_a_malformed_eos_token_id_names_the_key(tmp_path, capsys):
    from reference_impl.generate import main

    directory = write_random_checkpoint(tmp_path / "ckpt", DENSE, seed=31)
    _edit_config(directory, eos_token_id="2")
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", str(directory), "--prompt-ids", "1", "--max-new-tokens", "2"])
    assert exit_info.value.code == 2
    assert "key 'eos_token_id' must be a non-negative integer or a list of them, got '2'" in capsys.readouterr().err
