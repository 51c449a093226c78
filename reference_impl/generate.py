"""`python -m reference_impl.generate`: run the reference decoder on a platform with a KV cache.

    python -m reference_impl.generate (--checkpoint DIR | --random tiny|small|moe) --platform NAME
        (--prompt TEXT | --prompt-ids 1,2,3 | --batch-file prompts.jsonl) --max-new-tokens N
        [--compile] [--tp N] [--dtype float32|float16|bfloat16] [--temperature T --top-k K --top-p P --min-p M --seed S]

Prints the generated tokens (and text, for text prompts), the provider selected for each IR op,
the forward each CustomOp layer class runs, the attention backend the platform selected (it reads and
writes the paged KV cache), and prefill / decode tokens per second; a progress bar
(stderr) for long runs. Text prompts go through the checkpoint's tokenizer.json (the `[text]`
extra, models/tokenizer.py). `--dtype` defaults to the checkpoint config's dtype (float32 for
--random). `--tp N` spawns N ranks on torch.distributed (gloo on the CPU, nccl on CUDA) that each
load their shard; rank 0 prints. On the CPU each rank computes on its share of the cores (this process's cores
over N, at least one thread; OMP_NUM_THREADS, where set, instead), as vLLM's CPU workers split them: N ranks of
all the cores' threads each oversubscribe the machine (a TP-2 decode on 2 cores ran 5x slower so). A batch file
holds one prompt per line: a JSON list of token ids, an object with "prompt_ids" or "prompt" (text), or a JSON
string (text). Bad arguments: one `error:` line and exit status 2. Nothing is ever downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from reference_impl.models.decoder_config import DecoderConfig

PRESETS = {
    "tiny": DecoderConfig(),
    "small": DecoderConfig(vocab_size=4096, hidden_size=384, intermediate_size=1024, num_layers=6, num_heads=6,
                           num_kv_heads=2, head_dim=64, max_position_embeddings=2048),
    "moe": DecoderConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2),
}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
COMPILE_BACKENDS = ("aot_eager", "inductor")
PROGRESS_MIN_STEPS = 32


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (`prog: error: ...`) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m reference_impl.generate",
                                description="Generate with the reference decoder (KV cache) on a platform.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", metavar="DIR", help="a local config.json + model.safetensors directory")
    src.add_argument("--random", choices=sorted(PRESETS), help="seeded random weights of a preset shape")
    p.add_argument("--weights-seed", type=int, default=0, help="seed of --random weights (default 0)")
    p.add_argument("--platform", default=None, help="platform name (default: the detected one)")
    p.add_argument("--prompt", metavar="TEXT", help="one text prompt (needs the checkpoint's tokenizer.json)")
    p.add_argument("--prompt-ids", metavar="IDS", help="comma-separated token ids of one prompt")
    p.add_argument("--batch-file", metavar="JSONL", help="one prompt per line: a list of ids, {\"prompt_ids\": "
                   "[...]}, {\"prompt\": \"text\"} or a JSON string")
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--compile", action="store_true", help="compile through ReferenceCompileBackend")
    p.add_argument("--compile-backend", choices=COMPILE_BACKENDS, default="aot_eager",
                   help="inner compiler of --compile (default aot_eager)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (default 1)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="default: the checkpoint config's dtype (float32 when it names none, and for --random)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k largest logits (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="sample from the nucleus of mass top-p (1: off)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens below min-p times the likeliest's probability (0: off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--stop-token-ids", metavar="IDS",
                   help="comma-separated ids ending a sequence (default: a checkpoint's eos_token_id, if any)")
    p.add_argument("--ignore-eos", action="store_true", help="generate --max-new-tokens tokens, never stopping early")
    p.add_argument("--json", metavar="PATH", help="also write tokens, providers and timings as JSON")
    return p


def _parse_ids(text: str, where: str) -> list[int]:
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not a comma-separated list of integers") from None
    if not ids:
        raise ValueError(f"{where}: no token ids")
    return ids


def _read_batch_file(path: str) -> list[list[int] | str]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"--batch-file {path}: {exc.strerror}") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"--batch-file {path} line {n}: not valid JSON") from None
        ids = item.get("prompt_ids", item.get("prompt")) if isinstance(item, dict) else item
        if isinstance(ids, str) and ids:
            prompts.append(ids)
            continue
        if not (isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
            raise ValueError(f"--batch-file {path} line {n}: expected a non-empty list of token ids, "
                             "{\"prompt_ids\": [...]}, {\"prompt\": \"text\"} or a JSON string")
        prompts.append(ids)
    if not prompts:
        raise ValueError(f"--batch-file {path}: no prompts")
    return prompts


def _tokenize(args, prompts: list[list[int] | str]) -> list[list[int]]:
    """Token ids of every prompt; text ones through the checkpoint's tokenizer (sets `args.tokenizer`)."""
    args.tokenizer = None
    if not any(isinstance(p, str) for p in prompts):
        return prompts
    if args.checkpoint is None:
        raise ValueError("text prompts need --checkpoint with a tokenizer.json (--random models have none); "
                         "give --prompt-ids instead")
    from reference_impl.models.tokenizer import load_tokenizer

    args.tokenizer = load_tokenizer(args.checkpoint)
    return [args.tokenizer.encode(p) if isinstance(p, str) else p for p in prompts]


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[list[int]]:
    """The prompts' token ids, or `parser.error` (one line, exit 2) for arguments that cannot run."""
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.tp < 1:
        parser.error(f"--tp must be at least 1, got {args.tp}")
    if args.temperature < 0 or args.top_k < 0:
        parser.error("--temperature and --top-k must be >= 0")
    if not 0 < args.top_p <= 1 or not 0 <= args.min_p <= 1:
        parser.error(f"--top-p must be in (0, 1] and --min-p in [0, 1], got {args.top_p} and {args.min_p}")
    if args.prompt is None and args.prompt_ids is None and args.batch_file is None:
        parser.error("give --prompt, --prompt-ids or --batch-file")
    if args.stop_token_ids is not None and args.ignore_eos:
        parser.error("--stop-token-ids and --ignore-eos contradict each other; give one")
    if args.platform is not None:
        from reference_impl.platforms import load_platform

        try:
            load_platform(args.platform)
        except Exception as exc:  # noqa: BLE001 - unknown name, absent device, failing plugin: one line
            parser.error(f"--platform {args.platform}: {str(exc).splitlines()[0]}")
    prompts: list[list[int] | str] = []
    try:
        if args.prompt is not None:
            if not args.prompt:
                raise ValueError("--prompt is empty")
            prompts.append(args.prompt)
        if args.prompt_ids is not None:
            prompts.append(_parse_ids(args.prompt_ids, "--prompt-ids"))
        if args.batch_file is not None:
            prompts.extend(_read_batch_file(args.batch_file))
        config = _config(args)
        prompts = _tokenize(args, prompts)
        stop_ids = stop_token_ids(args)
    except ValueError as exc:
        parser.error(str(exc).splitlines()[0])
    bad = sorted(t for t in stop_ids if not 0 <= t < config.vocab_size)
    if bad:
        parser.error(f"stop token ids {bad} are outside the vocabulary [0, {config.vocab_size})")
    for i, ids in enumerate(prompts):
        bad = [t for t in ids if not 0 <= t < config.vocab_size]
        if bad:
            parser.error(f"prompt {i}: token ids {bad} are outside the vocabulary [0, {config.vocab_size})")
    longest = max(len(p) for p in prompts) + args.max_new_tokens - 1
    if longest > config.max_position_embeddings:
        parser.error(f"prompt plus --max-new-tokens reaches {longest} tokens, beyond the model's "
                     f"max_position_embeddings {config.max_position_embeddings}")
    for what, size in (("num_attention_heads", config.num_heads), ("num_key_value_heads", config.num_kv_heads),
                       ("intermediate_size", config.intermediate_size)):
        if size % args.tp:
            parser.error(f"--tp {args.tp} does not divide the model's {what} ({size})")
    return prompts


