"""Checkpoints written by transformers 5.19 `save_pretrained`, one per config field that changes the math:
the runtime's fp32 logits and greedy tokens against transformers' on the same ids (with and without
the KV cache), and configs it must refuse, each with one line naming the field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import _hf_checkpoints as hf
from reference_impl.models.checkpoint import CheckpointError, load_checkpoint, read_config

pytest.importorskip("transformers", reason="transformers (the [test] extra) builds and runs the reference checkpoints")

FP32_LOGITS_ATOL = 5e-5    # logits spread over ~3 units; the two sides differ in summation order only


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Case name -> its checkpoint directory, written on first use."""
    root = tmp_path_factory.mktemp("hf")
    made = {}

    def get(name: str):
        if name not in made:
            made[name] = hf.write_case(hf.CASES[name], root / str(len(made)), seed=list(hf.CASES).index(name))
        return made[name]
    return get


FP32_CASES = [name for name in hf.CASES if name != "dtype bfloat16"]


@pytest.mark.parametrize("name", FP32_CASES)
def test_logits_and_greedy_tokens_match_transformers(name, checkpoints):
    case = hf.CASES[name]
    got = hf.compare(checkpoints(name), ignoring=case.ignoring, ignoring_each=case.ignoring_each,
                     attn_implementation=case.attn_implementation)
    assert got.recompute_diff <= FP32_LOGITS_ATOL, got
    assert got.cache_diff <= FP32_LOGITS_ATOL, got
    assert got.hf_tokens == got.cache_tokens == got.recompute_tokens, got
    if case.ignoring is not None and name != "rope dynamic":
        assert got.ignored_diff > 0.5, f"the case does not exercise the field: ignoring it is off by {got.ignored_diff}"
    for label, diff in got.ignored_each.items():
        assert diff > 0.5, f"the case does not exercise {label}: ignoring it is off by {diff}"


def test_dynamic_rope_equals_plain_rope_within_max_position_and_refuses_beyond(checkpoints):
    """transformers rescales dynamic NTK only once a sequence outgrows max_position_embeddings: the runtime
    matches it up to there (test above) and refuses a longer cache rather than guess."""
    model = load_checkpoint(checkpoints("rope dynamic"))
    assert model.config.rope_scaling.rope_type == "dynamic"
    with pytest.raises(ValueError, match="exceeds max_position_embeddings=128"):
        model.allocate_kv_cache(1, 129)


def test_config_dtype_is_the_default_and_bf16_is_as_close_to_fp32_as_transformers_bf16(checkpoints):
    directory = checkpoints("dtype bfloat16")
    assert json.loads((directory / "config.json").read_text())["dtype"] == "bfloat16"
    ours = load_checkpoint(directory)
    assert ours.dtype == torch.bfloat16 and ours.lm_head.weight.dtype == torch.bfloat16
    assert load_checkpoint(directory, torch.float32).dtype == torch.float32    # an explicit dtype wins
    got = hf.compare(directory)
    assert got.hf_tokens == got.cache_tokens, got
    ids = hf.prompt_ids() + got.hf_tokens[:-1]
    fp32 = hf.hf_logits(hf.hf_model(directory, torch.float32), ids)
    theirs_bf16 = hf.hf_logits(hf.hf_model(directory, torch.bfloat16), ids)
    with torch.no_grad():
        ours_bf16 = ours(torch.tensor(ids), torch.arange(len(ids))).float()
    ours_err, theirs_err = (ours_bf16 - fp32).abs().max().item(), (theirs_bf16 - fp32).abs().max().item()
    assert ours_err <= 1.5 * theirs_err, (ours_err, theirs_err)


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss"])
def test_gemma2_and_gpt_oss_in_bf16_are_as_close_to_fp32_as_transformers_bf16(name, checkpoints):
    """The embedding scale rounded to bf16, Gemma's float32 norms, float32 sinks and soft caps: in bf16 the
    runtime strays from fp32 no further than transformers does (which keeps gpt-oss's norms in fp32)."""
    directory, case = checkpoints(name), hf.CASES[name]
    ids = hf.prompt_ids()
    fp32 = hf.hf_logits(hf.hf_model(directory, torch.float32, case.attn_implementation), ids)
    theirs = hf.hf_logits(hf.hf_model(directory, torch.bfloat16, case.attn_implementation), ids)
    with torch.no_grad():
        ours = load_checkpoint(directory, torch.bfloat16)(torch.tensor(ids), torch.arange(len(ids))).float()
    ours_err, theirs_err = (ours - fp32).abs().max().item(), (theirs - fp32).abs().max().item()
    assert ours_err <= 1.5 * theirs_err, (ours_err, theirs_err)


