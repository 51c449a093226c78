"""Triton paged attention: `reshape_and_cache` and `paged_attention`, with the C++ CPU kernels' interface
(csrc/README.md), as the torch ops `reference_triton::reshape_and_cache` / `reference_triton::paged_attention`.

Supports exactly: fp32, fp16, bf16 activations; kv_cache_dtype "auto" (the cache in the model dtype; fp8
caches raise NotImplementedError); head sizes up to MAX_HEAD_SIZE, any block size; causal (with context)
or not; sliding window (keys j > p - w, and |p - j| < w when not causal), soft cap, ALiBi, sinks; GQA with
any ratio (query head h reads kv head h // (H / KVH)); q/k/v/output with any token and head strides
(last dim contiguous); a cache with any block/head/token strides (last dim contiguous). Writes output rows
< query_start_loc[-1] only; slots < 0 are skipped.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reference_impl.kernels.triton import _env
from reference_impl.kernels.triton._host import LAUNCH_OPTIONS, triton_op

if _env.HAS_TRITON:
    from reference_impl.kernels.triton import _attention_jit as _jit

MAX_HEAD_SIZE = 512
KV_CACHE_DTYPES = ("auto",)
# Keys per tile of the forward: one gather of BLOCK_N key rows through the block table.
BLOCK_N = 32


def _check_common(kv_cache: Tensor, dtype: torch.dtype, kv_cache_dtype: str, op: str) -> int:
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise NotImplementedError(f"triton {op}: kv_cache_dtype {kv_cache_dtype!r} is not supported (auto only)")
    if kv_cache.dim() != 4 or kv_cache.shape[3] % 2 or kv_cache.stride(3) != 1:
        raise ValueError(f"triton {op}: kv_cache must be [num_blocks, num_kv_heads, block_size, 2 * head_size] "
                         f"contiguous in its last dim, got {tuple(kv_cache.shape)} strides {kv_cache.stride()}")
    if kv_cache.dtype != dtype:
        raise ValueError(f"triton {op}: kv_cache dtype {kv_cache.dtype} must equal the activation dtype {dtype}")
    head = kv_cache.shape[3] // 2
    if head > MAX_HEAD_SIZE:
        raise NotImplementedError(f"triton {op}: head_size {head} is above {MAX_HEAD_SIZE}")
    return head


def _check_rows(x: Tensor, heads: int, head: int, op: str, name: str) -> None:
    if x.dim() != 3 or x.shape[1] != heads or x.shape[2] != head or (head > 1 and x.stride(2) != 1):
        raise ValueError(f"triton {op}: {name} must be [num_tokens, {heads}, {head}] contiguous in its last dim, "
                         f"got {tuple(x.shape)} strides {x.stride()}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"triton {op}: {name} dtype {x.dtype} is not supported (float32, float16, bfloat16)")


@triton_op("reshape_and_cache", mutates_args=("kv_cache",))
def reshape_and_cache(key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor, kv_cache_dtype: str,
                      k_scale: float, v_scale: float) -> None:
    """kv_cache[slot // N, :, slot % N] = key | value for every token with slot_mapping[t] >= 0."""
    _env.require()
    op = "reshape_and_cache"
    head = _check_common(kv_cache, key.dtype, kv_cache_dtype, op)
    _check_rows(key, kv_cache.shape[1], head, op, "key")
    _check_rows(value, kv_cache.shape[1], head, op, "value")
    tokens = slot_mapping.shape[0]
    if tokens > key.shape[0]:
        raise ValueError(f"triton {op}: slot_mapping has {tokens} slots for {key.shape[0]} key rows")
    if tokens == 0:
        return
    capacity = kv_cache.shape[0] * kv_cache.shape[2]
    if int(slot_mapping.max()) >= capacity:
        raise IndexError(f"triton {op}: slot {int(slot_mapping.max())} is past the cache's {capacity} slots")
    _jit.reshape_and_cache_kernel[(tokens, kv_cache.shape[1])](
        key, key.stride(0), key.stride(1), value, value.stride(0), value.stride(1), kv_cache, kv_cache.stride(0),
        kv_cache.stride(1), kv_cache.stride(2), slot_mapping, head, kv_cache.shape[2],
        BLOCK_D=_env.next_power_of_2(head), **LAUNCH_OPTIONS)


@triton_op("paged_attention", mutates_args=("output",))
def paged_attention(output: Tensor, query: Tensor, kv_cache: Tensor, query_start_loc: Tensor, seq_lens: Tensor,
                    block_table: Tensor, scale: float, causal: bool, sliding_window: int, logits_soft_cap: float,
                    alibi_slopes: Tensor | None, sinks: Tensor | None, kv_cache_dtype: str, k_scale: float,
                    v_scale: float) -> None:
    """Paged attention of the packed query rows into `output` (see the module docstring)."""
    _env.require()
    op = "paged_attention"
    head = _check_common(kv_cache, query.dtype, kv_cache_dtype, op)
    heads, kv_heads = query.shape[1], kv_cache.shape[1]
    _check_rows(query, heads, head, op, "query")
    _check_rows(output, heads, head, op, "output")
    if output.dtype != query.dtype:
        raise ValueError(f"triton {op}: output dtype {output.dtype} differs from query dtype {query.dtype}")
    if heads % kv_heads:
        raise ValueError(f"triton {op}: num_heads {heads} is not a multiple of num_kv_heads {kv_heads}")
    if sliding_window != -1 and sliding_window < 1:
        raise ValueError(f"triton {op}: sliding_window must be -1 (none) or positive, got {sliding_window}")
    if logits_soft_cap < 0:
        raise ValueError(f"triton {op}: logits_soft_cap must be 0 (none) or positive, got {logits_soft_cap}")
    num_seqs = block_table.shape[0]
    qsl = query_start_loc.to(torch.int32)
    lens = seq_lens.to(torch.int32)
    if qsl.shape != (num_seqs + 1,) or lens.shape != (num_seqs,):
        raise ValueError(f"triton {op}: query_start_loc {tuple(qsl.shape)} and seq_lens {tuple(lens.shape)} do not "
                         f"match the block table's {num_seqs} requests")
    query_lens = qsl[1:] - qsl[:-1]
    if bool((query_lens < 0).any()) or bool((lens < query_lens).any()):
        raise ValueError(f"triton {op}: every request needs 0 <= query_len <= seq_len")
    tokens = int(qsl[-1]) if num_seqs else 0
    if tokens == 0:
        return
    token_seq = torch.repeat_interleave(torch.arange(num_seqs, device=query.device, dtype=torch.int32),
                                        query_lens.to(torch.int64), output_size=tokens)
    bt = block_table.to(torch.int32).contiguous()
    dummy = lens  # stands in for absent alibi / sinks pointers (never read)
    alibi = dummy if alibi_slopes is None else alibi_slopes.to(torch.float32).contiguous()
    sink = dummy if sinks is None else sinks.to(torch.float32).contiguous()
    _jit.paged_attention_kernel[(tokens, heads)](
        output, output.stride(0), output.stride(1), query, query.stride(0), query.stride(1), kv_cache,
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), token_seq, qsl, lens, bt, bt.stride(0), alibi,
        sink, float(scale), float(logits_soft_cap) or 1.0, int(sliding_window), head, kv_cache.shape[2],
        heads // kv_heads, CAUSAL=bool(causal), HAS_WINDOW=sliding_window > 0, HAS_SOFTCAP=logits_soft_cap > 0,
        HAS_ALIBI=alibi_slopes is not None, HAS_SINKS=sinks is not None, BLOCK_N=BLOCK_N,
        BLOCK_D=_env.next_power_of_2(head), **LAUNCH_OPTIONS)