def _config(args) -> DecoderConfig:
    if args.random is not None:
        return PRESETS[args.random]
    from reference_impl.models.checkpoint import read_config

    return read_config(args.checkpoint)


def _dtype(args) -> torch.dtype:
    """--dtype, else the checkpoint config's dtype (float32 when it names none, and for --random)."""
    if args.dtype is not None:
        return DTYPES[args.dtype]
    if args.checkpoint is not None:
        from reference_impl.models.checkpoint import read_dtype

        return read_dtype(args.checkpoint)
    return torch.float32


def _load(args, dtype: torch.dtype, device: str):
    if args.random is not None:
        from reference_impl.layers.cpu_gemm import pack_cpu_gemms
        from reference_impl.models.llama import build_model

        model = build_model(PRESETS[args.random], dtype, seed=args.weights_seed, device=device)
        pack_cpu_gemms(model)   # as load_checkpoint does on the CPU
        return model
    from reference_impl.models.checkpoint import load_checkpoint

    return load_checkpoint(args.checkpoint, dtype, device)


def run(args: argparse.Namespace, prompts: list[list[int]], rank: int = 0) -> dict:
    """Load, generate and (rank 0) print; returns the report (tokens, providers, CustomOp paths, rates)."""
    from reference_impl.config import CompilationConfig, CompilationMode, RuntimeConfig
    from reference_impl.models import Sampler, SamplingParams, generate
    from reference_impl.models.introspect import compiled_providers, custom_op_paths, probe_providers
    from reference_impl.platforms import activate_platform, get_current_platform

    dtype = _dtype(args)
    chosen = activate_platform(args.platform) if args.platform else contextlib.nullcontext(get_current_platform())
    with chosen as platform:
        device = platform.device_type
        host_memory = "system"
        if device == "cpu":
            from reference_impl.models.host_memory import keep_freed_memory

            host_memory = "kept for reuse" if keep_freed_memory() else "system"
        model = _load(args, dtype, device)
        max_len = max(len(p) for p in prompts) + args.max_new_tokens
        runner, backend = model, None
        if args.compile:
            from reference_impl.compilation import compile_module

            config = RuntimeConfig(CompilationConfig(mode=CompilationMode.REFERENCE_COMPILE,
                                                     backend=args.compile_backend))
            runner = compile_module(model, config)
            backend = runner.backend
            providers = None
        else:   # one probing prefill + decode step on a scratch cache
            scratch = model.allocate_kv_cache(1, min(len(prompts[0]) + 1, max_len))
            providers = probe_providers(lambda: generate(model, prompts[:1], 2, cache=scratch, device=device))
        cache = model.allocate_kv_cache(len(prompts), max_len)
        sampler = Sampler(SamplingParams(args.temperature, args.top_k, args.seed))
        if args.top_p < 1 or args.min_p > 0:   # vLLM's order of processing (reference_impl.sampling)
            from reference_impl.sampling import BatchSampler

            sampler = BatchSampler(args.temperature, args.top_k, args.top_p, args.min_p, args.seed)
        bar = None
        if rank == 0 and args.max_new_tokens >= PROGRESS_MIN_STEPS:
            from tqdm import tqdm

            bar = tqdm(total=args.max_new_tokens, desc="generating", unit="step", file=sys.stderr, leave=False)
        stop_ids = stop_token_ids(args)
        result = generate(runner, prompts, args.max_new_tokens, cache=cache, sampler=sampler, device=device,
                          on_step=(lambda _: bar.update(1)) if bar is not None else None, stop_token_ids=stop_ids)
        if bar is not None:
            bar.close()
        if backend is not None:
            providers = compiled_providers(backend)
        paths = custom_op_paths(model)
        packed = sum("cpu_gemm" in m.__dict__ for m in model.modules())
    decode_tokens = result.decode_tokens
    tokenizer = getattr(args, "tokenizer", None)
    report = {
        "platform": platform_name(args, platform), "device": device, "dtype": str(dtype).removeprefix("torch."),
        "tp": args.tp, "threads": torch.get_num_threads(), "compiled": bool(args.compile), "tokens": result.tokens,
        "stop_token_ids": sorted(stop_ids),
        "prompt_text": [tokenizer.decode(p) for p in prompts] if tokenizer else None,
        "text": [tokenizer.decode(t) for t in result.tokens] if tokenizer else None,
        "ir_providers": {k: sorted(v) for k, v in sorted(providers.items())},
        "custom_op_paths": {k: sorted(v) for k, v in sorted(paths.items())},
        "prefill_tokens": result.prompt_tokens, "prefill_seconds": result.prefill_seconds,
        "decode_tokens": decode_tokens, "decode_seconds": result.decode_seconds,
        "graphs_compiled": backend.num_compilations if backend is not None else None,
        "cpu_gemm_layers": packed, "host_memory": host_memory,
        "attention_backends": model.attention_backends, "kv_cache_block_size": cache.block_size,
    }
    if rank == 0:
        _print(args, model.config, prompts, report, providers, paths)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return report


