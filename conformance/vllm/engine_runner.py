"""`python -m conformance.vllm.engine_runner`: vLLM's `LLM` engine on the platform vLLM resolves here, run on the
requests of the jobs it reads from stdin, with every generated token's logprobs written where each job says (JSON).

The `engine` family (conformance/checks/engine/) starts this in a process of its own, so an engine that crashes
or hangs costs that one result. The engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): no
further processes to leak; the process stays up between jobs, so a diagnosis pays vLLM's import once. A job lists
runs; each run is one engine (model, dtype, eager or compiled, chunked prefill and prefix caching on or off) and
its waves of requests, submitted one `generate` call per wave so that a later wave meets the prefix cache the
earlier ones filled; `"waves": "fixed"` asks for the family's fixed requests (conformance/checks/engine/models.py),
laid out for the KV block size the engine chose. A job's results file is rewritten after every run, so the runs
that finished before a crash are kept. Token ids go in directly (`skip_tokenizer_init`): the checkpoints have no tokenizer.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

KV_CACHE_BYTES = 64 << 20   # the tiny models need a few MiB; vLLM's CPU default takes half the machine's memory
PARENT_ENV = "CONFORMANCE_ENGINE_PARENT"   # the starting process's pid, checked after PR_SET_PDEATHSIG
LOGPROBS = 5                # top-k logprobs per generated position, besides the sampled token's own


def _engine(run: dict):
    from vllm import LLM

    chunked = bool(run["chunked_prefill"])
    kwargs = dict(model=run["model"], skip_tokenizer_init=True, dtype=run["dtype"], seed=0,
                  enforce_eager=not run["compiled"], max_model_len=run["max_model_len"],
                  enable_prefix_caching=bool(run["prefix_caching"]), enable_chunked_prefill=chunked,
                  max_num_batched_tokens=run["token_budget"] if chunked else run["max_model_len"],
                  max_num_seqs=run["max_num_seqs"], kv_cache_memory_bytes=KV_CACHE_BYTES)
    return LLM(**kwargs)


def _facts(llm) -> dict:
    """What the engine chose for itself: its KV block size and the platform class that ran it."""
    from vllm.platforms import current_platform

    config = llm.llm_engine.vllm_config
    cls = type(current_platform)
    return {"block_size": int(config.cache_config.block_size), "platform": f"{cls.__module__}.{cls.__qualname__}",
            "compilation_mode": str(config.compilation_config.mode)}


def _wave(llm, requests: list[dict]) -> list[dict]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=list(r["prompt"])) for r in requests]
    params = [SamplingParams(temperature=0.0, max_tokens=r["max_tokens"], logprobs=LOGPROBS, ignore_eos=True,
                             detokenize=False) for r in requests]
    outs = llm.generate(prompts, params, use_tqdm=False)
    answers = []
    for request, out in zip(requests, outs):
        done = out.outputs[0]
        steps = [sorted(([int(t), float(lp.logprob)] for t, lp in (d or {}).items()), key=lambda p: -p[1])
                 for d in (done.logprobs or [])]
        answers.append({"id": request["id"], "tokens": [int(t) for t in done.token_ids], "logprobs": steps,
                        "cached_tokens": int(out.num_cached_tokens or 0)})
    return answers


def run_one(run: dict) -> dict:
    """One engine: start it, run its waves in order, shut it down; the answers per request id."""
    start = time.perf_counter()
    llm = _engine(run)
    started = time.perf_counter() - start
    facts = _facts(llm)
    waves = run["waves"]
    if waves == "fixed":   # the family's fixed requests, laid out for the block size this engine chose
        from conformance.checks.engine import models as engine_models

        waves = engine_models.to_json(engine_models.requests(facts["block_size"]))
    outputs = []
    for wave in waves:
        outputs += _wave(llm, wave)
    shutdown_error = _shut_down(llm)
    del llm
    import gc

    gc.collect()
    return {"name": run["name"], "waves": waves, "outputs": outputs, "facts": facts, "start_s": round(started, 3),
            "total_s": round(time.perf_counter() - start, 3), "shutdown_error": shutdown_error}


def _shut_down(llm) -> str | None:
    """Shut the engine down; what it raised, if anything (kept apart from the grade: the requests had finished).

    vLLM 0.32's teardown (`cleanup_dist_env_and_memory`) ends with `torch.accelerator.empty_host_cache()` on every
    platform that is not `CpuPlatform`, which raises on an out-of-tree platform whose device is the CPU, after the
    distributed state is already torn down."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception as exc:  # noqa: BLE001 - reported with the run's results, not graded
        return f"{type(exc).__name__}: {exc}"
    finally:
        _disarm_exit_shutdown(llm)
    return None


def _disarm_exit_shutdown(llm) -> None:
    """vLLM's in-process client runs the same shutdown again when it is collected (a weakref finalizer): once is
    enough, and a second raise would only print a traceback."""
    finalizer = getattr(getattr(llm.llm_engine, "engine_core", None), "_finalizer", None)
    if finalizer is not None and hasattr(finalizer, "detach"):
        finalizer.detach()


def _platform_hint(exc: Exception) -> str | None:
    """What of vLLM 0.32's contract for an out-of-tree platform the error points at, when it is one of the two ways a
    CPU-derived platform plugin cannot start an engine (docs/vllm.md, the engine family); else None."""
    import torch
    from vllm.platforms import current_platform

    if not current_platform.is_out_of_tree():
        return None
    name = current_platform.device_name
    try:
        torch.device(f"{name}:0")
    except RuntimeError:
        return (f"the platform's device_name {name!r} is not a torch device type: vLLM builds an out-of-tree "
                f"platform's devices as torch.device(f'{{device_name}}:{{rank}}')")
    if "Sleep mode allocator is not available" in str(exc):
        return ("vLLM's CPUWorker, like its GPU worker, takes a sleep-mode allocator on every platform but CUDA, ROCm, "
                "XPU and CpuPlatform itself: an out-of-tree platform that reuses it needs a worker subclass whose "
                "_maybe_get_memory_pool_context returns a null context, set as parallel_config.worker_cls")
    return None


def _die_with_parent() -> None:
    """Be killed when the process that started this one dies (Linux), so a killed kernel worker leaves no engine."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    parent = os.environ.get(PARENT_ENV)
    if parent and os.getppid() != int(parent):   # the parent died before prctl took effect
        os._exit(1)


def serve() -> int:
    """Answer jobs from stdin until it closes: each line is {"runs": [...], "out": path}; the results go to that path
    (rewritten after every run) and the line `done` to the protocol stream (the original stdout; vLLM's own output
    goes to stderr)."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _die_with_parent()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import vllm

    protocol.write("ready\n")
    protocol.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        out = Path(job["out"])
        doc = {"vllm": str(vllm.__version__), "runs": []}
        for run in job["runs"]:
            try:
                doc["runs"].append(run_one(run))
            except Exception as exc:  # noqa: BLE001 - reported to the check, which names the run
                frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
                hint = _platform_hint(exc)
                doc["runs"].append({"name": run["name"], "error": f"{type(exc).__name__}: {exc}"
                                    + (f" ({hint})" if hint else ""), "traceback": "".join(frames[-6:])})
            out.write_text(json.dumps(doc))
        protocol.write("done\n")
        protocol.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
