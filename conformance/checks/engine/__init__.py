"""Engine family: the whole platform through vLLM's own `LLM` engine (its worker, model runner, KV-cache manager,
attention backend, sampler and kernels together), against the reference runtime as the oracle.

Under `--platform=vllm` a unit is one dtype and one mode (eager, every model; compiled, at the full level, one
model a unit): tiny random checkpoints of the models in `models.MODELS` are written by transformers'
`save_pretrained`, and one engine process (conformance/vllm/engine_process.py) runs each model's fixed requests
through an engine with chunked prefill forced (a token budget below the longest prompt) and prefix caching on, greedily, asking for logprobs. The
oracle (oracle.py) is the reference decoder on native everything in float64, teacher-forced on the engine's
tokens. A divergence is located (model, request, step) and then explained: the same engine process reruns that
request alone, and the batch without chunked prefill and without prefix caching, and the verdict says which of
them makes it match. On a platform written against our own API the units run the reference runtime
(`reference_impl.models`) on the platform instead, graded by the same oracle (runtime.py). The family
has no units at the quick level: an engine costs tens of seconds.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

from conformance.checks.common import CheckContext, Verdict, failed, passed, unit_dtype
from conformance.checks.record import check
from conformance.collect.inventory import Inventory
from conformance.collect.units import Unit, dtype_name
from conformance.results.result import Outcome

CASES = ("eager", "compiled")
STANDARD_DTYPES = ("float32", "bfloat16")     # the full level: every dtype the platform supports
JOB_TIMEOUT_S = 300.0                          # one job of the engine process; the per-check limit usually ends first
# The reruns that explain a divergence take three more engines (about 15 s on an idle 2-core machine); past this
# much of the unit they are left out, so a loaded machine reports the divergence (FAIL) rather than a TIMEOUT of the
# default 120 s per-check limit.
EXPLAIN_WITHIN_S = 70.0


def is_vllm_platform(platform) -> bool:
    from conformance.vllm.platform import VllmPlatform

    return isinstance(platform, VllmPlatform)


def engine_units(inventory: Inventory, family: str, check_name: str, level: str) -> list[Unit]:
    """Standard: float32 and bfloat16 eager (every model in one unit); full: every dtype eager, and under the vLLM
    bridge compiled per model (op = the model). On other platforms the units run the reference runtime on them."""
    from conformance.checks.engine.oracle import tolerances

    if level == "quick":
        return []
    dtypes = [dtype_name(d) for d in inventory.dtypes_for(tolerances())]
    if level == "standard":
        dtypes = [d for d in dtypes if d in STANDARD_DTYPES]
    units = [Unit(family, check_name, None, None, d, "eager") for d in dtypes]
    if not is_vllm_platform(inventory.platform):   # the reference runtime on it (runtime.py): eager only,
        return units                                # model.decoder compiles the runtime's decoder
    if level == "full":   # vLLM compiles each model for a minute or more on 2 cores: one unit per model
        units += [Unit(family, check_name, m, None, d, "compiled") for d in dtypes for m in _models()]
    return units


def _models() -> list[str]:
    from conformance.checks.engine.models import MODELS

    return list(MODELS)


def base_run(name: str, checkpoint: Path, dtype: str, compiled: bool, **changes) -> dict:
    """The engine_runner run dict of the family's configuration: chunked prefill and prefix caching on."""
    from conformance.checks.engine.models import MAX_MODEL_LEN, TOKEN_BUDGET

    run = dict(name=name, model=str(checkpoint), dtype=dtype, compiled=compiled, chunked_prefill=True,
               prefix_caching=True, token_budget=TOKEN_BUDGET, max_model_len=MAX_MODEL_LEN, max_num_seqs=8,
               waves="fixed")
    run.update(changes)
    return run


@dataclasses.dataclass
class ModelResult:
    """One model's engine run graded: the grade or the engine's error, and what the run exercised."""

    model: str
    facts: dict
    grade: object | None = None
    error: str | None = None
    explanation: str | None = None
    prefix_hits: dict[int, int] = dataclasses.field(default_factory=dict)
    shutdown_error: str | None = None