def stop_token_ids(args) -> set[int]:
    """--stop-token-ids, else the checkpoint's `eos_token_id`; none with --ignore-eos."""
    if args.ignore_eos:
        return set()
    if args.stop_token_ids:
        return set(_parse_ids(args.stop_token_ids, "--stop-token-ids"))
    if args.checkpoint:
        from reference_impl.models.checkpoint import read_eos_token_ids

        return set(read_eos_token_ids(args.checkpoint))
    return set()


def platform_name(args, platform) -> str:
    return args.platform or type(platform).__name__


def _rate(tokens: int, seconds: float) -> str:
    return f"{tokens / seconds:.1f} tokens/s" if tokens and seconds > 0 else "n/a"


def _print(args, config: DecoderConfig, prompts, report, providers, paths) -> None:
    from reference_impl.models.introspect import describe

    source = f"checkpoint {args.checkpoint}" if args.checkpoint else f"random {args.random} (seed {args.weights_seed})"
    kind = "Gemma-2-shaped" if config.norm_style == "gemma2" else "Llama-shaped"
    if config.num_experts:
        kind = f"{'gpt-oss' if config.moe_style == 'gpt_oss' else 'Mixtral'}-shaped, {config.num_experts} experts"
    mode = f"compiled ({args.compile_backend}, {report['graphs_compiled']} graphs)" if args.compile else "eager"
    print(f"model: {source}: {kind}, {config.num_layers} layers, hidden {config.hidden_size}, vocab "
          f"{config.vocab_size}; platform {report['platform']} (device {report['device']}), {report['dtype']}, "
          f"tp {args.tp} ({report['threads']} thread{'s' if report['threads'] != 1 else ''} a rank), {mode}")
    print(f"IR providers selected: {describe(providers)}")
    print(f"CustomOp paths: {describe(paths)}")
    print(f"attention: {', '.join(report['attention_backends'])} backend over a paged KV cache (blocks of "
          f"{report['kv_cache_block_size']} tokens)")
    if report["cpu_gemm_layers"]:
        print(f"CPU GEMM: prepacked oneDNN weights in {report['cpu_gemm_layers']} layers (layers/cpu_gemm.py)")
    for i, (prompt, tokens) in enumerate(zip(prompts, report["tokens"])):
        if report["text"] is not None:
            print(f"sequence {i}: prompt {report['prompt_text'][i]!r} -> {report['text'][i]!r} (ids {prompt} -> "
                  f"{tokens})")
        else:
            print(f"sequence {i}: prompt {prompt} -> {tokens}")
    if report["stop_token_ids"]:
        ended = sum(bool(t) and t[-1] in report["stop_token_ids"] for t in report["tokens"])
        print(f"stop tokens {report['stop_token_ids']}: {ended} of {len(prompts)} sequences ended on one")
    print(f"prefill: {report['prefill_tokens']} tokens in {report['prefill_seconds']:.3f} s "
          f"({_rate(report['prefill_tokens'], report['prefill_seconds'])}); decode: {report['decode_tokens']} "
          f"tokens of {len(prompts)} sequences (up to {args.max_new_tokens - 1} steps) in "
          f"{report['decode_seconds']:.3f} s ({_rate(report['decode_tokens'], report['decode_seconds'])})")