def test_sharded_checkpoint_is_read_through_its_index(checkpoints):
    directory = checkpoints("sharded index")
    shards = sorted(p.name for p in directory.glob("model-*.safetensors"))
    assert len(shards) > 1 and not (directory / "model.safetensors").exists()
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    missing = directory / shards[-1]
    missing.rename(directory / "moved")
    try:
        with pytest.raises(CheckpointError, match=f"shard {shards[-1]} is missing"):
            load_checkpoint(directory)
    finally:
        (directory / "moved").rename(missing)
    assert set(index["weight_map"].values()) == set(shards)


def test_qwen2_and_mistral_windows_are_read_per_layer(checkpoints):
    qwen = read_config(checkpoints("qwen2 sliding window 8 on layer 1"))
    assert qwen.qkv_bias and not qwen.o_proj_bias
    assert [qwen.attention_window(i) for i in range(2)] == [None, 8]
    mistral = read_config(checkpoints("mistral sliding window 8"))
    assert [mistral.attention_window(i) for i in range(2)] == [8, 8]
    assert read_config(checkpoints("qwen2 (q/k/v biases)")).sliding_window is None   # use_sliding_window false


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss"])
@pytest.mark.parametrize("backend", ["platform", "REFERENCE"])
def test_gemma2_and_gpt_oss_through_the_kv_cache_equal_the_recompute(name, backend, checkpoints):
    """Soft caps, sinks and the per-layer window reach the paged backend (the platform's: CPP on the cpu
    platform; and REFERENCE): batched prompts shorter and longer than the window of 8, generated through the
    cache, give the tokens and logits of the full recompute (explicit softmax, no cache), which matches
    transformers (test above)."""
    from reference_impl.models import generate, greedy_generate

    model = load_checkpoint(checkpoints(name), attn_backend=None if backend == "platform" else backend)
    assert backend == "platform" or model.attention_backends == [backend]
    layer0 = model.model.layers[0].self_attn
    if name == "gemma2":
        assert (layer0.soft_cap, layer0.sinks) == (3.0, None)
    else:
        assert layer0.soft_cap is None and layer0.sinks.abs().min() > 0     # the checkpoint's sinks, loaded
    assert [lay.self_attn.attn.sliding_window for lay in model.model.layers] == [8, None]
    prompts = [hf.prompt_ids(), hf.prompt_ids()[:5], hf.prompt_ids()[3:20]]
    batch = generate(model, prompts, 6, cache=model.allocate_kv_cache(3, 40), prompt_logits=True)
    for s, prompt in enumerate(prompts):
        ref = greedy_generate(model, torch.tensor(prompt), 6)
        assert batch.tokens[s] == ref.tokens, (s, batch.tokens[s], ref.tokens)
        torch.testing.assert_close(batch.sequence_logits(s), torch.cat([ref.prompt_logits, ref.step_logits[1:]]),
                                   atol=2e-5, rtol=2e-5)