@check("engine", "generate", units=engine_units)
def generate(ctx: CheckContext, unit: Unit) -> Verdict:
    from conformance.checks.engine import models as engine_models
    from conformance.vllm.engine_process import EngineFailed, EngineProcess

    if unit.case not in CASES:
        return Verdict(Outcome.ERROR, f"engine case {unit.case!r} is not one of {CASES}")
    dtype = unit_dtype(unit)
    if not is_vllm_platform(ctx.platform):
        return _on_runtime(ctx, unit, dtype)
    compiled = unit.case == "compiled"
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="conformance-engine-") as tmp:
        work = Path(tmp)
        if unit.op is not None and unit.op not in engine_models.MODELS:
            return Verdict(Outcome.ERROR, f"engine model {unit.op!r} is not one of {tuple(engine_models.MODELS)}")
        names = [unit.op] if unit.op is not None else engine_models.models_at(ctx.level)
        checkpoints = {name: engine_models.write_checkpoint(engine_models.MODELS[name], dtype, work / name)
                       for name in names}
        try:
            with EngineProcess(work) as engine:
                runs = [base_run(name, path, unit.dtype, compiled) for name, path in checkpoints.items()]
                doc = engine.run(runs, JOB_TIMEOUT_S)
                results = [_grade_run(run, checkpoints[run["name"]], dtype) for run in doc["runs"]]
                first = next((r for r in results if r.grade is not None and r.grade.divergences), None)
                spent = time.monotonic() - start
                if first is not None and spent > EXPLAIN_WITHIN_S:
                    first.explanation = ("the reruns that say which feature is involved were left out: the unit had "
                                         f"already run more than {EXPLAIN_WITHIN_S:g} s (a loaded machine?)")
                elif first is not None:
                    first.explanation = _explain(engine, first, checkpoints[first.model], unit.dtype, compiled, dtype)
        except EngineFailed as exc:
            outcome = Outcome.CRASH if exc.crashed else Outcome.TIMEOUT
            return Verdict(outcome, f"{exc} [{_where(unit, names)}]")
    return _verdict(results, doc, dtype, unit, names)


def _grade_run(run: dict, checkpoint: Path, dtype) -> ModelResult:
    from conformance.checks.engine import models as engine_models
    from conformance.checks.engine.oracle import grade, logprob_tolerance, oracle_logprobs

    if "error" in run:
        return ModelResult(run["name"], {}, error=f"{run['error']}\n{run.get('traceback', '')}")
    reqs = engine_models.from_json(run["waves"])
    outputs = {o["id"]: o for o in run["outputs"]}
    oracle = oracle_logprobs(checkpoint, reqs, outputs)
    result = ModelResult(run["name"], run["facts"], grade(reqs, outputs, oracle, logprob_tolerance(dtype)))
    result.prefix_hits = {o["id"]: o["cached_tokens"] for o in run["outputs"] if o["cached_tokens"]}
    result.shutdown_error = run.get("shutdown_error")
    return result


# ----- the reference runtime on a platform written against our API ---------------------------------
def _on_runtime(ctx: CheckContext, unit: Unit, dtype) -> Verdict:
    """Every model of the level through `reference_impl.models` on the platform, graded like vLLM's engine."""
    from conformance.checks.engine import models as engine_models
    from conformance.checks.common import call_impl
    from conformance.checks.engine.oracle import grade, logprob_tolerance, oracle_logprobs
    from conformance.checks.engine.runtime import build_for, family_requests, generate_waves
    from conformance.checks.model import NATIVE_ATTENTION, attention_refusal, exercised

    if unit.case != "eager" or unit.op is not None:
        return Verdict(Outcome.ERROR, f"engine unit {unit.op}/{unit.case} runs only under the vLLM bridge: the "
                       "reference runtime's units are eager, every model in one")
    tol = logprob_tolerance(dtype)
    results, used = [], []
    with tempfile.TemporaryDirectory(prefix="conformance-engine-") as tmp:
        for name in engine_models.models_at(ctx.level):
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
            used.append((name, ran))
            outputs = call_impl(f"{name} on the platform's runtime", generate_waves, model, reqs, ctx.device)
            result = ModelResult(name, {}, grade(reqs, outputs, oracle_logprobs(checkpoint, reqs, outputs), tol))
            if result.grade.divergences:
                result.explanation = _alone(model, result.grade.divergences[0].request, checkpoint, ctx.device, tol)
            results.append(result)
    where = (f"reference runtime (reference_impl.models) on the platform, {unit.dtype}, eager, each wave one packed "
             f"prefill then decode steps over the paged KV cache; "
             + "; ".join(f"{name} ({engine_models.MODELS[name].exercises}): {ran.describe()}" for name, ran in used))
    if not any(ran.anything for _, ran in used):
        return Verdict(Outcome.NOT_IMPLEMENTED, "the runtime ran entirely on native implementations: the platform "
                       f"brings none of the IR ops, layers or attention backend the models use [{where}]")
    within, errs = _within(results, tol)
    diverged = [r for r in results if r.grade.divergences]
    if diverged:
        r = diverged[0]
        also = [f"{o.model}: {len(o.grade.divergences)} request(s) diverge" for o in diverged[1:]]
        return failed(f"the runtime on the platform leaves the float64 reference (teacher-forced on its tokens, "
                      f"logprob tolerance {tol:.3g}): {r.model}: {r.grade.divergences[0].line()}; {r.explanation}"
                      + (f"; also {'; '.join(also)}" if also else "") + f" [{where}]", **errs)
    return passed(f"{within} [{where}]", **errs)


