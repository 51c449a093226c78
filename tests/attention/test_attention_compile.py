"""`attention.compile` grades the backend's own code under torch.compile: a SKIP where the platform runs attention as
one opaque op (Dynamo never enters the backend, so compiled and eager would run the same calls), a PASS only where
the backend was traced into the graph, and a FAIL for a backend that cannot be traced, that computes something else
compiled than eager, or whose graph guards on every batch.

The traceable backend here (`DenseAttentionImpl`) is written for this: every request's keys gathered through its
block-table row with tensor indexing, no Python branch on a batch's values, the per-batch lengths as tensors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conformance.checks import CheckContext, records, run_unit
from conformance.collect.inventory import Inventory
from conformance.results.result import Outcome
from reference_impl.attention.backend import AttentionImpl, AttentionMetadataBuilder, AttentionType
from reference_impl.attention.batch import BackendRun, make_batch
from reference_impl.attention.cases import CASES_BY_NAME
from reference_impl.attention.oracle import oracle
from reference_impl.attention.reference import ReferenceAttentionBackend
from reference_impl.ir.tolerances import ATTN_TOLERANCES
from reference_impl.platforms import Platform


@dataclasses.dataclass
class DenseMetadata:
    """Only tensors (and the causal flag): Dynamo keeps the lengths symbolic instead of guarding on them."""

    query_start_loc: torch.Tensor     # int64 [B+1]
    seq_lens: torch.Tensor            # int64 [B]
    block_table: torch.Tensor         # int64 [B, W]
    causal: bool


class DenseBuilder(AttentionMetadataBuilder):
    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        m = common_attn_metadata
        n = m.num_reqs
        return DenseMetadata(m.query_start_loc[: n + 1].long(), m.seq_lens[:n].long(), m.block_table_tensor[:n].long(),
                             bool(m.causal))


class DenseAttentionImpl(AttentionImpl):
    """Decoder attention over the paged cache as dense tensor programs: each token gathers its request's whole
    block-table row and masks the keys it may not see. Slow and memory-hungry, but traceable by Dynamo."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None, sliding_window=None,
                 kv_cache_dtype="auto", logits_soft_cap=None, attn_type=AttentionType.DECODER,
                 kv_sharing_target_layer_name=None, sinks=None, **extra):
        if kv_cache_dtype != "auto" or attn_type != AttentionType.DECODER:
            raise NotImplementedError("the dense test backend has an 'auto' cache and decoder attention only")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.alibi_slopes = None if alibi_slopes is None else torch.tensor(alibi_slopes, dtype=torch.float32)
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap or None
        self.sinks = sinks

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        """Every token written at once; a padded token (slot < 0) rewrites slot 0's own bytes (the null block),
        so nothing changes there and no data-dependent count is needed."""
        slots = slot_mapping[: key.shape[0]].long()
        valid = slots >= 0
        safe = torch.where(valid, slots, torch.zeros_like(slots))
        block_size = kv_cache.shape[2]
        blocks, offsets = safe // block_size, safe % block_size
        new = torch.cat([key, value], dim=-1).to(kv_cache.dtype)
        kv_cache[blocks, :, offsets] = torch.where(valid.view(-1, 1, 1), new, kv_cache[blocks, :, offsets])

    def attend(self, query, kv_cache, md) -> torch.Tensor:
        """Every token's attention `[T, H, D]` (float32); padded tokens get their request index clamped, and the
        caller leaves their rows alone."""
        tokens, d = query.shape[0], self.head_size
        qsl, seq_lens, table = md.query_start_loc, md.seq_lens, md.block_table
        token = torch.arange(tokens, device=query.device)
        request = torch.searchsorted(qsl[1:], token, right=True).clamp(max=seq_lens.shape[0] - 1)
        query_len = qsl[request + 1] - qsl[request]
        position = seq_lens[request] - query_len + (token - qsl[request])          # p = context + t
        block_size = kv_cache.shape[2]
        kv = kv_cache[table[request]]                                             # [T, W, KVH, block, 2D]
        kv = kv.transpose(2, 3).reshape(tokens, -1, self.num_kv_heads, 2 * d).float()
        group = self.num_heads // self.num_kv_heads
        k = kv[..., :d].repeat_interleave(group, dim=2)
        v = kv[..., d:].repeat_interleave(group, dim=2)
        s = torch.einsum("thd,tlhd->thl", query.float(), k) * self.scale
        cap = self.soft_cap()
        if cap is not None:
            s = cap * torch.tanh(s / cap)
        j = torch.arange(table.shape[1] * block_size, device=query.device).view(1, 1, -1)
        p = position.view(-1, 1, 1)
        if self.alibi_slopes is not None:
            s = s - self.alibi_slopes.view(1, -1, 1) * (p - j).float()
        allowed = j < seq_lens[request].view(-1, 1, 1)
        if md.causal:
            allowed = allowed & (j <= p)
        if self.sliding_window is not None:
            w = self.sliding_window
            allowed = allowed & ((j > p - w) if md.causal else ((p - j).abs() < w))
        s = s.masked_fill(~allowed, float("-inf"))
        if self.sinks is not None:
            s = torch.cat([s, self.sinks.float().view(1, -1, 1).expand(tokens, -1, 1)], dim=-1)
        probs = torch.softmax(s, dim=-1)[..., : j.shape[-1]]
        return torch.einsum("thl,tlhd->thd", probs, v)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        if attn_metadata is None:
            return output
        actual = attn_metadata.query_start_loc[-1]
        rows = torch.arange(query.shape[0], device=query.device).view(-1, 1, 1) < actual
        output.copy_(torch.where(rows, self.attend(query, kv_cache, attn_metadata).to(output.dtype), output))
        return output

    def soft_cap(self) -> float | None:
        return self.logits_soft_cap


