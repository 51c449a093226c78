"""Run on every rank of a spawned gloo world (tests/runtime/test_runtime.py): load checkpoint directories with
tensor-parallel sharding and generate with the KV cache; rank 0 reports tokens and logits on a queue."""

from __future__ import annotations

import traceback

PROMPTS = [[5, 17, 3, 99, 42, 7], [8, 1, 250], [60, 61, 62, 63, 64]]
NEW_TOKENS = 4


def generate_from(directory: str):
    """(tokens, prompt logits per sequence, step logits) of the checkpoint at `directory` on this rank."""
    import torch

    from reference_impl.models import generate
    from reference_impl.models.checkpoint import load_checkpoint

    model = load_checkpoint(directory, torch.float32)
    cache = model.allocate_kv_cache(len(PROMPTS), 16)
    out = generate(model, PROMPTS, NEW_TOKENS, cache=cache, prompt_logits=True)
    return out.tokens, [p.tolist() for p in out.prompt_logits], out.step_logits.tolist()


def run_rank(rank: int, world_size: int, init_file: str, directories: dict[str, str], results) -> None:
    """Put `(rank, name, result or None, traceback or None)` for every checkpoint directory."""
    from reference_impl import distributed as d

    try:
        d.init_distributed_environment(world_size, rank, f"file://{init_file}", "gloo")
        d.initialize_model_parallel(world_size)
    except Exception:  # noqa: BLE001 - reported to the parent
        results.put((rank, "setup", None, traceback.format_exc()))
        return
    try:
        for name, directory in directories.items():
            try:
                got = generate_from(directory)
                results.put((rank, name, got if rank == 0 else None, None))
            except Exception:  # noqa: BLE001
                results.put((rank, name, None, traceback.format_exc()))
    finally:
        d.destroy_model_parallel()
        d.destroy_distributed_environment()