def test_gemma2_and_gpt_oss_configs_are_read_with_their_families_defaults(checkpoints, tmp_path):
    gemma = read_config(checkpoints("gemma2"))
    assert (gemma.norm_style, gemma.embedding_scale, gemma.attention_scale) == ("gemma2", 8.0, 24 ** -0.5)
    assert (gemma.attn_logit_softcap, gemma.final_logit_softcap, gemma.hidden_act) == (3.0, 4.0, "gelu_pytorch_tanh")
    assert [gemma.attention_window(i) for i in range(2)] == [8, None]
    oss = read_config(checkpoints("gpt_oss"))
    assert (oss.moe_style, oss.attention_sinks, oss.num_experts, oss.qkv_bias, oss.o_proj_bias) == (
        "gpt_oss", True, 4, True, True)
    assert (oss.rope_theta, oss.rope_scaling.factor, oss.rope_scaling.truncate) == (150000.0, 4.0, False)
    # keys left out take Gemma2Config's / GptOssConfig's defaults (gpt-oss: YaRN x32 over 4096 positions)
    for case, drop in (("gemma2", ["query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
                                   "sliding_window", "layer_types", "tie_word_embeddings", "hidden_activation"]),
                       ("gpt_oss", ["rope_parameters", "sliding_window", "layer_types", "attention_bias",
                                    "num_experts_per_tok", "swiglu_alpha", "swiglu_limit"])):
        directory = _edited(checkpoints(case), tmp_path / case, lambda doc: [doc.pop(k) for k in drop])
        config = read_config(directory)
        if case == "gemma2":
            assert (config.query_pre_attn_scalar, config.attn_logit_softcap, config.final_logit_softcap,
                    config.sliding_window, config.sliding_window_layers, config.tie_word_embeddings) == (
                256, 50.0, 30.0, 4096, (0,), True)
        else:
            scaling = config.rope_scaling
            assert (config.rope_theta, scaling.rope_type, scaling.factor, scaling.original_max_position_embeddings,
                    scaling.truncate, config.sliding_window, config.sliding_window_layers, config.qkv_bias,
                    config.num_experts_per_tok) == (150000.0, "yarn", 32.0, 4096, False, 128, (0,), True, 4)


def test_batched_prompts_with_a_window_equal_single_ones(checkpoints):
    from reference_impl.models import generate

    model = load_checkpoint(checkpoints("mistral sliding window 8"))
    prompts = [hf.prompt_ids(), hf.prompt_ids()[:5], hf.prompt_ids()[3:20]]
    batch = generate(model, prompts, 6, cache=model.allocate_kv_cache(3, 40), prompt_logits=True)
    for s, prompt in enumerate(prompts):
        single = generate(model, [prompt], 6, cache=model.allocate_kv_cache(1, 40), prompt_logits=True)
        assert batch.tokens[s] == single.tokens[0]
        torch.testing.assert_close(batch.sequence_logits(s), single.sequence_logits(0), atol=2e-5, rtol=2e-5)


# ----- configs that must be refused ---------------------------------------------------------------
def _edited(directory, tmp_path, edit):
    """A copy of `directory` with its config.json changed by `edit(doc)`."""
    import shutil

    tmp_path.mkdir(parents=True, exist_ok=True)
    target = tmp_path / "edited"
    shutil.copytree(directory, target)
    doc = json.loads((target / "config.json").read_text())
    edit(doc)
    (target / "config.json").write_text(json.dumps(doc))
    return target


def _set(**changes):
    return lambda doc: doc.update(changes)


def _rope_set(**changes):
    return lambda doc: doc["rope_parameters"].update(changes)