class DenseBackend(ReferenceAttentionBackend):
    supported_kv_cache_dtypes = ["auto"]

    @staticmethod
    def get_name():
        return "DENSE_TEST"

    @staticmethod
    def get_impl_cls():
        return DenseAttentionImpl

    @staticmethod
    def get_builder_cls():
        return DenseBuilder


class CompiledElsewhereImpl(DenseAttentionImpl):
    """Planted fault: under torch.compile the soft cap is dropped (eager keeps it)."""

    def soft_cap(self):
        return None if torch.compiler.is_compiling() else self.logits_soft_cap


class CompiledElsewhere(DenseBackend):
    @staticmethod
    def get_impl_cls():
        return CompiledElsewhereImpl


class PerBatchImpl(DenseAttentionImpl):
    """Planted fault: a Python branch on the batch's request count, so the graph guards on it."""

    def attend(self, query, kv_cache, md):
        out = super().attend(query, kv_cache, md)
        return out * 1.0 if md.seq_lens.shape[0] > 3 else out


class PerBatch(DenseBackend):
    @staticmethod
    def get_impl_cls():
        return PerBatchImpl


class UntraceableReference(ReferenceAttentionBackend):
    """The reference backend under a name of its own (a platform returning the reference itself brings nothing)."""

    @staticmethod
    def get_name():
        return "UNTRACEABLE_TEST"


class TracingPlatform(Platform):
    """Lets Dynamo into the backend (opaque_attention_op() False, the default) and selects `answer`."""

    def __init__(self, answer):
        self.answer = answer

    def get_attn_backend_cls(self, selected_backend, selector_config, num_heads=None):
        return self.answer


class OpaquePlatform(TracingPlatform):
    def opaque_attention_op(self):
        return True


def _compile(platform_cls, backend: str, level="quick"):
    platform = platform_cls(f"{__name__}.{backend}")
    ctx = CheckContext("test", platform, seed=1234, level=level)
    units = records()["attention.compile"].units(Inventory("test", platform, {}, {}, {}), "attention", "compile",
                                                 level)
    return [(u, run_unit(ctx, u)[0]) for u in units]


def test_the_dense_backend_computes_attention_as_the_oracle_does():
    """Without this its compile PASS would grade nothing: the dense backend is right, eagerly, on cases with a
    window, soft cap, ALiBi and sinks (the step cases' features and more)."""
    atol, rtol = ATTN_TOLERANCES[torch.float32]
    for name in ("chunked_prefill", "mixed_window", "softcap_alibi", "sinks_window", "non_causal"):
        batch = make_batch(CASES_BY_NAME[name], torch.float32, "auto", seed=5)
        out, _, _ = BackendRun(DenseBackend, batch).run()
        tokens = batch.num_actual_tokens
        torch.testing.assert_close(out[:tokens].double(), oracle(batch.problem), atol=atol, rtol=rtol)
        assert torch.isnan(out[tokens:]).all(), name


def test_a_traceable_backend_passes_with_its_code_in_the_graph():
    ((unit, verdict),) = _compile(TracingPlatform, "DenseBackend")
    assert unit.dtype == "float32"
    assert verdict.outcome is Outcome.PASS, verdict.message
    assert "the backend's code traced in one graph" in verdict.message and "reused the graph" in verdict.message


def test_the_same_backend_is_not_traced_where_attention_is_one_opaque_op():
    """On a platform whose opaque_attention_op() is True (our cpu platform, vLLM's) Dynamo never enters the backend:
    a SKIP naming why, never a PASS about the op wrapped around it."""
    for backend in ("DenseBackend", "CompiledElsewhere"):
        ((_, verdict),) = _compile(OpaquePlatform, backend)
        assert verdict.outcome is Outcome.SKIP, verdict.message
        assert verdict.message.startswith("not traced: the platform's opaque_attention_op() is True (OpaquePlatform)")
        assert f"never traces {__name__}.{backend}'s code" in verdict.message


@pytest.mark.parametrize("backend, fragment", [
    ("CompiledElsewhere", "batch 1: the compiled layer differs from eager"),
    ("PerBatch", "compiled another graph: the graph guards on a batch's sizes or metadata"),
])
def test_planted_compile_faults_fail_naming_them(backend, fragment):
    ((_, verdict),) = _compile(TracingPlatform, backend)
    assert verdict.outcome is Outcome.FAIL and fragment in verdict.message, verdict.message


def test_a_backend_that_cannot_be_traced_fails_on_a_platform_that_lets_dynamo_in():
    """The reference backend branches on a data-dependent slot count: untraceable, so a FAIL where the platform does
    not hide it behind the opaque op."""
    ((_, verdict),) = _compile(TracingPlatform, "UntraceableReference")
    assert verdict.outcome is Outcome.FAIL
    assert "cannot trace the backend, and the platform does not run attention as one opaque op" in verdict.message