def rank_threads(tp: int) -> int:
    """Threads for each of `tp` CPU ranks: OMP_NUM_THREADS where set, else this process's cores over tp (at least
    one)."""
    if os.environ.get("OMP_NUM_THREADS", "").strip().isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // tp)


def _rank_main(rank: int, args: argparse.Namespace, prompts: list[list[int]], init_file: str) -> None:
    from reference_impl import distributed as dist

    backend = "nccl" if torch.cuda.is_available() and (args.platform in (None, "cuda")) else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(rank_threads(args.tp))
    dist.init_distributed_environment(args.tp, rank, f"file://{init_file}", backend)
    dist.initialize_model_parallel(args.tp)
    try:
        run(args, prompts, rank)
    finally:
        dist.destroy_model_parallel()
        dist.destroy_distributed_environment()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    prompts = validate(parser, args)
    try:
        if args.tp == 1:
            run(args, prompts)
        else:
            import torch.multiprocessing as mp

            with tempfile.TemporaryDirectory() as tmp:
                mp.spawn(_rank_main, args=(args, prompts, os.path.join(tmp, "store")), nprocs=args.tp)
    except Exception as exc:   # noqa: BLE001 - one clear line for the user, not a traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"{parser.prog}: error: {type(exc).__name__}: {first}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
