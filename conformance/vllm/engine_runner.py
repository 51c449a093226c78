"""`python -m conformance.vllm.engine_runner`: vLLM's `LLM` engine on the platform vLLM resolves here, run on the
requests of the jobs it reads from stdin, with every generated token's logprobs written where each job says (JSON).

The `engine` family (conformance/checks/engine/) has it started, through the bridge's platform
(conformance/vllm/platform.py), in a process of its own, so an engine that crashes or hangs costs that one result.
The engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): no further processes to leak; the process
stays up between jobs, so a diagnosis pays vLLM's import once. A job lists runs; each run is one engine (model,
dtype, eager or compiled, chunked prefill and prefix caching on or off) and its waves of requests, submitted one
`generate` call per wave so that a later wave meets the prefix cache the earlier ones filled. The waves are a list,
or `{"by_block_size": {"128": waves, ...}}`: the family's requests laid out for each KV block size an engine may
choose, of which the run takes the one for the block size its engine chose. A job's results file is rewritten after
every run, so the runs that finished before a crash are kept. Token ids go in directly (`skip_tokenizer_init`): the
checkpoints have no tokenizer.

Besides the tokens, a run records what the engine observed about whose code ran, for the family's attribution
(conformance/checks/engine/whose.py): the platform vLLM resolved (its class, whether it is out of tree, whether its
device name is a torch device type, the layers registered out of tree), the code that computed the model (its
attention backend, impl and builder classes, every CustomOp's class and dispatched forward, the `vllm.ir`
implementations dispatched), and for a run that raised, the frames of the raise (module and qualified name) and what
the log says of a worker process that died meanwhile (worker_deaths.py: on 2 ranks the engine itself then only
raises "cancelled").
This module never imports the harness's checks (docs/architecture.md: the bridge runs no check).
"""

from __future__ import annotations

import contextlib
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
    tp = int(run.get("tensor_parallel_size", 1))
    if tp == 1:
        return LLM(**kwargs)
    # one worker process per rank (vLLM's multiprocessing executor), collectives through the platform's communicator;
    # expert parallelism splits a MoE model's experts over the same ranks (vLLM's "ep" group)
    kwargs.update(tensor_parallel_size=tp, distributed_executor_backend="mp")
    if run.get("expert_parallel"):
        kwargs.update(enable_expert_parallel=True)
    with _cpu_threads_bound(tp):
        return LLM(**kwargs)


@contextlib.contextmanager
def _cpu_threads_bound(ranks: int):
    """While the ranks start: vLLM's CPU worker binds each rank's OpenMP threads to cores (VLLM_CPU_OMP_THREADS_BIND);
    its default ('auto') wants a NUMA node per rank and refuses to start 2 ranks on a one-node machine. Unless the user
    set it, each rank gets its own share of this process's cores ('0|1' on 2 cores); the next engine of this process
    (one rank) starts without it. Other platforms do not read it."""
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        yield
        return
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // ranks)
    parts = [cores[r * share:(r + 1) * share] or cores[-1:] for r in range(ranks)]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, p)) for p in parts)
    try:
        yield
    finally:
        del os.environ["VLLM_CPU_OMP_THREADS_BIND"]


def _facts(llm) -> dict:
    """What the engine chose for itself: its KV block size and the platform class that ran it."""
    from vllm.platforms import current_platform

    config = llm.llm_engine.vllm_config
    cls = type(current_platform)
    return {"block_size": int(config.cache_config.block_size), "platform": f"{cls.__module__}.{cls.__qualname__}",
            "compilation_mode": str(config.compilation_config.mode),
            "tensor_parallel_size": int(config.parallel_config.tensor_parallel_size),
            "enable_expert_parallel": bool(getattr(config.parallel_config, "enable_expert_parallel", False))}


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
    facts["platform_facts"] = platform_facts()
    waves = _waves_for(run["waves"], facts["block_size"])
    outputs = []
    with _recording_ir_dispatch() as dispatched:
        for wave in waves:
            outputs += _wave(llm, wave)
    computed = {tuple(c) for c in llm.apply_model(_computing_code)[0]} | {_code_name(f) for f in dispatched}
    facts["computed"] = [list(c) for c in sorted(computed)]
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


def _waves_for(waves, block_size: int) -> list[list[dict]]:
    """The run's waves: a list as given, or from `{"by_block_size": {...}}` the layout for the engine's block size."""
    if isinstance(waves, list):
        return waves
    layouts = waves["by_block_size"]
    if str(block_size) not in layouts:
        raise RuntimeError(f"the engine chose KV blocks of {block_size} tokens, and the requests were laid out for "
                           f"blocks of {', '.join(sorted(layouts, key=int))} tokens only: add {block_size} to the "
                           "engine family's BLOCK_SIZES (conformance/checks/engine/models.py)")
    return layouts[str(block_size)]


def _code_name(obj) -> tuple[str, str]:
    """(module, qualified name) of a class or function (a bound method: its function)."""
    obj = getattr(obj, "__func__", obj)
    module = getattr(obj, "__module__", None) or "?"
    return module, getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj))


