"""The generation engines bench_generate.py --compare times on one checkpoint directory: the runtime,
transformers' `generate` and vLLM's offline engine (each when importable), greedy, no early stop.

Each engine's `run(prompts, new_tokens)` returns (prefill seconds, decode seconds): prefill is the
prompts' forward up to the first sampled token of every sequence, decode the `new_tokens - 1`
steps after it.
"""

from __future__ import annotations

import os
import time

import torch


class Ours:
    """The runtime: `load_checkpoint` (prepacked CPU GEMMs) and `generate` with its KV cache, eager."""

    name = "ours"

    def __init__(self, directory: str, dtype: torch.dtype):
        from reference_impl.models.checkpoint import load_checkpoint

        self.model = load_checkpoint(directory, dtype)

    def run(self, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
        from reference_impl.models import generate

        cache = self.model.allocate_kv_cache(len(prompts), max(map(len, prompts)) + new_tokens)
        out = generate(self.model, prompts, new_tokens, cache=cache)
        return out.prefill_seconds, out.decode_seconds


class Transformers:
    """transformers' `generate` (its own KV cache, SDPA attention); the first logits processor call marks
    the end of the prefill."""

    name = "transformers"

    def __init__(self, directory: str, dtype: torch.dtype):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()
        self.model.generation_config.eos_token_id = None
        self.model.generation_config.pad_token_id = 0

    def run(self, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
        from transformers import LogitsProcessor, LogitsProcessorList

        if len({len(p) for p in prompts}) != 1:
            raise ValueError("the transformers engine times prompts of one length (no padding)")
        marks: list[float] = []

        class Mark(LogitsProcessor):
            def __call__(self, input_ids, scores):
                marks.append(time.perf_counter())
                return scores

        ids = torch.tensor(prompts)
        start = time.perf_counter()
        with torch.no_grad():
            self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                                logits_processor=LogitsProcessorList([Mark()]))
        end = time.perf_counter()
        return marks[0] - start, end - marks[0]


class Vllm:
    """vLLM's offline engine (`LLM.generate` on token ids, no prefix caching, its default compilation);
    prefill from a 1-token run, decode as the rest of a `new_tokens` run.

    `all_cores=False` is vLLM's default placement: on x86 its CPU worker reserves one core for the engine-core
    process (on a 2-core machine the model runs on 1 thread); `all_cores=True` sets VLLM_CPU_NUM_OF_RESERVED_CPU=0,
    so its worker computes on every core, as ours does (the engine-core process then shares them)."""

    def __init__(self, directory: str, dtype: torch.dtype, max_len: int, max_seqs: int, all_cores: bool = True):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM

        self.name = "vLLM" if all_cores else "vLLM 1 core reserved"
        saved = os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU")
        if all_cores:   # read when the worker process starts, inside LLM(...)
            os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        try:
            self.llm = LLM(model=directory, dtype=str(dtype).removeprefix("torch."), skip_tokenizer_init=True,
                           enable_prefix_caching=False, max_model_len=max_len, max_num_seqs=max_seqs,
                           max_num_batched_tokens=max(max_len * max_seqs, 2048), seed=0)
        finally:
            if saved is None:
                os.environ.pop("VLLM_CPU_NUM_OF_RESERVED_CPU", None)
            else:
                os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = saved

    def _timed(self, prompts, tokens: int) -> float:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, detokenize=False)
        start = time.perf_counter()
        self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return time.perf_counter() - start

    def run(self, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
        prefill = self._timed(prompts, 1)
        return prefill, self._timed(prompts, new_tokens) - prefill


def importable(module: str) -> str | None:
    """None when `module` imports, else why not (one line)."""
    try:
        __import__(module)
    except Exception as exc:  # noqa: BLE001 - any failure means the engine is skipped, with the reason
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None