REFUSED = {
    "hidden_act relu": (_set(hidden_act="relu"), "key 'hidden_act' is 'relu'; supported: silu, swish, gelu"),
    "rope_type longrope": (_rope_set(rope_type="longrope", short_factor=[1.0], long_factor=[1.0]),
                           "key 'rope_parameters.rope_type' is 'longrope'; supported: default, linear, dynamic"),
    "rope key the type does not read": (_rope_set(rope_type="linear", factor=2.0, beta_fast=3.0),
                                        "key 'rope_parameters.beta_fast' is not read by rope_type 'linear'"),
    "llama3 without high_freq_factor": (_rope_set(rope_type="llama3", factor=8.0, low_freq_factor=1.0),
                                        "key 'rope_parameters.high_freq_factor' is missing"),
    "linear without factor": (_rope_set(rope_type="linear"), "key 'rope_parameters.factor' is missing"),
    "partial rotary": (_rope_set(partial_rotary_factor=0.5), "key 'partial_rotary_factor' is 0.5"),
    "rope per layer type": (lambda doc: doc.update(rope_parameters={"full_attention": {"rope_type": "default"}}),
                            "holds rope parameters per layer type"),
    "unknown key": (_set(logit_scale=2.0), "key 'logit_scale' is not one the runtime knows for model_type 'llama'"),
    "sliding_window on llama": (_set(sliding_window=8), "key 'sliding_window' is not one the runtime knows"),
    "quantized": (_set(quantization_config={"quant_method": "fp8"}), "quantized checkpoints are not supported"),
    "model_type": (_set(model_type="gemma"), "key 'model_type' is 'gemma'; the reference decoder loads"),
    "dtype": (_set(dtype="float8_e4m3fn"), "key 'dtype' is 'float8_e4m3fn'; the runtime runs float32"),
    "dtype disagreement": (_set(dtype="float32", torch_dtype="bfloat16"), "keys 'dtype' ('float32') and "
                                                                          "'torch_dtype' ('bfloat16') disagree"),
    "attention_bias not a bool": (_set(attention_bias="yes"), "key 'attention_bias' must be true or false"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_configs_that_change_the_math_unread_are_refused_with_one_line(name, checkpoints, tmp_path):
    edit, message = REFUSED[name]
    directory = _edited(checkpoints("llama"), tmp_path, edit)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(directory)
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


# (case, config edit, message): keys of the new families that change the math and are not honoured
REFUSED_FAMILY = {
    "gemma2 bidirectional": ("gemma2", _set(use_bidirectional_attention=True),
                             "key 'use_bidirectional_attention' is true; the runtime's decoder attends causally"),
    "gemma2 hidden_activation": ("gemma2", _set(hidden_activation="relu"), "key 'hidden_activation' is 'relu'"),
    "gemma2 a gpt-oss key": ("gemma2", _set(swiglu_limit=7.0),
                             "key 'swiglu_limit' is not one the runtime knows for model_type 'gemma2'"),
    "gemma2 query_pre_attn_scalar": ("gemma2", _set(query_pre_attn_scalar=0),
                                     "key 'query_pre_attn_scalar' must be a positive number"),
    "gemma2 rope per layer type": ("gemma2", _set(rope_parameters={"sliding_attention": {"rope_type": "default"},
                                                                   "full_attention": {"rope_type": "default"}}),
                                   "holds rope parameters per layer type"),
    "gpt_oss swiglu_limit": ("gpt_oss", _set(swiglu_limit=5.0), "key 'swiglu_limit' is 5.0; the runtime's gpt-oss "
                                                                "experts compute the clamped SwiGLU with"),
    "gpt_oss swiglu_alpha": ("gpt_oss", _set(swiglu_alpha=1.0), "key 'swiglu_alpha' is 1.0"),
    "gpt_oss a Gemma-2 key": ("gpt_oss", _set(attn_logit_softcapping=30.0),
                              "key 'attn_logit_softcapping' is not one the runtime knows for model_type 'gpt_oss'"),
    "gpt_oss mxfp4": ("gpt_oss", _set(quantization_config={"quant_method": "mxfp4"}),
                      "quantized checkpoints are not supported"),
    "gpt_oss layer_types": ("gpt_oss", _set(layer_types=["sliding_attention"]),
                            "key 'layer_types' must list 'full_attention' or 'sliding_attention' for each of the 2"),
    "gpt_oss experts": ("gpt_oss", _set(num_local_experts=None), "key 'num_local_experts' must be a positive integer"),
}


@pytest.mark.parametrize("name", list(REFUSED_FAMILY))
def test_gemma2_and_gpt_oss_keys_that_change_the_math_unread_are_refused(name, checkpoints, tmp_path):
    case, edit, message = REFUSED_FAMILY[name]
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(_edited(checkpoints(case), tmp_path, edit))
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_qwen2_layer_types_must_name_each_layer(checkpoints, tmp_path):
    directory = _edited(checkpoints("qwen2 sliding window 8 on layer 1"), tmp_path,
                        _set(layer_types=["sliding_attention"]))
    with pytest.raises(CheckpointError, match="key 'layer_types' must list 'full_attention' or 'sliding_attention' "
                                              "for each of the 2 layers"):
        load_checkpoint(directory)


def test_only_safetensors_weights_are_read(tmp_path, checkpoints):
    import shutil

    directory = tmp_path / "bin"
    directory.mkdir()
    shutil.copy(checkpoints("llama") / "config.json", directory)
    (directory / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"has no model.safetensors or model.safetensors.index.json \(found "
                                              r"pytorch_model.bin: only safetensors files are read\)"):
        load_checkpoint(directory)


def test_command_refuses_with_one_line_naming_the_field(checkpoints, tmp_path):
    directory = _edited(checkpoints("llama"), tmp_path, _set(hidden_act="relu"))
    run = subprocess.run([sys.executable, "-m", "reference_impl.generate", "--checkpoint", str(directory),
                          "--prompt-ids", "1,2,3", "--max-new-tokens", "2"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "key 'hidden_act' is 'relu'" in run.stderr


# ----- the scaled rotary caches at full-size parameters ---------------------------------------------
FULL_SIZE_ROPE = {
    "llama3 (Llama 3.1)": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "yarn (Qwen2.5 long context)": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                    "original_max_position_embeddings": 2048},
    "yarn mscale": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0, "original_max_position_embeddings": 2048,
                    "mscale": 1.0, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1},
    "linear": {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0},
}


@pytest.mark.parametrize("name", list(FULL_SIZE_ROPE))
def test_scaled_rotary_cache_matches_transformers_at_full_size(name):
    """cos/sin of head_dim 128 at positions up to 8191 against transformers' LlamaRotaryEmbedding (float32: its
    angles carry ~position * 6e-8 of rounding, hence the tolerance)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from reference_impl.models.hf_config import config_from_hf
    from reference_impl.models.rope import build_rotary

    doc = {"model_type": "llama", "vocab_size": 32, "hidden_size": 4096, "intermediate_size": 64,
           "num_hidden_layers": 1, "num_attention_heads": 32, "max_position_embeddings": 8192,
           "rope_parameters": FULL_SIZE_ROPE[name]}
    config = config_from_hf(doc)
    ours = build_rotary(config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling,
                        torch.float64)
    positions = torch.tensor([0, 1, 2, 31, 1000, 8191])
    theirs = LlamaRotaryEmbedding(LlamaConfig(**{k: v for k, v in doc.items() if k != "model_type"}))
    cos, sin = theirs(torch.zeros(1, dtype=torch.float32), positions[None])
    half = config.head_dim // 2
    cache = ours.cos_sin_cache[positions]
    torch.testing.assert_close(cache[:, :half], cos[0, :, :half].double(), atol=1e-3, rtol=0)
    torch.testing.assert_close(cache[:, half:], sin[0, :, :half].double(), atol=1e-3, rtol=0)
    # positions 0..2 carry no rounding worth the name: the frequencies and the magnitude agree tightly
    torch.testing.assert_close(cache[:3, :half], cos[0, :3, :half].double(), atol=1e-6, rtol=0)
    torch.testing.assert_close(cache[:3, half:], sin[0, :3, :half].double(), atol=1e-6, rtol=0)


# ----- text in, text out ----------------------------------------------------------------------------
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away"]


def _write_tokenizer(directory, vocab_size: int) -> None:
    """A word-level tokenizer.json over WORDS plus filler words up to `vocab_size`, BOS id 1 prepended."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for word in WORDS + [f"w{i}" for i in range(vocab_size)]:
        if len(vocab) < vocab_size:
            vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")   # joins words with spaces
    tok.save(str(directory / "tokenizer.json"))


def _command(*args):
    return subprocess.run([sys.executable, "-m", "reference_impl.generate", *args], capture_output=True, text=True,
                          timeout=240)


def test_text_prompt_in_text_out_through_the_checkpoints_tokenizer(checkpoints, tmp_path):
    import shutil

    from transformers import PreTrainedTokenizerFast

    from reference_impl.models import generate
    from reference_impl.models.tokenizer import load_tokenizer

    directory = tmp_path / "with_tokenizer"
    shutil.copytree(checkpoints("llama"), directory)
    _write_tokenizer(directory, hf.BASE["vocab_size"])
    tokenizer = load_tokenizer(directory)
    text = "the cat sat on the mat"
    ids = tokenizer.encode(text)
    assert ids[0] == 1 and len(ids) == 7
    assert ids == PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"))(text)["input_ids"]
    batch = tmp_path / "prompts.jsonl"
    batch.write_text(json.dumps({"prompt": "a dog ran"}) + "\n" + json.dumps("far away") + "\n")
    out = tmp_path / "out.json"
    run = _command("--checkpoint", str(directory), "--prompt", text, "--batch-file", str(batch), "--max-new-tokens",
                   "5", "--ignore-eos", "--json", str(out))
    assert run.returncode == 0, run.stderr
    model = load_checkpoint(directory)
    prompts = [ids, tokenizer.encode("a dog ran"), tokenizer.encode("far away")]
    expected = generate(model, prompts, 5, cache=model.allocate_kv_cache(3, 16)).tokens
    report = json.loads(out.read_text())
    assert report["tokens"] == expected
    assert report["text"] == [tokenizer.decode(t) for t in expected]
    assert report["prompt_text"] == [text, "a dog ran", "far away"]
    line = f"sequence 0: prompt {text!r} -> {tokenizer.decode(expected[0])!r} (ids {ids} -> {expected[0]})"
    assert line in run.stdout
    # ids mode on the same checkpoint prints ids only
    run = _command("--checkpoint", str(directory), "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", "5",
                   "--ignore-eos")
    assert run.returncode == 0 and f"sequence 0: prompt {ids} -> {expected[0]}" in run.stdout, run.stderr


def test_text_without_a_tokenizer_is_one_clear_line(checkpoints, tmp_path, monkeypatch, capsys):
    import shutil

    from reference_impl import generate as command

    with pytest.raises(SystemExit) as info:
        command.main(["--checkpoint", str(checkpoints("llama")), "--prompt", "hello", "--max-new-tokens", "2"])
    assert info.value.code == 2
    assert "has no tokenizer.json: text prompts need one (give token ids instead)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        command.main(["--random", "tiny", "--prompt", "hello", "--max-new-tokens", "2"])
    assert "text prompts need --checkpoint with a tokenizer.json" in capsys.readouterr().err
    directory = tmp_path / "with_tokenizer"
    shutil.copytree(checkpoints("llama"), directory)
    _write_tokenizer(directory, 64)
    monkeypatch.setitem(sys.modules, "tokenizers", None)      # the [text] extra is not installed
    with pytest.raises(SystemExit):
        command.main(["--checkpoint", str(directory), "--prompt", "the cat", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "text prompts need the 'tokenizers' package: pip install " \
                                    "'reference-impl-conformance[text]'" in err, err