def _computing_code(model) -> list[tuple[str, str]]:
    """Run on the model inside vLLM's worker: (module, qualified name) of what computes it: every CustomOp's class and
    the forward vLLM dispatched it to, and every attention layer's backend, impl and metadata builder classes."""
    from vllm.model_executor.custom_op import CustomOp

    names = set()
    for module in model.modules():
        if isinstance(module, CustomOp):
            names.add(_code_name(type(module)))
            forward = getattr(module, "_forward_method", None)
            if forward is not None:
                names.add(_code_name(forward))
        backend = getattr(module, "attn_backend", None)
        impl = getattr(module, "impl", None)
        if backend is not None and impl is not None:
            names.update({_code_name(backend), _code_name(type(impl))})
            builder = getattr(backend, "get_builder_cls", None)
            if builder is not None:
                names.add(_code_name(builder()))
    return sorted(names)


class _recording_ir_dispatch:
    """Within: every `vllm.ir` implementation the engine dispatched to (its impl_fn), gathered in a set; vLLM's
    `IrOp.dispatch` is wrapped for the duration and restored after."""

    def __enter__(self) -> set:
        from vllm.ir.op import IrOp

        self.seen: set = set()
        self.original = IrOp.dispatch
        original, seen = self.original, self.seen

        def dispatch(op, *args, **kwargs):
            impl = original(op, *args, **kwargs)
            seen.add(impl.impl_fn)
            return impl

        IrOp.dispatch = dispatch
        return self.seen

    def __exit__(self, *exc) -> None:
        from vllm.ir.op import IrOp

        IrOp.dispatch = self.original


def platform_facts() -> dict:
    """What the engine family's contract table and attribution need to know of the platform vLLM resolved here
    (asked after a run, and after a run that raised): its class, whether it is out of tree, its device name and whether
    that is a torch device type (vLLM builds an out-of-tree platform's devices as
    torch.device(f"{device_name}:{rank}")), and the layer names registered out of tree (`CustomOp.register_oot`)."""
    import torch
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.platforms import current_platform

    cls = type(current_platform)
    try:
        torch.device(f"{current_platform.device_name}:0")
        device_ok = True
    except RuntimeError:
        device_ok = False
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "out_of_tree": bool(current_platform.is_out_of_tree()),
            "device_name": str(current_platform.device_name), "device_name_is_torch_device": device_ok,
            "oot_layers": sorted(op_registry_oot)}


def error_report(run: dict, exc: BaseException) -> dict:
    """A run that raised: the exception (its root cause, where one is chained: the frames are the root's), the last
    frames as text, every frame of the raise as [module, qualified name] outermost first, and the platform's facts."""
    root = exc
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    text = f"{type(exc).__name__}: {exc}"
    if root is not exc:
        text += f" (caused by {type(root).__name__}: {root})"
    frames = [[frame.f_globals.get("__name__", "?"), getattr(frame.f_code, "co_qualname", frame.f_code.co_name)]
              for frame, _ in traceback.walk_tb(root.__traceback__)]
    lines = traceback.format_exception(type(root), root, root.__traceback__)
    try:
        facts = platform_facts()
    except Exception as facts_exc:  # noqa: BLE001 - the report goes on without them
        facts = {"unavailable": f"{type(facts_exc).__name__}: {facts_exc}"}
    return {"name": run["name"], "error": text, "error_type": type(root).__name__, "error_message": str(root),
            "traceback": "".join(lines[-6:]), "frames": frames, "platform": facts}


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


# AF_UNIX's limit on a socket's path (108 bytes with the terminating zero), and what vLLM adds to its base: "/" + a uuid4
_SOCKET_PATH_MAX = 107
_VLLM_SOCKET_NAME = 37


def _contain_vllms_sockets() -> None:
    """vLLM's ZMQ sockets (a tensor-parallel engine's message queues, 8 an engine) go to a scratch directory of this
    process instead of the temporary directory, where vLLM leaves them after a clean shutdown (seen with 0.32); the
    directory goes when this process exits, or with the next run's start when it was killed. A
    `VLLM_RPC_BASE_PATH` of the user's is kept, and so is vLLM's default where the directory's path would make a
    socket's path too long."""
    if os.environ.get("VLLM_RPC_BASE_PATH"):
        return
    import tempfile

    from conformance import scratch_dirs

    if len(tempfile.gettempdir()) + 1 + scratch_dirs.name_length("vllm-rpc") + _VLLM_SOCKET_NAME > _SOCKET_PATH_MAX:
        return
    os.environ["VLLM_RPC_BASE_PATH"] = scratch_dirs.new_directory("vllm-rpc", remove_at_exit=True)


def serve() -> int:
    """Answer jobs from stdin until it closes: each line is {"runs": [...], "out": path}; the results go to that path
    (rewritten after every run) and the line `done` to the protocol stream (the original stdout; vLLM's own output
    goes to stderr)."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _die_with_parent()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    _contain_vllms_sockets()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import vllm

    from conformance.vllm.worker_deaths import stderr_offset, worker_deaths

    protocol.write("ready\n")
    protocol.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        out = Path(job["out"])
        doc = {"vllm": str(vllm.__version__), "runs": []}
        for run in job["runs"]:
            offset = stderr_offset()
            try:
                doc["runs"].append(run_one(run))
            except Exception as exc:  # noqa: BLE001 - reported to the check, which names the run and the contract
                report = error_report(run, exc)
                died = worker_deaths(offset)     # a rank's worker that died shows here only as "cancelled"
                if died:
                    report["worker_deaths"] = died
                doc["runs"].append(report)
            out.write_text(json.dumps(doc))
        protocol.write("done\n")
        protocol.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
