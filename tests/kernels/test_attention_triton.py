"""The Triton paged-attention kernels (reference_impl/kernels/triton/attention.py): against the float64 oracle
under the interpreter (or on a GPU where there is one), the writer's slots, what they refuse, and that both
kernels compile for sm_90 (no GPU needed).

Triton decides at import whether `@triton.jit` interprets (TRITON_INTERPRET), so the runs happen in child
processes with the right environment; this file is also the child's script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve()
ON_GPU = torch.cuda.is_available()
CHILD_TIMEOUT_S = 400
ATOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.5e-2}

# (name, dtype, heads, kv_heads, head, block, features)
CASES = [
    ("plain_gqa7", "float32", 14, 2, 64, 16, {}),
    ("window_sinks_gqa3", "bfloat16", 9, 3, 80, 32, {"window": 5, "sinks": True}),
    ("cap_alibi_head48", "float16", 4, 4, 48, 16, {"cap": 3.0, "alibi": True}),
    ("noncausal_window", "float32", 6, 2, 32, 8, {"causal": False, "window": 4}),
    ("window1_mqa", "bfloat16", 7, 1, 16, 16, {"window": 1}),
]


def _problem(dtype, heads, kv_heads, head, block, features, device, seed=0):
    from reference_impl.attention.oracle import AttentionProblem, alibi_slopes

    g = torch.Generator().manual_seed(seed)
    requests = [(0, 1), (block + 3, 1), (block - 1, 9), (0, 13), (2 * block, 0)]
    query_lens = [n for _, n in requests]
    seq_lens = [c + n for c, n in requests]
    keys = [torch.randn(s, kv_heads, head, generator=g).to(dtype) for s in seq_lens]
    values = [torch.randn(s, kv_heads, head, generator=g).to(dtype) for s in seq_lens]
    blocks = [-(-s // block) for s in seq_lens]
    perm = (torch.randperm(sum(blocks), generator=g) + 1).tolist()
    table = torch.zeros(len(requests), max(blocks) + 1, dtype=torch.int32)
    for i, n in enumerate(blocks):
        table[i, :n] = torch.tensor(perm[sum(blocks[:i]):sum(blocks[:i]) + n])
    slots = torch.tensor([int(table[i, p // block]) * block + p % block
                          for i, s in enumerate(seq_lens) for p in range(s)] + [-1, -1])
    junk = torch.randn(2, kv_heads, head, generator=g).to(dtype)
    t = sum(query_lens)
    qkv = torch.randn(t + 2, heads + 2 * kv_heads, head, generator=g).to(dtype)  # q is a strided view
    sinks = torch.randn(heads, generator=g) if features.get("sinks") else None
    slopes = alibi_slopes(heads) if features.get("alibi") else None
    problem = AttentionProblem(query=qkv[:t, :heads], keys=keys, values=values, query_lens=query_lens,
                               seq_lens=seq_lens, scale=head ** -0.5, sliding_window=features.get("window"),
                               logits_soft_cap=features.get("cap"), alibi_slopes=slopes, sinks=sinks,
                               causal=features.get("causal", True))
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    tensors = dict(keys=torch.cat([*keys, junk]).to(device), values=torch.cat([*values, junk]).to(device),
                   slots=slots.to(device), query=qkv[:, :heads].to(device), qsl=qsl.to(device),
                   seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(device), table=table.to(device),
                   cache=torch.full((sum(blocks) + 1, kv_heads, block, 2 * head), 3.0, dtype=dtype, device=device),
                   sinks=None if sinks is None else sinks.to(device),
                   alibi=None if slopes is None else torch.tensor(slopes).to(device))
    return problem, tensors


# ----- child side ---------------------------------------------------------------------------------
def child_numerics(out_path: str) -> None:
    from reference_impl.attention.oracle import oracle
    from reference_impl.kernels.triton import _env
    from reference_impl.kernels.triton import attention as ta

    device = "cuda" if ON_GPU else "cpu"
    results = {"_interpret": _env.INTERPRET}
    for name, dtype_name, heads, kv_heads, head, block, features in CASES:
        dtype = getattr(torch, dtype_name)
        problem, x = _problem(dtype, heads, kv_heads, head, block, features, device)
        before = x["cache"].clone()
        ta.reshape_and_cache(x["keys"], x["values"], x["cache"], x["slots"], "auto", 1.0, 1.0)
        written = x["cache"].clone()
        expected = before.clone()
        for t, s in enumerate(x["slots"].tolist()):
            if s >= 0:
                expected[s // block, :, s % block] = torch.cat([x["keys"][t], x["values"][t]], dim=-1)
        out = torch.full_like(x["query"], float("nan"))
        ta.paged_attention(out, x["query"], x["cache"], x["qsl"], x["seq_lens"], x["table"], problem.scale,
                           problem.causal, features.get("window", -1), features.get("cap", 0.0), x["alibi"],
                           x["sinks"], "auto", 1.0, 1.0)
        t = problem.query.shape[0]
        err = (out[:t].double().cpu() - oracle(problem)).abs().max().item()
        results[name] = {"err": err, "tol": ATOL[dtype_name], "pad_untouched": bool(torch.isnan(out[t:]).all()),
                         "cache_as_expected": bool(torch.equal(written, expected)),
                         "null_block_untouched": bool(torch.equal(written[0], before[0])),
                         "forward_left_cache": bool(torch.equal(x["cache"], written))}
    results["_backend"] = _through_backend(device)
    problem, x = _problem(torch.float32, 4, 2, 16, 8, {}, device)
    refusals = {}
    for label, call in {
        "fp8": lambda: ta.reshape_and_cache(x["keys"], x["values"], x["cache"].to(torch.uint8), x["slots"], "fp8",
                                            1.0, 1.0),
        "dtype": lambda: ta.reshape_and_cache(x["keys"].half(), x["values"].half(), x["cache"], x["slots"], "auto",
                                              1.0, 1.0),
        "heads": lambda: ta.paged_attention(x["query"][:, :3], x["query"][:, :3], x["cache"], x["qsl"],
                                            x["seq_lens"], x["table"], 0.25, True, -1, 0.0, None, None, "auto", 1.0,
                                            1.0),
        "window": lambda: ta.paged_attention(x["query"].clone(), x["query"], x["cache"], x["qsl"], x["seq_lens"],
                                             x["table"], 0.25, True, 0, 0.0, None, None, "auto", 1.0, 1.0),
    }.items():
        try:
            call()
            refusals[label] = "no error"
        except Exception as exc:  # noqa: BLE001  (the message is what is checked)
            refusals[label] = f"{type(exc).__name__}: {exc}"
    results["_refusals"] = refusals
    Path(out_path).write_text(json.dumps(results))


def _through_backend(device: str) -> dict:
    """One case through the TRITON_PAGED backend's builder, writer and forward (the Attention layer's impl)."""
    from reference_impl.attention.backend import CommonAttentionMetadata
    from reference_impl.attention.layer import Attention
    from reference_impl.attention.oracle import oracle
    from reference_impl.attention.registry import AttentionBackendEnum
    from reference_impl.attention.triton_backend import TritonAttentionBackend

    features = {"window": 6, "sinks": True, "cap": 5.0}
    problem, x = _problem(torch.bfloat16, 8, 2, 64, 16, features, device, seed=4)
    layer = Attention(8, 64, problem.scale, 2, block_size=16, logits_soft_cap=5.0, per_layer_sliding_window=6,
                      sinks=x["sinks"], attn_backend=TritonAttentionBackend, dtype=torch.bfloat16)
    t = problem.query.shape[0]
    common = CommonAttentionMetadata(query_start_loc=x["qsl"], query_start_loc_cpu=x["qsl"].cpu(),
                                     seq_lens=x["seq_lens"], num_reqs=len(problem.seq_lens), num_actual_tokens=t,
                                     max_query_len=max(problem.query_lens), max_seq_len=max(problem.seq_lens),
                                     block_table_tensor=x["table"], slot_mapping=x["slots"], causal=True)
    md = TritonAttentionBackend.get_builder_cls()(layer.get_kv_cache_spec(), ["l0"], None,
                                                 torch.device(device)).build(0, common)
    layer.impl.do_kv_cache_update(layer, x["keys"], x["values"], x["cache"], x["slots"])
    out = torch.full_like(x["query"], float("nan"))
    layer.impl.forward(layer, x["query"], None, None, x["cache"], md, out)
    err = (out[:t].double().cpu() - oracle(problem)).abs().max().item()
    try:
        TritonAttentionBackend.get_impl_cls()(8, 64, 0.125, 2, kv_cache_dtype="fp8")
        fp8 = "no error"
    except NotImplementedError as exc:
        fp8 = str(exc)
    return {"err": err, "tol": ATOL["bfloat16"], "pad_untouched": bool(torch.isnan(out[t:]).all()),
            "registered": AttentionBackendEnum["TRITON_PAGED"].get_class() is TritonAttentionBackend, "fp8": fp8}


def child_compile(out_path: str) -> None:
    """Compile both kernels for sm_90 over dtypes and feature flags (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from reference_impl.kernels.triton import _attention_jit as jit

    results = {}
    for dtype in ("fp32", "fp16", "bf16"):
        ptr = "*" + dtype
        writer = {"k_ptr": ptr, "k_s0": "i64", "k_s1": "i64", "v_ptr": ptr, "v_s0": "i64", "v_s1": "i64",
                  "kv_ptr": ptr, "kv_s0": "i64", "kv_s1": "i64", "kv_s2": "i64", "slot_ptr": "*i64",
                  "head_size": "i32", "block_size": "i32", "BLOCK_D": "constexpr"}
        forward = {"out_ptr": ptr, "out_s0": "i64", "out_s1": "i64", "q_ptr": ptr, "q_s0": "i64", "q_s1": "i64",
                   "kv_ptr": ptr, "kv_s0": "i64", "kv_s1": "i64", "kv_s2": "i64", "token_seq_ptr": "*i32",
                   "qsl_ptr": "*i32", "seq_lens_ptr": "*i32", "bt_ptr": "*i32", "bt_s0": "i64",
                   "alibi_ptr": "*fp32", "sinks_ptr": "*fp32", "scale": "fp32", "softcap": "fp32", "window": "i32",
                   "head_size": "i32", "block_size": "i32", "group": "i32"}
        flags = ("CAUSAL", "HAS_WINDOW", "HAS_SOFTCAP", "HAS_ALIBI", "HAS_SINKS")
        variants = [("reshape_and_cache_kernel", jit.reshape_and_cache_kernel, writer, {"BLOCK_D": 128})]
        for on in ((), flags, ("CAUSAL", "HAS_WINDOW", "HAS_SINKS")):
            sig = {**forward, **{f: "constexpr" for f in flags}, "BLOCK_N": "constexpr", "BLOCK_D": "constexpr"}
            consts = {**{f: f in on for f in flags}, "BLOCK_N": 32, "BLOCK_D": 128}
            variants.append(("paged_attention_kernel", jit.paged_attention_kernel, sig, consts))
        for name, kernel, sig, consts in variants:
            key = f"{name}::{dtype}::{sum(bool(v) for k, v in consts.items() if k.startswith(('CAUSAL', 'HAS')))}"
            try:
                compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts),
                                          target=GPUTarget("cuda", 90, 32))
                results[key] = {"ok": "cubin" in compiled.asm, "message": ""}
            except Exception as exc:  # noqa: BLE001
                results[key] = {"ok": False, "message": f"{type(exc).__name__}: {exc}"[:2000]}
    Path(out_path).write_text(json.dumps(results))


