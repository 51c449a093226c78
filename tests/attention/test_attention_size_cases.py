"""The attention family's cases at the sizes where real kernels break (reference_impl.attention.size_cases): token
and request counts just past 4,096 and 65,536 and a cache past 65,535 blocks, what the batches address, the grouped
oracle and reference backend they need to stay cheap, the backends that must pass them, and the faults they catch
(a grid over requests, tokens or blocks that stops at a limit), named by their first bad request."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from conformance.checks import CheckContext, run_unit
from conformance.checks.attention.checks import bad_requests
from conformance.collect.inventory import activate
from conformance.collect.units import Unit
from conformance.results.result import Outcome
from reference_impl.attention import size_cases
from reference_impl.attention.batch import BackendRun, make_batch
from reference_impl.attention.cases import CASES, CASES_BY_NAME, SIZE_FLAG, AttentionCase, case_dtypes
from reference_impl.attention.oracle import AttentionProblem, alibi_slopes, oracle
from reference_impl.attention.reference import (
    ReferenceAttentionBackend,
    ReferenceAttentionImpl,
    ReferenceAttentionMetadataBuilder,
)
from reference_impl.ir import size_cases as ir_size_cases
from reference_impl.ir.tolerances import ATTN_TOLERANCES
from reference_impl.platforms import Platform

SIZE = [c for c in CASES if c.one_dtype]
BLOCKS = CASES_BY_NAME["blocks_past_65535"]


# ----- the cases ----------------------------------------------------------------------------------------------------
def test_token_and_request_counts_are_just_past_each_limit_at_their_level():
    tokens = {sum(c.query_lens): c.level for c in SIZE if c.name.startswith("tokens_")}
    requests = {len(c.query_lens): c.level for c in SIZE if c.name.startswith("seqs_")}
    assert tokens == {4097: "standard", 65537: "standard", 1048577: "full"}
    assert requests == {4097: "standard", 65537: "full"}
    for c in SIZE:
        assert (c.num_heads, c.num_kv_heads, c.head_size, c.kv_dtypes) == (1, 1, 32, ("auto",)), c.name
        assert max(c.query_lens) <= 64 and max(c.seq_lens) <= 64 + 37, c.name   # the oracle stays O(tokens)
        assert (c.memory_bytes is not None) == (c.level == "full"), c.name
        assert SIZE_FLAG in c.name or c is BLOCKS
    mixed = CASES_BY_NAME["tokens_4097_past_limit"]
    assert {q for q in mixed.query_lens} >= {1, 64} and any(s > q for q, s in zip(mixed.query_lens, mixed.seq_lens))
    decode = CASES_BY_NAME["seqs_65537_past_limit"]
    assert set(decode.query_lens) == {1} and set(decode.seq_lens) == set(range(1, 17))
    # one block of 16 each: the decode batch past 65,536 requests addresses more than 65,535 blocks too
    assert sum(-(-s // 16) for s in decode.seq_lens) == 65537


def test_the_length_builders_and_the_case_refuse_what_cannot_be():
    with pytest.raises(ValueError, match="a mixed batch of 0 tokens: at least one"):
        size_cases.mixed(0)
    with pytest.raises(ValueError, match="a decode batch of 0 requests: at least one"):
        size_cases.decodes(0)
    with pytest.raises(ValueError, match="case x: first_block 0 must be >= 1 \\(block 0 is the null block\\)"):
        AttentionCase("x", (1,), (1,), "x", first_block=0)
    assert size_cases.mixed(65) == ((64, 1), (64, 22))


def test_a_size_case_runs_in_one_dtype_the_first_declared_of_bf16_fp16_fp32():
    case = CASES_BY_NAME["tokens_4097_past_limit"]
    assert case_dtypes(case, [torch.float32, torch.float16, torch.bfloat16]) == [torch.bfloat16]
    assert case_dtypes(case, [torch.float32, torch.float16]) == [torch.float16]
    assert case_dtypes(case, [torch.float32]) == [torch.float32]
    assert case_dtypes(CASES_BY_NAME["decode"], [torch.float32, torch.bfloat16]) == [torch.float32, torch.bfloat16]


def test_a_large_batch_is_described_by_its_counts_not_spelled_out():
    text = CASES_BY_NAME["seqs_4097_past_limit"].describe()
    assert text.startswith("4097 requests, 4097 tokens (query_lens 1..1, seq_lens 1..16), H=1 KVH=1 D=32 block=16")
    assert "the batch's blocks numbered from 65535 up" in BLOCKS.describe()
    assert CASES_BY_NAME["decode"].describe().startswith("query_lens=[1, 1, 1, 1] seq_lens=[1, 16, 17, 45]")


def test_the_blocks_case_addresses_only_blocks_from_65535_in_a_cache_past_65535_blocks():
    batch = make_batch(BLOCKS, torch.bfloat16, "auto", seed=3)
    table = batch.metadata.block_table_tensor
    assert batch.num_blocks > 65537 and min(batch.addressed_blocks) == 65535 and int(table.max()) > 1 << 16
    assert set(int(b) for b in table.flatten()) == set(batch.addressed_blocks) | {0}    # 0: the table's padding
    slots = torch.cat([batch.context_slots, batch.metadata.slot_mapping])
    used = slots[slots >= 0]
    assert int(used.min()) >= 65535 * BLOCKS.block_size and used.unique().numel() == used.numel()


# ----- the grouped oracle and reference backend -------------------------------------------------------------------
def test_the_oracle_of_a_batch_equals_each_request_computed_alone():
    """Requests of one (query_len, seq_len) are computed as one batch: the same values as one request at a time."""
    g = torch.Generator().manual_seed(0)
    query_lens, seq_lens = [3, 1, 3, 0, 1, 3], [10, 7, 10, 4, 7, 3]
    keys = [torch.randn(s, 2, 8, generator=g) for s in seq_lens]
    values = [torch.randn(s, 2, 8, generator=g) for s in seq_lens]
    query = torch.randn(sum(query_lens), 4, 8, generator=g)
    common = dict(scale=0.4, sliding_window=5, logits_soft_cap=3.0, alibi_slopes=alibi_slopes(4),
                  sinks=torch.randn(4, generator=g))
    whole = oracle(AttentionProblem(query, keys, values, query_lens, seq_lens, **common))
    start = 0
    for i, (ql, s) in enumerate(zip(query_lens, seq_lens)):
        alone = oracle(AttentionProblem(query[start:start + ql], [keys[i]], [values[i]], [ql], [s], **common))
        torch.testing.assert_close(whole[start:start + ql], alone, rtol=1e-12, atol=1e-12)
        start += ql


@pytest.mark.parametrize("name", ["tokens_4097_past_limit", "seqs_4097_past_limit", "blocks_past_65535"])
def test_the_reference_backend_is_within_tolerance_of_the_oracle_on_the_size_cases(name):
    case = CASES_BY_NAME[name]
    atol, rtol = ATTN_TOLERANCES[torch.bfloat16]
    batch = make_batch(case, torch.bfloat16, "auto", seed=7)
    out, _, _ = BackendRun(ReferenceAttentionBackend, batch).run()
    tokens = batch.num_actual_tokens
    torch.testing.assert_close(out[:tokens].double(), oracle(batch.problem), atol=atol, rtol=rtol)
    assert torch.isnan(out[tokens:]).all()


# ----- the family on them -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cpu():
    inventory = activate("cpu")
    return inventory, CheckContext("cpu", inventory.platform, seed=1234, level="standard")


def test_the_size_cases_are_forward_units_in_one_dtype_and_the_blocks_case_a_cache_write_unit(cpu):
    from conformance.checks.attention.units import aliasing_units, cache_write_units, forward_units, steps_units

    inventory, _ = cpu
    forward = [u for u in forward_units(inventory, "attention", "forward", "standard") if u.provider == "CPP"]
    sized = {(u.dtype, u.case) for u in forward if CASES_BY_NAME.get(u.case) in SIZE}
    assert sized == {("bfloat16", c.name) for c in SIZE if c.level == "standard"}
    writes = {u.case for u in cache_write_units(inventory, "attention", "cache_write", "standard")}
    assert BLOCKS.name in writes and not any(SIZE_FLAG in c for c in writes)
    others = aliasing_units(inventory, "attention", "aliasing", "standard") + steps_units(
        inventory, "attention", "steps", "standard")
    assert not any(CASES_BY_NAME.get(u.case) in SIZE for u in others)
    assert not any(CASES_BY_NAME.get(u.case) in SIZE for u in forward_units(inventory, "attention", "forward", "quick"))


@pytest.mark.parametrize("check, case", [("forward", "tokens_4097_past_limit"), ("forward", "seqs_4097_past_limit"),
                                         ("forward", "blocks_past_65535"), ("cache_write", "blocks_past_65535")])
def test_the_cpp_backend_passes_the_size_cases(cpu, check, case):
    _, ctx = cpu
    verdict = run_unit(ctx, Unit("attention", check, "attention", "CPP", "bfloat16", case))[0]
    assert verdict.outcome is Outcome.PASS, verdict.message
    if check == "cache_write":
        assert verdict.message.startswith("65537 unaddressed blocks (null block 0, 65534 below the batch's first "
                                          "block and 2 spare) byte-identical")


def test_the_full_level_token_case_is_a_skip_naming_the_memory_it_lacks(cpu, monkeypatch):
    inventory, _ = cpu
    ctx = CheckContext("cpu", inventory.platform, seed=1234, level="full")
    case = CASES_BY_NAME["tokens_1048577_past_limit"]
    monkeypatch.setattr(ir_size_cases, "_host_available", lambda: 1 << 30)
    verdict = run_unit(ctx, Unit("attention", "forward", "attention", "CPP", "bfloat16", case.name))[0]
    assert verdict.outcome is Outcome.SKIP
    assert verdict.message == (f"case {case.name} needs {case.memory_bytes / (1 << 30):.1f} GiB free on host to run "
                               "and judge, the host's MemAvailable (/proc/meminfo) reports 1.0 GiB")


# ----- faults at a limit, named by their first bad request ------------------------------------------------------------
class RequestLimitImpl(ReferenceAttentionImpl):
    """Computes at most 4,096 requests (a grid over sequences sized for a maximum batch)."""

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        if attn_metadata is not None:
            attn_metadata = dataclasses.replace(attn_metadata, seq_lens=attn_metadata.seq_lens[:4096],
                                                query_start_loc=attn_metadata.query_start_loc[:4097])
        return super().forward(layer, query, key, value, kv_cache, attn_metadata, output)


class TokenLimitImpl(ReferenceAttentionImpl):
    """Leaves every token past 4,096 zero (a grid over tokens)."""

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        super().forward(layer, query, key, value, kv_cache, attn_metadata, output)
        if attn_metadata is not None:
            output[4096:attn_metadata.num_actual_tokens] = 0
        return output


class Block16Builder(ReferenceAttentionMetadataBuilder):
    """Holds block-table entries in 16 bits: block 65,536 reads as 0, the null block."""

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        md = super().build(common_prefix_len, common_attn_metadata, fast_build)
        md.block_table = md.block_table & 0xFFFF
        return md


class Block16WriterImpl(ReferenceAttentionImpl):
    """Writes through slots whose block is held in 16 bits."""

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        block_size = kv_cache.shape[2]
        blocks = torch.where(slot_mapping >= 0, (slot_mapping // block_size) & 0xFFFF, -1)
        slots = torch.where(slot_mapping >= 0, blocks * block_size + slot_mapping % block_size, -1)
        super().do_kv_cache_update(layer, key, value, kv_cache, slots)


def _backend(impl=ReferenceAttentionImpl, builder=ReferenceAttentionMetadataBuilder):
    class Backend(ReferenceAttentionBackend):
        @staticmethod
        def get_name():
            return "TEST_LIMIT"

        @staticmethod
        def get_impl_cls():
            return impl

        @staticmethod
        def get_builder_cls():
            return builder

    return Backend


RequestLimit = _backend(RequestLimitImpl)
TokenLimit = _backend(TokenLimitImpl)
Block16 = _backend(builder=Block16Builder)
Block16Writer = _backend(Block16WriterImpl)


class OnePlatform(Platform):
    def __init__(self, answer):
        self.answer = answer

    def get_attn_backend_cls(self, selected_backend, selector_config, num_heads=None):
        return self.answer


def _verdict(backend: str, check: str, case: str):
    platform = OnePlatform(f"{__name__}.{backend}")
    ctx = CheckContext("test", platform, seed=1234, level="standard")
    return run_unit(ctx, Unit("attention", check, "attention", f"{__name__}.{backend}", "bfloat16", case))[0]


def test_a_kernel_that_stops_at_4096_requests_fails_naming_the_first_bad_request():
    verdict = _verdict("RequestLimit", "forward", "seqs_4097_past_limit")
    assert verdict.outcome is Outcome.FAIL
    assert ("by request: 1 of 4097 tokens in 1 of 4097 requests are wrong, first bad request 4096 (its token 0, "
            "token 4096 of the batch; bad: request 4096)") in verdict.message
    assert "first bad row 4096 (row 4096 is all nan)" in verdict.message
    assert _verdict("RequestLimit", "forward", "tokens_4097_past_limit").outcome is Outcome.PASS   # 130 requests


def test_a_kernel_that_stops_at_4096_tokens_fails_naming_the_request_of_the_first_bad_token():
    case = CASES_BY_NAME["tokens_4097_past_limit"]
    verdict = _verdict("TokenLimit", "forward", case.name)
    assert verdict.outcome is Outcome.FAIL
    last, own = len(case.query_lens) - 1, case.query_lens[-1] - 1      # token 4096 is the last request's last
    assert (f"1 of 4097 tokens in 1 of {last + 1} requests are wrong, first bad request {last} (its token {own}, "
            f"token 4096 of the batch; bad: request {last})") in verdict.message
    assert "first bad row 4096 (row 4096 is all zero)" in verdict.message
    assert _verdict("TokenLimit", "forward", "seqs_4097_past_limit").outcome is Outcome.FAIL


def test_block_indices_held_in_16_bits_fail_the_blocks_case():
    read = _verdict("Block16", "forward", BLOCKS.name)
    assert read.outcome is Outcome.FAIL and "by request:" in read.message, read.message
    assert _verdict("Block16", "forward", "decode").outcome is Outcome.PASS
    write = _verdict("Block16Writer", "cache_write", BLOCKS.name)
    assert write.outcome is Outcome.FAIL
    assert "block 0 (the null block)" in write.message and "which slot_mapping does not address" in write.message


def test_bad_requests_counts_tokens_and_runs_of_requests_and_skips_empty_requests():
    native = torch.zeros(10, 1, 2)
    got = native.clone()
    got[[2, 3, 8]] = 1.0                  # request 1's tokens 0-1 (zero-length request 2 between), request 4's last
    text = bad_requests(got, native, [2, 2, 0, 3, 3], atol=0.1, rtol=0.0)
    assert text == ("; by request: 3 of 10 tokens in 2 of 5 requests are wrong, first bad request 1 (its token 0, "
                    "token 2 of the batch; bad: request 1, request 4)")
    got = native.clone()
    got[5] = float("nan")
    assert "first bad request 3 (its token 1, token 5 of the batch" in bad_requests(got, native, [2, 2, 0, 3, 3],
                                                                                    atol=0.1, rtol=0.0)
    assert bad_requests(native, native, [2, 2, 0, 3, 3], atol=0.1, rtol=0.0) == ""


# ----- TRITON_PAGED -------------------------------------------------------------------------------------------------
# Under the interpreter a program per request costs about 40 ms: the 4,097-token case takes 160 s, the 65,537 ones
# most of an hour; so here the blocks case (4 requests in a cache past 65,535 blocks, ~5 s), and every standard size
# case where a GPU runs the kernels.
def _triton_child(names: list[str]) -> dict:
    from conformance.checks.attention.checks import grade
    from reference_impl.attention.triton_backend import TritonAttentionBackend

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = {}
    for name in names:
        case = CASES_BY_NAME[name]
        batch = make_batch(case, torch.bfloat16, "auto", seed=5, device=device)
        got, _, _ = BackendRun(TritonAttentionBackend, batch).run()
        native, _, _ = BackendRun(ReferenceAttentionBackend, make_batch(case, torch.bfloat16, "auto", seed=5)).run()
        tokens = batch.num_actual_tokens
        cmp = grade(got[:tokens].cpu(), native[:tokens], batch.problem, case, torch.bfloat16)
        out[name] = [cmp.outcome.value, cmp.message]
    return out


def test_the_triton_backend_passes_the_size_cases_it_can_run_here():
    pytest.importorskip("triton")
    names = ([c.name for c in SIZE if c.level == "standard"] if torch.cuda.is_available() else [BLOCKS.name])
    env = {**os.environ, **({} if torch.cuda.is_available() else {"TRITON_INTERPRET": "1"})}
    proc = subprocess.run([sys.executable, __file__, *names], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results) == set(names)
    assert all(outcome == "PASS" for outcome, _ in results.values()), results


if __name__ == "__main__":
    print(json.dumps(_triton_child(sys.argv[1:])))
