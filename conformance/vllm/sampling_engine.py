"""`python -m conformance.vllm.sampling_engine`: the engine process of the `sampling` family's engine units, on the
engine runner's protocol (conformance/vllm/engine_runner.py: jobs on stdin, a results file per job, killed with its
parent), with runs that carry per-request sampling parameters, a logprobs mode and a speculative config.

A run: {"name", "model", "dtype", "max_model_len", "max_num_seqs", "logprobs_mode", "speculative" (vLLM's
speculative_config or None), "tokenizer" (optional, default false: load the checkpoint's tokenizer, which bad_words
need; without it the engine starts with skip_tokenizer_init), "waves": [[{"id", "prompt", "max_tokens", "logprobs",
"sampling": {SamplingParams keyword arguments}}]]}. Each wave is one `generate` call; its answers are the tokens,
the finish reason and stop reason vLLM gave, and, per generated position, the [token, logprob] pairs vLLM returned;
a wave that raises ends the run's waves (`wave_error`: the engine runner's error report and the wave's index), the
answers of the waves before it kept. This module never imports the harness's checks.
"""

from __future__ import annotations

import sys
import time

from conformance.vllm import engine_runner


def run_one(run: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = LLM(model=run["model"], skip_tokenizer_init=not run.get("tokenizer", False), dtype=run["dtype"], seed=0,
              enforce_eager=True, max_model_len=run["max_model_len"], max_num_seqs=run["max_num_seqs"],
              kv_cache_memory_bytes=engine_runner.KV_CACHE_BYTES, logprobs_mode=run["logprobs_mode"],
              speculative_config=run.get("speculative"))
    facts = engine_runner._facts(llm)
    facts["platform_facts"] = engine_runner.platform_facts()
    waves, wave_error = [], None
    for wave in run["waves"]:
        prompts = [TokensPrompt(prompt_token_ids=list(r["prompt"])) for r in wave]
        params = [SamplingParams(max_tokens=r["max_tokens"], logprobs=r.get("logprobs"), ignore_eos=True,
                                 detokenize=False, **_sampling(r)) for r in wave]
        try:
            outs = llm.generate(prompts, params, use_tqdm=False)
        except Exception as exc:  # noqa: BLE001 - the waves before it are kept; the check reports the raise
            wave_error = engine_runner.error_report(run, exc)
            wave_error["wave"] = len(waves)
            break
        answers = []
        for request, out in zip(wave, outs):
            done = out.outputs[0]
            steps = [[[int(t), float(lp.logprob)] for t, lp in (d or {}).items()] for d in (done.logprobs or [])]
            stop_reason = done.stop_reason if isinstance(done.stop_reason, (int, str)) else None
            answers.append({"id": request["id"], "tokens": [int(t) for t in done.token_ids], "logprobs": steps,
                            "finish_reason": done.finish_reason, "stop_reason": stop_reason})
        waves.append(answers)
    shutdown_error = engine_runner._shut_down(llm)
    del llm
    import gc

    gc.collect()
    return {"name": run["name"], "waves": waves, "facts": facts, "total_s": round(time.perf_counter() - start, 3),
            "shutdown_error": shutdown_error, "wave_error": wave_error}


def _sampling(request: dict) -> dict:
    """A request's SamplingParams arguments; JSON gave logit_bias string keys, vLLM takes token ids."""
    sampling = dict(request.get("sampling", {}))
    if "logit_bias" in sampling:
        sampling["logit_bias"] = {int(k): float(v) for k, v in sampling["logit_bias"].items()}
    return sampling


def main() -> int:
    engine_runner.run_one = run_one      # the runner's protocol, this module's runs
    return engine_runner.serve()


if __name__ == "__main__":
    sys.exit(main())