# ----- parent side --------------------------------------------------------------------------------
def _spawn(mode: str, interpret: bool, tmp: Path) -> dict:
    out = tmp / f"{mode}.json"
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, str(HERE), mode, str(out)], env=env, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S)
    if proc.returncode != 0 or not out.exists():
        pytest.fail(f"child '{mode}' exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())




@pytest.fixture(scope="module")
def numerics(tmp_path_factory):
    pytest.importorskip("triton")
    return _spawn("numerics", not ON_GPU, tmp_path_factory.mktemp("attn_triton"))


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_forward_and_writer_against_the_oracle(numerics, case):
    r = numerics[case]
    assert r["err"] <= r["tol"], f"max abs error {r['err']:.3g} > {r['tol']:.3g}"
    assert r["pad_untouched"], "output rows past query_start_loc[-1] were written"
    assert r["cache_as_expected"], "the writer's cache differs from a Python scatter of the slots >= 0"
    assert r["null_block_untouched"] and r["forward_left_cache"]


def test_backend_through_the_attention_layer(numerics):
    r = numerics["_backend"]
    assert r["registered"]
    assert r["err"] <= r["tol"], f"max abs error {r['err']:.3g} > {r['tol']:.3g}"
    assert r["pad_untouched"]
    assert "TRITON_PAGED attention backend has no kv_cache_dtype 'fp8' (supported: auto)" in r["fp8"]


def test_refusals_name_the_problem(numerics):
    r = numerics["_refusals"]
    assert r["fp8"].startswith("NotImplementedError") and "kv_cache_dtype 'fp8' is not supported" in r["fp8"]
    assert "must equal the activation dtype" in r["dtype"]
    assert "num_heads 3 is not a multiple of num_kv_heads 2" in r["heads"]
    assert "sliding_window must be -1 (none) or positive, got 0" in r["window"]


@pytest.mark.skipif(ON_GPU, reason="on a GPU the numerics child compiles and runs the kernels")
def test_kernels_compile_for_sm90(tmp_path):
    pytest.importorskip("triton")
    results = _spawn("compile", False, tmp_path)
    assert len(results) == 12
    bad = {k: v["message"] for k, v in results.items() if not v["ok"]}
    assert not bad, bad


if __name__ == "__main__":
    {"numerics": child_numerics, "compile": child_compile}[sys.argv[1]](sys.argv[2])
