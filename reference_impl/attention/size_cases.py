"""The attention family's batches at the sizes where real kernels break (issue 33; the IR ops' counterpart is
reference_impl.ir.size_cases): token counts and request counts just past 4,096 and 65,536 (a launch grid over
tokens or sequences sized for a maximum batch, CUDA's 65,535 blocks in a grid's y and z), and a cache of more than
65,535 blocks whose batch addresses blocks from 65,535 up (a block index or a block-table entry held in 16 bits).

Heads stay tiny (one head of 32, the smallest vLLM's CPU backend declares) and requests short, so the float64 oracle
(O(tokens x context)) stays cheap: 65,537 tokens are about two thousand requests of at most 64 new tokens. The
lengths repeat a few shapes, which the oracle and the reference backend compute as one batch each.
"""

from __future__ import annotations

# (the count past which a limit is common, the level from which the case just past it runs)
TOKEN_LIMITS = ((4096, "standard"), (65536, "standard"), (1 << 20, "full"))
# The decode batch of 65,537 requests runs at full: it was half of the size units' cost at standard (5.1 of 10.2 s),
# and the 65,537-token mixed batch (about 2,000 requests) and the blocks case keep the grid limits at standard.
REQUEST_LIMITS = ((4096, "standard"), (65536, "full"))
BLOCK_LIMIT = 65535                         # the largest block index 16 bits hold (unsigned)
# A prefill/mixed batch repeats these requests (query_len, context): a fresh prefill, a chunked prefill whose context
# is not block-aligned, a decode, a short chunk; the last request takes what is left of the token count.
MIXED_REQUESTS = ((64, 0), (48, 21), (1, 37), (17, 30))
DECODE_SEQ_LENS = 16                        # a decode batch's seq_lens cycle 1..16: one block of 16 each
# The blocks case: a mixed batch of four requests (10 blocks of 16) numbered from BLOCK_LIMIT up.
HIGH_BLOCK_REQUESTS = ((1, 40), (7, 7), (16, 50), (1, 17))
# Host bytes per token that running and judging a mixed batch takes at its peak (inputs, keys and values per
# request, two caches, the reference run's and the oracle's float64 intermediates, the comparison): twice what was
# measured (peak RSS growth of the forward unit on the CPP backend, bfloat16: 3,760 bytes a token at 1,048,577 tokens,
# 54 s; 5,806 at 65,537, where the allocator's own overhead weighs more).
BYTES_PER_TOKEN = 8 << 10


def mixed(tokens: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(query_lens, seq_lens) of a prefill/mixed batch of exactly `tokens` new tokens (MIXED_REQUESTS repeated)."""
    if tokens < 1:
        raise ValueError(f"a mixed batch of {tokens} tokens: at least one")
    query_lens, seq_lens, left, i = [], [], tokens, 0
    while left:
        q, context = MIXED_REQUESTS[i % len(MIXED_REQUESTS)]
        q = min(q, left)
        query_lens.append(q)
        seq_lens.append(q + context)
        left -= q
        i += 1
    return tuple(query_lens), tuple(seq_lens)


def decodes(requests: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(query_lens, seq_lens) of a decode batch of `requests` requests, seq_lens cycling 1..DECODE_SEQ_LENS."""
    if requests < 1:
        raise ValueError(f"a decode batch of {requests} requests: at least one")
    return (1,) * requests, tuple(1 + i % DECODE_SEQ_LENS for i in range(requests))


def high_blocks() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(query_lens, seq_lens) of the batch whose blocks are numbered from BLOCK_LIMIT up."""
    return tuple(q for q, _ in HIGH_BLOCK_REQUESTS), tuple(s for _, s in HIGH_BLOCK_REQUESTS)