def _within(results: list[ModelResult], tol: float) -> tuple[str, dict]:
    """What both paths' PASS says of graded results (positions, worst error, binding greedy tokens), and the
    verdict's error fields."""
    worst = max((r.grade.worst_err for r in results), default=0.0)
    graded = sum(r.grade.positions for r in results)
    binding = sum(r.grade.greedy_positions for r in results)
    said = (f"{graded} generated positions ({', '.join(r.model for r in results)}) within logprob tolerance {tol:.3g} "
            f"of the float64 reference (worst {worst:.3g}); greedy tokens binding at {binding} of them")
    return said, {"max_abs_err": worst, "err_to_tol": worst / tol if tol else None}


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


def _explain(engine, result: ModelResult, checkpoint: Path, dtype_text: str, compiled: bool, dtype) -> str:
    """Rerun the diverging request alone and the batch without each feature; which rerun matches the oracle."""
    from conformance.checks.engine import models as engine_models
    from conformance.checks.engine.oracle import grade, logprob_tolerance, oracle_logprobs
    from conformance.vllm.engine_process import EngineFailed

    div = result.grade.divergences[0]
    req = div.request
    alone = [[{"id": req.id, "prompt": list(req.prompt), "max_tokens": req.max_tokens}]]
    runs = [base_run("alone", checkpoint, dtype_text, compiled, waves=alone),
            base_run("no_chunked_prefill", checkpoint, dtype_text, compiled, chunked_prefill=False),
            base_run("no_prefix_caching", checkpoint, dtype_text, compiled, prefix_caching=False)]
    try:
        doc = engine.run(runs, JOB_TIMEOUT_S)
    except EngineFailed as exc:
        return f"the reruns that would say which feature is involved did not finish: {exc}"
    said, changed = [], []
    for (name, what, feature), run in zip(VARIANTS, doc["runs"]):
        if "error" in run:
            said.append(f"{what}: the engine raised {run['error'].splitlines()[0]}")
            continue
        reqs = [r for r in engine_models.from_json(run["waves"]) if r.id == req.id]
        outputs = {o["id"]: o for o in run["outputs"]}
        g = grade(reqs, outputs, oracle_logprobs(checkpoint, reqs, outputs), logprob_tolerance(dtype))
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
def _where(unit: Unit, names: list[str]) -> str:
    from conformance.checks.engine.models import MODELS, TOKEN_BUDGET

    models = ", ".join(f"{m.name} ({m.exercises})" for m in MODELS.values()
                       if (unit.op is None and m.name in names) or unit.op == m.name)
    return (f"vLLM LLM engine, {unit.dtype}, {unit.case}, chunked prefill at {TOKEN_BUDGET} tokens a step and "
            f"prefix caching; models {models}")


def _shutdown_note(results: list[ModelResult]) -> str:
    """vLLM's engine shutdown raising after every request finished: said, not graded (engine_runner._shut_down)."""
    raised = [r for r in results if r.shutdown_error]
    if not raised:
        return ""
    return (f"; vLLM's engine shutdown raised after the requests finished ({', '.join(r.model for r in raised)}: "
            f"{raised[0].shutdown_error}; not graded)")


def _verdict(results: list[ModelResult], doc: dict, dtype, unit: Unit, names: list[str]) -> Verdict:
    from conformance.checks.engine.oracle import logprob_tolerance

    tol = logprob_tolerance(dtype)
    facts = next((r.facts for r in results if r.facts), {})
    engine = (f"vLLM {doc.get('vllm')} on {facts.get('platform', 'its platform')}, KV block "
              f"{facts.get('block_size', '?')}; {_where(unit, names)}{_shutdown_note(results)}")
    within, errs = _within([r for r in results if r.grade is not None], tol)
    errors = [r for r in results if r.error is not None]
    diverged = [r for r in results if r.grade is not None and r.grade.divergences]
    if diverged:
        r = diverged[0]
        lines = [f"{r.model}: {d.line()}" for d in r.grade.divergences]
        others = [f"{o.model}: {len(o.grade.divergences)} request(s) diverge" for o in diverged[1:]]
        return failed(f"the engine leaves the float64 reference (teacher-forced on the engine's tokens, logprob "
                      f"tolerance {tol:.3g}): {lines[0]}; {r.explanation}"
                      + (f"; other requests of {r.model}: {' | '.join(lines[1:])}" if len(lines) > 1 else "")
                      + (f"; also {'; '.join(others)}" if others else "")
                      + "".join(f"; the engine raised for {e.model}: {e.error.strip().splitlines()[0]}" for e in errors)
                      + f" [{engine}]", **errs)
    if errors:
        first = errors[0].error.strip().splitlines()
        return Verdict(Outcome.ERROR, f"vLLM's engine raised on model {errors[0].model}: {first[0]}"
                       + (f" (also on {', '.join(e.model for e in errors[1:])})" if len(errors) > 1 else "")
                       + f" [{engine}]\n" + "\n".join(first[1:]))
    hits = "; ".join(f"{r.model} " + ", ".join(f"request {i} {n} tokens" for i, n in sorted(r.prefix_hits.items()))
                     for r in results if r.prefix_hits)
    note = (f"prefix cache hits: {hits}" if hits else
            "the engine served no request from the prefix cache, so prefix caching was not exercised")
    return passed(f"{within}; {note} [{engine}]", **errs)
