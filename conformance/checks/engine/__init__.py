"""Engine family: the whole platform through vLLM's own `LLM` engine (its worker, model runner, KV-cache manager,
attention backend, sampler and kernels together), against the reference runtime as the oracle.

A unit is one model, one dtype and one mode (eager; at the full level also compiled), so that one model the platform
cannot run (gpt-oss's MoE on a platform that brings none) is one result, which a waiver can name (`op` = the
model), and the others still PASS. Under `--platform=vllm` the platform brings vLLM's engine (`conformance_engine`,
conformance/vllm/platform.py: the checks reach vLLM only through the platform they are given, never by importing the
bridge): a tiny random checkpoint of the unit's model (models.py) is written by transformers' `save_pretrained`, and
an engine process runs the model's fixed requests through an engine with chunked prefill forced (a token budget
below the longest prompt) and prefix caching on, greedily, asking for logprobs. The oracle (oracle.py) is the
reference decoder on native everything in float64, teacher-forced on the engine's tokens. A divergence is located
(request, step) and then explained: the same engine process reruns that request alone, and the batch without
chunked prefill and without prefix caching, and the verdict says which of them makes it match. An engine that
raises is an ERROR naming the part of vLLM's contract for a platform it points to, where it is one of the known ways
vLLM 0.32 raises (contracts.py), and whose code it is (whose.py: vLLM's own code, with none of the platform's on the
stack, is upstream). On a platform written against our own API the units run the reference runtime
(`reference_impl.models`) on the platform instead, graded by the same oracle (runtime.py). On 2 ranks (float32):
TP_CASE, tensor parallelism, and at the full level EP_CASE, expert parallelism on the MoE models over the same ranks
(vLLM's engine with enable_expert_parallel under the bridge; the reference runtime on spawned gloo ranks otherwise,
parallel.py). The family has no units at the quick level: an engine costs tens of seconds.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from conformance.checks.common import CheckContext, Verdict, failed, passed, unit_dtype
from conformance.checks.record import check
from conformance.collect.inventory import Inventory
from conformance.collect.units import Unit, dtype_name
from conformance.results.result import Outcome
from conformance import scratch_dirs

CASES = ("eager", "compiled", "eager,tp=2", "eager,tp=2,ep")
TP_CASE = "eager,tp=2"       # 2 ranks: the reference runtime's (parallel.py) or, under the bridge, vLLM's engine
EP_CASE = "eager,tp=2,ep"    # the same 2 ranks with expert parallelism on a MoE model (full level only)
PARALLEL_CASES = (TP_CASE, EP_CASE)
EP_ENGINE_MODEL = "mixtral"  # under the bridge: the plain MoE (gpt-oss's sinks raise on vLLM before 0.31 already)
TP_TIMEOUT_S = 240.0
STANDARD_DTYPES = ("float32", "bfloat16")     # the full level: every dtype the platform supports
JOB_TIMEOUT_S = 300.0                          # one job of the engine process; the per-check limit usually ends first
# The reruns that explain a divergence take three more engines (about 15 s on an idle 2-core machine); past this
# much of the unit they are left out, so a loaded machine reports the divergence (FAIL) rather than a TIMEOUT of the
# default 120 s per-check limit.
EXPLAIN_WITHIN_S = 70.0


def engine_of(platform):
    """The platform's way into vLLM's own engine, or None: the bridge's platform offers `conformance_engine(workdir)`
    (a context manager whose `run(runs, timeout)` answers a job's results document and raises an exception carrying
    `crashed` when the engine process dies or goes silent); a platform written against our own API has none, and the
    family runs the reference runtime on it."""
    return getattr(platform, "conformance_engine", None)


def engine_units(inventory: Inventory, family: str, check_name: str, level: str) -> list[Unit]:
    """One unit per model of the level, dtype and mode (op = the model): standard, float32 and bfloat16 eager; full,
    every dtype the platform supports eager, and under the vLLM bridge compiled too. On a platform without vLLM's
    engine the units run the reference runtime on it, eager only (model.decoder compiles the runtime's decoder).
    2 ranks (float32): TP_CASE, Llama at standard and every model at full on the runtime, Llama at full under the
    bridge; EP_CASE at full only, every MoE model on the runtime, EP_ENGINE_MODEL under the bridge."""
    from conformance.checks.engine.models import MODELS, models_at
    from conformance.checks.engine.oracle import tolerances

    if level == "quick":
        return []
    dtypes = [dtype_name(d) for d in inventory.dtypes_for(tolerances())]
    if level == "standard":
        dtypes = [d for d in dtypes if d in STANDARD_DTYPES]
    names = models_at(level)
    units = [Unit(family, check_name, m, None, d, "eager") for d in dtypes for m in names]
    if engine_of(inventory.platform) is not None and level == "full":
        units += [Unit(family, check_name, m, None, d, "compiled") for d in dtypes for m in names]
    if engine_of(inventory.platform) is None and "float32" in dtypes:   # tensor parallel: Llama, at full every model
        units += [Unit(family, check_name, m, None, "float32", TP_CASE) for m in (names if level == "full"
                                                                                  else names[:1])]
    elif level == "full" and "float32" in dtypes:   # vLLM's engine on 2 ranks: a minute to start on 2 cores
        units.append(Unit(family, check_name, names[0], None, "float32", TP_CASE))
    if level == "full" and "float32" in dtypes:     # expert parallelism: the MoE models (one under the bridge)
        moe = [m for m in names if MODELS[m].moe]
        if engine_of(inventory.platform) is not None:
            moe = [m for m in moe if m == EP_ENGINE_MODEL]
        units += [Unit(family, check_name, m, None, "float32", EP_CASE) for m in moe]
    return units


def base_run(name: str, checkpoint: Path, dtype: str, compiled: bool, **changes) -> dict:
    """The engine_runner run dict of the family's configuration: chunked prefill and prefix caching on, the fixed
    requests laid out for every KV block size the engine may choose."""
    from conformance.checks.engine.models import MAX_MODEL_LEN, TOKEN_BUDGET, waves_by_block_size

    run = dict(name=name, model=str(checkpoint), dtype=dtype, compiled=compiled, chunked_prefill=True,
               prefix_caching=True, token_budget=TOKEN_BUDGET, max_model_len=MAX_MODEL_LEN, max_num_seqs=8,
               waves=waves_by_block_size())
    run.update(changes)
    return run


@dataclasses.dataclass
class ModelResult:
    """One model's engine run graded: the grade or the engine's error, and what the run exercised."""

    model: str
    facts: dict
    grade: object | None = None
    error: str | None = None
    report: dict = dataclasses.field(default_factory=dict)    # the engine process's report of a run that raised
    explanation: str | None = None
    prefix_hits: dict[int, int] = dataclasses.field(default_factory=dict)
    shutdown_error: str | None = None


@check("engine", "generate", units=engine_units)
def generate(ctx: CheckContext, unit: Unit) -> Verdict:
    from conformance.checks.engine import models as engine_models

    if unit.case not in CASES:
        return Verdict(Outcome.ERROR, f"engine case {unit.case!r} is not one of {CASES}")
    if unit.op not in engine_models.MODELS:
        return Verdict(Outcome.ERROR, f"engine unit op {unit.op!r} names no model of the family: one of "
                       f"{tuple(engine_models.MODELS)} (conformance/checks/engine/models.py)")
    if unit.case == EP_CASE and not engine_models.MODELS[unit.op].moe:
        return Verdict(Outcome.ERROR, f"engine case {EP_CASE!r} is expert parallelism: model {unit.op!r} has no "
                       "experts (the MoE models: " + ", ".join(m for m, v in engine_models.MODELS.items() if v.moe)
                       + ")")
    dtype = unit_dtype(unit)
    engine = engine_of(ctx.platform)
    if unit.case in PARALLEL_CASES and engine is None:
        return _on_runtime_tp(ctx, unit, dtype)
    if engine is None:
        return _on_runtime(ctx, unit, dtype)
    compiled = unit.case == "compiled"
    ranks = 2 if unit.case in PARALLEL_CASES else 1
    start = time.monotonic()
    with scratch_dirs.directory("engine") as tmp:
        work = Path(tmp)
        checkpoint = engine_models.write_checkpoint(engine_models.MODELS[unit.op], dtype, work / unit.op)
        try:
            with engine(work) as proc:
                run = base_run(unit.op, checkpoint, unit.dtype, compiled, tensor_parallel_size=ranks,
                               expert_parallel=unit.case == EP_CASE)
                doc = proc.run([run], JOB_TIMEOUT_S)
                result = _grade_run(doc["runs"][0], checkpoint, dtype)
                spent = time.monotonic() - start
                if result.grade is not None and result.grade.divergences:
                    if ranks > 1:   # each rerun would start two more 2-rank engines: a minute each on 2 cores
                        result.explanation = ("the reruns that say which feature is involved are left out on 2 "
                                              "ranks: rerun the 1-rank unit of the model to see them")
                    elif spent > EXPLAIN_WITHIN_S:
                        result.explanation = ("the reruns that say which feature is involved were left out: the unit "
                                              f"had already run more than {EXPLAIN_WITHIN_S:g} s (a loaded machine?)")
                    else:
                        result.explanation = _explain(proc, result, checkpoint, unit.dtype, compiled, dtype)
        except Exception as exc:  # noqa: BLE001 - only the engine process's death or silence is a result here
            crashed = getattr(exc, "crashed", None)
            if not isinstance(crashed, bool):
                raise
            return Verdict(Outcome.CRASH if crashed else Outcome.TIMEOUT, f"{exc} [{_where(unit)}]")
    return _verdict(ctx.platform, result, doc, dtype, unit)


def _grade_run(run: dict, checkpoint: Path, dtype) -> ModelResult:
    from conformance.checks.engine import models as engine_models
    from conformance.checks.engine.oracle import grade, logprob_tolerance, oracle_logprobs

    if "error" in run:
        return ModelResult(run["name"], {}, error=f"{run['error']}\n{run.get('traceback', '')}", report=run)
    reqs = engine_models.from_json(run["waves"])
    outputs = {o["id"]: o for o in run["outputs"]}
    oracle = oracle_logprobs(checkpoint, reqs, outputs)
    tol = logprob_tolerance(dtype, run["name"])     # the family's runs are named by their model
    result = ModelResult(run["name"], run["facts"], grade(reqs, outputs, oracle, tol))
    result.prefix_hits = {o["id"]: o["cached_tokens"] for o in run["outputs"] if o["cached_tokens"]}
    result.shutdown_error = run.get("shutdown_error")
    return result


# ----- the reference runtime on a platform written against our API ---------------------------------
def _on_runtime(ctx: CheckContext, unit: Unit, dtype) -> Verdict:
    """The unit's model through `reference_impl.models` on the platform, graded like vLLM's engine."""
    from conformance.checks.common import call_impl
    from conformance.checks.engine import models as engine_models
    from conformance.checks.engine.oracle import grade, logprob_tolerance, oracle_logprobs
    from conformance.checks.engine.runtime import build_for, family_requests, generate_waves
    from conformance.checks.model import NATIVE_ATTENTION, attention_refusal, exercised

    if unit.case != "eager":
        return Verdict(Outcome.ERROR, f"engine unit {unit.id} runs only under the vLLM bridge: the reference "
                       "runtime's units are eager")
    name = unit.op
    tol = logprob_tolerance(dtype, name)
    with scratch_dirs.directory("engine") as tmp:
        checkpoint = engine_models.write_checkpoint(engine_models.MODELS[name], dtype, Path(tmp) / name)
        model = call_impl(f"building {name} with the platform's layers", build_for, checkpoint, dtype, ctx.device)
        refused = attention_refusal(model)
        if refused is not None:   # graded by the attention family on what it declares
            model = call_impl(f"building {name} with the platform's layers", build_for, checkpoint, dtype,
                              ctx.device, NATIVE_ATTENTION)
        reqs = family_requests(model)
        ran = call_impl(f"{name} on the platform (probing prefill and decode)", exercised, model,
                        [list(reqs[1].prompt)], ctx.device)
        if refused is not None:
            ran.attention_note = f" (the platform's {refused}, so {name} attended on {NATIVE_ATTENTION})"
        outputs = call_impl(f"{name} on the platform's runtime", generate_waves, model, reqs, ctx.device)
        result = ModelResult(name, {}, grade(reqs, outputs, oracle_logprobs(checkpoint, reqs, outputs), tol))
        if result.grade.divergences:
            result.explanation = _alone(model, result.grade.divergences[0].request, checkpoint, ctx.device, tol)
    where = (f"reference runtime (reference_impl.models) on the platform, {unit.dtype}, eager, each wave one packed "
             f"prefill then decode steps over the paged KV cache; {name} ({engine_models.MODELS[name].exercises}): "
             f"{ran.describe()}")
    if not ran.anything:
        return Verdict(Outcome.NOT_IMPLEMENTED, "the runtime ran entirely on native implementations: the platform "
                       f"brings none of the IR ops, layers or attention backend the model uses [{where}]")
    within, errs = _within(result, tol)
    if result.grade.divergences:
        return failed(f"the runtime on the platform leaves the float64 reference (teacher-forced on its tokens, "
                      f"logprob tolerance {tol:.3g}): {name}: {result.grade.divergences[0].line()}; "
                      f"{result.explanation} [{where}]", **errs)
    return passed(f"{within} [{where}]", **errs)


def _on_runtime_tp(ctx: CheckContext, unit: Unit, dtype) -> Verdict:
    """The unit's model on the reference runtime with tensor parallelism over 2 spawned ranks (parallel.py), each
    activating the platform; its TP group's collectives go through the platform's device communicator. EP_CASE adds
    expert parallelism: each rank's MoE layers hold only its experts, whose parts the TP group's one all_reduce sums
    (vLLM's MoE runner with data parallelism 1), and the EP group's communicator is built as "ep:0". Rank 0's
    outputs are graded like the single-process runtime's; a rank whose outputs differ from rank 0's is named."""
    from conformance.checks.engine import models as engine_models
    from conformance.checks.engine.models import requests
    from conformance.checks.engine.oracle import grade, logprob_tolerance, oracle_logprobs
    from conformance.checks.engine.parallel import RanksFailed, run_ranks
    from conformance.checks.engine.runtime import PROMPT_BLOCK

    name, world, ep = unit.op, 2, unit.case == EP_CASE
    tol = logprob_tolerance(dtype, name)
    parallel = "tensor and expert parallelism" if ep else "tensor parallelism"
    where = (f"reference runtime (reference_impl.models) on the platform with tensor parallelism over {world} gloo "
             f"ranks{' and expert parallelism over the same ranks' if ep else ''}, {unit.dtype}, eager; {name} "
             f"({engine_models.MODELS[name].exercises})")
    with scratch_dirs.directory("engine") as tmp:
        checkpoint = engine_models.write_checkpoint(engine_models.MODELS[name], dtype, Path(tmp) / name)
        try:
            ranks = run_ranks(ctx.platform_name, checkpoint, unit.dtype, str(ctx.device), world, TP_TIMEOUT_S, ep)
        except RanksFailed as exc:
            outcome = {True: Outcome.CRASH, False: Outcome.TIMEOUT}.get(exc.crashed, Outcome.ERROR)
            return Verdict(outcome, f"{exc} [{where}]")
        reqs = requests(max(ranks[0]["block"], PROMPT_BLOCK))
        where += f"; the TP group's communicator: {ranks[0]['communicator']}"
        if ep:
            where += (", the EP group's too (built as ep:0); experts held: " + "; ".join(
                f"rank {r} {_span(doc['experts'])}" for r, doc in enumerate(ranks)) + ", their parts summed by the "
                "TP group's one all_reduce per MoE layer, as vLLM's MoE runner sums them")
        outputs = ranks[0]["outputs"]
        for rank, other in enumerate(ranks[1:], start=1):
            for req in reqs:
                mine, theirs = outputs[req.id]["tokens"], other["outputs"][req.id]["tokens"]
                if mine != theirs:
                    step = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine),
                                                                                                 len(theirs)))
                    return failed(f"the ranks disagree: rank {rank} generated other tokens than rank 0 for request "
                                  f"{req.id} (wave {req.wave}, prompt of {len(req.prompt)}) from step {step} (rank 0 "
                                  f"{mine[step:step + 3]}, rank {rank} {theirs[step:step + 3]}): a collective gives "
                                  f"the ranks different results; {_each_rank(ranks, reqs, req, checkpoint, tol)} "
                                  f"[{where}]")
        result = ModelResult(name, {}, grade(reqs, outputs, oracle_logprobs(checkpoint, reqs, outputs), tol))
    within, errs = _within(result, tol)
    if result.grade.divergences:
        return failed(f"the runtime with {parallel} leaves the float64 reference (teacher-forced on its "
                      f"tokens, logprob tolerance {tol:.3g}; every rank generated the same tokens): {name}: "
                      f"{result.grade.divergences[0].line()} [{where}]", **errs)
    return passed(f"{within}; all {world} ranks generated the same tokens [{where}]", **errs)


def _each_rank(ranks: list[dict], reqs, req, checkpoint: Path, tol: float) -> str:
    """Which ranks leave the float64 reference, each graded on its own tokens, and which leaves it first on `req`
    (the request the ranks disagree on): once the ranks' tokens differ, every collective mixes their states and the
    others follow a step later, so the first is the rank whose collective result was wrong."""
    from conformance.checks.engine.oracle import grade, oracle_logprobs

    said, first = [], {}
    for rank, doc in enumerate(ranks):
        g = grade(reqs, doc["outputs"], oracle_logprobs(checkpoint, reqs, doc["outputs"]), tol)
        said.append(f"rank {rank} leaves it: {g.divergences[0].line()}" if g.divergences else
                    f"rank {rank} matches it")
        step = next((d.step for d in g.divergences if d.request.id == req.id), None)
        if step is not None:
            first[rank] = step
    text = f"each rank against the float64 reference (logprob tolerance {tol:.3g}): {'; '.join(said)}"
    if first and len(set(first.values())) == len(first):
        rank = min(first, key=first.get)
        text += f"; the first to leave it on request {req.id}: rank {rank}, at step {first[rank]}"
    return text


def _span(experts: list[int]) -> str:
    """'experts 0-1' (a rank's experts are one contiguous range), or the list."""
    if experts and experts == list(range(experts[0], experts[-1] + 1)):
        return f"experts {experts[0]}-{experts[-1]}" if len(experts) > 1 else f"expert {experts[0]}"
    return f"experts {experts}"


def _within(result: ModelResult, tol: float) -> tuple[str, dict]:
    """What both paths' PASS says of a graded model (positions, worst error, binding greedy tokens), and the
    verdict's error fields."""
    g = result.grade
    said = (f"{g.positions} generated positions ({result.model}) within logprob tolerance {tol:.3g} of the float64 "
            f"reference (worst {g.worst_err:.3g}); greedy tokens binding at {g.greedy_positions} of them")
    return said, {"max_abs_err": g.worst_err, "err_to_tol": g.worst_err / tol if tol else None}


def _alone(model, req, checkpoint: Path, device, tol: float) -> str:
    """Whether the diverging request, generated by itself, matches the oracle (then the batch is involved)."""
    from conformance.checks.common import call_impl
    from conformance.checks.engine.models import Request
    from conformance.checks.engine.oracle import grade, oracle_logprobs
    from conformance.checks.engine.runtime import generate_waves

    alone = [Request(req.id, 0, req.prompt, req.max_tokens)]
    outputs = call_impl("the diverging request alone", generate_waves, model, alone, device)
    g = grade(alone, outputs, oracle_logprobs(checkpoint, alone, outputs), tol)
    if g.divergences:
        return (f"generated alone it still diverges at step {g.divergences[0].step}: the model path itself (a kernel, "
                "a layer or the attention backend), not the batch")
    return "generated alone it matches the oracle: involved: the batch composition (state kept across rows or requests)"


# ----- explaining a divergence ----------------------------------------------------------------------
VARIANTS = (  # name, what the rerun changes, how the verdict says it changes the result
    ("alone", "the request alone in a fresh engine", "the batch composition"),
    ("no_chunked_prefill", "the batch without chunked prefill", "chunked prefill"),
    ("no_prefix_caching", "the batch without prefix caching", "prefix caching"),
)


def _explain(proc, result: ModelResult, checkpoint: Path, dtype_text: str, compiled: bool, dtype) -> str:
    """Rerun the diverging request alone and the batch without each feature in the unit's engine process `proc`;
    which rerun matches the oracle."""
    from conformance.checks.engine import models as engine_models
    from conformance.checks.engine.oracle import grade, logprob_tolerance, oracle_logprobs

    div = result.grade.divergences[0]
    req = div.request
    alone = [[{"id": req.id, "prompt": list(req.prompt), "max_tokens": req.max_tokens}]]
    runs = [base_run("alone", checkpoint, dtype_text, compiled, waves=alone),
            base_run("no_chunked_prefill", checkpoint, dtype_text, compiled, chunked_prefill=False),
            base_run("no_prefix_caching", checkpoint, dtype_text, compiled, prefix_caching=False)]
    try:
        doc = proc.run(runs, JOB_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - the engine process died or went silent (it carries `crashed`)
        if not isinstance(getattr(exc, "crashed", None), bool):
            raise
        return f"the reruns that would say which feature is involved did not finish: {exc}"
    said, changed = [], []
    for (name, what, feature), run in zip(VARIANTS, doc["runs"]):
        if "error" in run:
            said.append(f"{what}: the engine raised {run['error'].splitlines()[0]}")
            continue
        reqs = [r for r in engine_models.from_json(run["waves"]) if r.id == req.id]
        outputs = {o["id"]: o for o in run["outputs"]}
        tol = logprob_tolerance(dtype, result.model)
        g = grade(reqs, outputs, oracle_logprobs(checkpoint, reqs, outputs), tol)
        if g.divergences:
            said.append(f"{what}: still diverges at step {g.divergences[0].step}")
        else:
            said.append(f"{what}: matches the oracle")
            changed.append(feature)
    if changed:
        verdict = f"involved: {' and '.join(changed)} (without it the request matches)"
    else:
        verdict = ("no feature changes it: the request diverges alone, without chunked prefill and without prefix "
                   "caching (the model path itself)")
    return f"{verdict}; reruns: {'; '.join(said)}"


# ----- the verdict ----------------------------------------------------------------------------------
def _where(unit: Unit) -> str:
    from conformance.checks.engine.models import MODELS, TOKEN_BUDGET

    ranks = (" (tensor_parallel_size=2: a worker process per rank, vLLM's multiprocessing executor, the collectives "
             "through the platform's device communicator; the tokens and logprobs are rank 0's)"
             if unit.case in PARALLEL_CASES else "")
    if unit.case == EP_CASE:
        ranks = ranks[:-1] + ("; enable_expert_parallel=True: each rank holds half the experts, the EP group's "
                              "communicator built as ep:0)")
    return (f"vLLM LLM engine, {unit.dtype}, {unit.case}{ranks}, chunked prefill at {TOKEN_BUDGET} tokens a step and "
            f"prefix caching; model {unit.op} ({MODELS[unit.op].exercises})")


def _shutdown_note(result: ModelResult) -> str:
    """vLLM's engine shutdown raising after every request finished: said, not graded (engine_runner._shut_down)."""
    if not result.shutdown_error:
        return ""
    return (f"; vLLM's engine shutdown raised after the requests finished ({result.shutdown_error}; not graded)")


def _verdict(platform, result: ModelResult, doc: dict, dtype, unit: Unit) -> Verdict:
    """The unit's verdict, with whose code its outcome is about where the engine observed it (whose.py)."""
    from conformance.checks.engine.contracts import EngineError, contract_of
    from conformance.checks.engine.oracle import logprob_tolerance
    from conformance.checks.engine.whose import Whose

    tol = logprob_tolerance(dtype, result.model)
    facts = result.facts or {}
    observed = (facts.get("platform_facts") or result.report.get("platform") or {}).get("class")
    whose = Whose(platform, observed)
    ranks = facts.get("tensor_parallel_size", 1)
    ep = ", expert parallel" if facts.get("enable_expert_parallel") else ""
    engine = (f"vLLM {doc.get('vllm')} on {facts.get('platform') or observed or 'its platform'}, KV block "
              f"{facts.get('block_size', '?')}{f', {ranks} ranks' if ranks != 1 else ''}{ep}; {_where(unit)}"
              f"{_shutdown_note(result)}")
    if result.error is not None:
        error = EngineError.from_report(result.report)
        contract = contract_of(error)
        origin, raised = whose.of_error(error, contract)
        first, _, rest = result.error.strip().partition("\n")
        said = f"{raised}; {contract.describe(error)}" if contract is not None else raised
        if result.report.get("worker_deaths"):     # the engine's raise then only says it was cancelled
            said += f"; a worker process died: {result.report['worker_deaths']}"
        return Verdict(Outcome.ERROR, f"vLLM's engine raised on model {result.model}: {first} ({said}) [{engine}]"
                       + (f"\n{rest}" if rest else ""), origin=origin.to_json())
    within, errs = _within(result, tol)
    if result.grade.divergences:
        computed = [tuple(c) for c in facts.get("computed", [])]
        origin, computed_by = whose.of_computation(computed)
        lines = [d.line() for d in result.grade.divergences]
        return failed(f"the engine leaves the float64 reference (teacher-forced on the engine's tokens, logprob "
                      f"tolerance {tol:.3g}): {result.model}: {lines[0]}; {result.explanation}"
                      + (f"; other requests: {' | '.join(lines[1:])}" if len(lines) > 1 else "")
                      + f" [{engine}; {computed_by}]", origin=origin.to_json(), **errs)
    hits = ", ".join(f"request {i} {n} tokens" for i, n in sorted(result.prefix_hits.items()))
    note = (f"prefix cache hits: {hits}" if hits else
            "the engine served no request from the prefix cache, so prefix caching was not exercised")
    return passed(f"{within}; {note} [{engine}]", **errs)
