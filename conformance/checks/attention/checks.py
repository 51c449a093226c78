"""Attention family: a platform's attention backends (what `Platform.get_attn_backend_cls` selects) on paged
batches, against the float64 oracle (reference_impl/attention/oracle.py) and the reference backend as native.

forward: the output against the oracle, graded like numerics; a FAIL names what the backend computes instead
(conformance.checks.attention.diagnosis). cache_write: blocks the slot mapping does not address (the null block,
the spare ones) byte-identical through every write; forward leaves the cache alone when the layer writes it.
aliasing: the result is in `output`, inputs and metadata unchanged. steps: one impl and builder over a sequence
of batches. compile: the backend's own code traced by torch.compile against eager (a SKIP where the platform runs
attention as one opaque op, which Dynamo never enters). dispatch: the selection resolves, and each declared
capability matches behaviour.
Units and which backends a platform brings: conformance.checks.attention.units.
"""

from __future__ import annotations

import torch

from conformance.checks.attention.units import (
    NONE,
    OP,
    aliasing_units,
    backend_dtypes,
    declared_block,
    cache_write_units,
    compile_units,
    dispatch_units,
    forward_units,
    split_case,
    steps_units,
)
from conformance.judge.comparison import DECLINE
from conformance.checks.common import (
    OVERRIDE_FACTOR,
    CheckContext,
    KernelRaised,
    Verdict,
    call_impl,
    compare_outputs,
    exception_line,
    failed,
    memory_skip,
    not_supported,
    passed,
    unit_dtype,
)
from conformance.checks.record import check
from conformance.collect.attention import selector_configs
from conformance.collect.units import Unit, dtype_name, unit_seed
from conformance.results.result import Outcome

HINT = "(ATTN_TOLERANCES in reference_impl/ir/tolerances.py, the same for every backend)"
ATTN_DECLINE = ("fix the backend, or declare what the case needs unsupported (its capability predicates, "
                "validate_configuration) so that platforms select another backend for it")
OVERRIDE_NOTE = f" (an override is offered up to {OVERRIDE_FACTOR:g}x)"


def _bridged(ctx: CheckContext) -> Verdict | None:
    """SKIP for a platform a bridge translates (`--platform=vllm`) whose runtime's backend the bridge cannot run
    (conformance.vllm.attention_bridge says why): the reference backend it was given instead grades nothing."""
    bridged = getattr(ctx.platform, "conformance_class", None)
    if isinstance(bridged, str):
        why = getattr(ctx.platform, "conformance_attention_not_covered", None) or "the bridge cannot run its backend"
        return Verdict(Outcome.SKIP, f"not covered: the attention backend of {bridged} is not graded through the "
                       f"bridge: {why}; nothing is graded")
    return None


def _not_brought(ctx: CheckContext, unit: Unit) -> Verdict | None:
    if unit.provider == NONE:
        return _bridged(ctx) or Verdict(Outcome.NOT_IMPLEMENTED, "the platform brings no attention backend: "
                                        "get_attn_backend_cls returns the reference backend "
                                        "(reference_impl.attention.reference) for every case")
    return None


def _backend(ctx: CheckContext, unit: Unit):
    """The unit's backend class. A registry name a kernel module registers when the platform first selects it is
    known in this process once the platform has been asked (as the controller asked it to list the units)."""
    from conformance.collect.attention import brought_backends
    from reference_impl.attention.registry import AttentionBackendEnum, resolve

    known = unit.provider in AttentionBackendEnum and (AttentionBackendEnum[unit.provider].value is not None
                                                       or AttentionBackendEnum[unit.provider].is_overridden())
    if not known and "." not in unit.provider:   # e.g. CUSTOM, a placeholder until the platform registers it
        brought_backends(ctx.platform)
    return call_impl(f"resolving attention backend {unit.provider!r}", resolve, unit.provider)


ADVICE = ("If the backend cannot serve this case, declare it unsupported (its capability predicates, "
          "validate_configuration), so that platforms select another backend for it; otherwise this is a bug in it")


def attention_errors(body):
    """A raise of the backend is ERROR naming the call, with the attention advice (not the IR's supports_args)."""
    import functools

    from conformance.checks.common import error_from

    @functools.wraps(body)
    def run(ctx: CheckContext, unit: Unit) -> Verdict:
        try:
            return body(ctx, unit)
        except KernelRaised as exc:
            verdict = error_from(exc.exc, exc.where)
            first, sep, rest = verdict.message.partition("\n")
            verdict.message = f"{first.rstrip('. ')}. {ADVICE}{sep}{rest}"
            return verdict

    return run


def _seed(ctx: CheckContext, unit: Unit) -> int:
    return unit_seed(ctx.seed, OP, unit.case, unit.dtype)


def _where(unit: Unit, case, kv: str, seed: int, ctx: CheckContext) -> str:
    return (f" [backend {unit.provider}, {unit.dtype}, case {case.name}: {case.describe(kv)}; catches: {case.catches}; "
            f"seed {ctx.seed} (input seed {seed})]")


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    from reference_impl.ir.tolerances import ATTN_TOLERANCES

    return ATTN_TOLERANCES[dtype]


def _native(case, dtype, kv, seed, device) -> torch.Tensor:
    """The reference backend's output rows `[:num_actual_tokens]` for the batch (on the CPU)."""
    from reference_impl.attention.batch import make_batch

    return _native_on(make_batch(case, dtype, kv, seed, device))


def _native_on(batch) -> torch.Tensor:
    """The reference backend's output rows `[:num_actual_tokens]` on `batch` (its own cache; the batch's tensors are
    only read), on the CPU."""
    from reference_impl.attention.batch import BackendRun
    from reference_impl.attention.reference import ReferenceAttentionBackend

    out, _, _ = BackendRun(ReferenceAttentionBackend, batch).run()
    return out[: batch.num_actual_tokens].cpu()


# At most this many runs of consecutive requests with a wrong token are spelled out; the rest are counted.
SHOWN_REQUEST_RUNS = 3


def bad_requests(got: torch.Tensor, native: torch.Tensor, query_lens, atol: float, rtol: float) -> str:
    """Which tokens and requests of the batch hold an element outside atol + rtol*|native| (or NaN where native is
    not): how many of each, the first bad token as a request's token, and the runs of bad requests. A kernel whose
    grid covers a fixed number of requests or tokens shows as one run from the limit to the last request ("requests
    4096..65536"). Empty when no token is bad."""
    a, b = got.to(torch.float64), native.to(torch.float64)
    bad = ((a - b).abs() > atol + rtol * b.abs()) | (torch.isnan(a) != torch.isnan(b))
    tokens = bad.reshape(bad.shape[0], -1).any(dim=1).nonzero().flatten()
    if tokens.numel() == 0:
        return ""
    lens = torch.tensor(list(query_lens), dtype=torch.int64)
    ends = lens.cumsum(0)
    requests = torch.searchsorted(ends, tokens, right=True)
    first_t, first_r = int(tokens[0]), int(requests[0])
    distinct = requests.unique_consecutive()
    breaks = (distinct[1:] != distinct[:-1] + 1).nonzero().flatten()
    starts = [int(distinct[0])] + [int(distinct[i + 1]) for i in breaks]
    stops = [int(distinct[i]) for i in breaks] + [int(distinct[-1])]
    runs = [f"request {lo}" if lo == hi else f"requests {lo}..{hi}" for lo, hi in
            zip(starts[:SHOWN_REQUEST_RUNS], stops[:SHOWN_REQUEST_RUNS])]
    more = len(starts) - len(runs)
    shown = ", ".join(runs) + (f" and {more} more run{'s' if more > 1 else ''}" if more else "")
    return (f"; by request: {tokens.numel()} of {int(ends[-1])} tokens in {distinct.numel()} of {len(lens)} requests "
            f"are wrong, first bad request {first_r} (its token {first_t - int(ends[first_r] - lens[first_r])}, token "
            f"{first_t} of the batch; bad: {shown})")


def grade(got: torch.Tensor, native: torch.Tensor, problem, case, dtype: torch.dtype):
    """Comparison of the backend's rows against native, graded against the float64 oracle; a FAIL's advice names
    what the backend computes instead where one perturbation of the oracle matches."""
    from conformance.checks.attention.diagnosis import followed_perturbation
    from reference_impl.attention.oracle import oracle

    atol, rtol = _tolerance(dtype)
    cmp = compare_outputs(got, native, oracle(problem), atol=atol, rtol=rtol, compare_nan=True, dtype=dtype,
                          tolerance_hint=HINT)
    if cmp.outcome is Outcome.FAIL and cmp.advice is not None:
        followed = followed_perturbation(got, problem, case, dtype, atol, rtol)
        cmp = cmp.with_advice(followed if followed is not None else
                              cmp.advice.replace(DECLINE, ATTN_DECLINE).replace(OVERRIDE_NOTE, ""))
    return cmp


def _truncation(got, problem, dtype) -> str | None:
    """diagnosis.fp8_truncation at the dtype's tolerance: the backend's fp8 writer truncates."""
    from conformance.checks.attention.diagnosis import fp8_truncation

    atol, rtol = _tolerance(dtype)
    return fp8_truncation(got, problem, dtype, atol, rtol)


def _reads_unwritten(ctx, backend, case, dtype, kv, seed, got) -> str:
    """Whether the backend's output depends on cache slots nobody wrote: the same batch on a cache whose initial
    (never written) contents differ gives another result. Layout-agnostic: the slots themselves are not read."""
    from reference_impl.attention.batch import BackendRun, make_batch

    batch = make_batch(case, dtype, kv, seed, ctx.device)
    batch.cache_seed += 1
    try:
        out, _, _ = BackendRun(backend, batch, call=call_impl).run()
    except KernelRaised:
        return ""
    atol, rtol = _tolerance(dtype)
    other = out[: batch.num_actual_tokens].cpu()
    if compare_outputs(other, got, None, atol=atol, rtol=rtol, compare_nan=True, dtype=dtype,
                       tolerance_hint="").outcome is not Outcome.FAIL:
        return ""
    bound = (f" (max_seq_len here is an upper bound: {batch.metadata.max_seq_len} > {max(case.seq_lens)})"
             if case.max_seq_len_extra else "")
    return (". The output changes with the initial contents of cache slots no request wrote (the same batch on a "
            "cache filled with other values gives another result): the backend reads keys past seq_lens[i], up to "
            f"max_seq_len or through the block table's padding{bound}; read each request's own seq_lens")


def _returned_elsewhere(out, returned, tokens) -> str | None:
    if isinstance(returned, torch.Tensor) and returned is not out and torch.isnan(out[:tokens]).any():
        return ("forward returned its result in another tensor and left `output` unwritten (its NaN pre-fill "
                "kept): the layer uses `output` only and discards what forward returns (vLLM's "
                "unified_attention_with_output); write the result into `output`")
    return None


# ----- forward ------------------------------------------------------------------------------------------------
@check("attention", "forward", units=forward_units)
@attention_errors
def forward(ctx: CheckContext, unit: Unit) -> Verdict:
    from conformance.checks.attention.diagnosis import fp8_truncation
    from reference_impl.attention.batch import BackendRun, make_batch
    from reference_impl.attention.cases import case_named, ordered_for

    if (verdict := _not_brought(ctx, unit)) is not None:
        return verdict
    backend = _backend(ctx, unit)
    name, kv = split_case(unit.case)
    dtype, seed = unit_dtype(unit), _seed(ctx, unit)
    case = case_named(name, seed, backend)
    if case is None:
        return not_supported(f"case {name}: the backend declares none of the head sizes and block sizes drawn from")
    if (skip := memory_skip(case, ctx.device)) is not None:
        return skip
    case = declared_block(backend, ordered_for(backend, case))
    where = _where(unit, case, kv, seed, ctx)
    batch = make_batch(case, dtype, kv, seed, ctx.device)
    native = _native_on(batch)
    out, returned, _ = BackendRun(backend, batch, call=call_impl).run()
    got = out[: batch.num_actual_tokens].cpu()
    if (message := _returned_elsewhere(out, returned, batch.num_actual_tokens)) is not None:
        return failed(message + where)
    cmp = grade(got, native, batch.problem, case, dtype)
    errs = {"max_abs_err": cmp.max_abs_err, "max_rel_err": cmp.max_rel_err, "err_to_tol": cmp.err_to_tol}
    if cmp.outcome is Outcome.FAIL:
        atol, rtol = _tolerance(dtype)
        truncation = fp8_truncation(got, batch.problem, dtype, atol, rtol)
        if truncation is not None:
            return Verdict(Outcome.QUALITY_WARNING, f"{truncation}{where}", **errs)
        named = cmp.advice is not None and cmp.advice.startswith("The output is the oracle's")
        note = "" if named else _reads_unwritten(ctx, backend, case, dtype, kv, seed, got)
        requests = bad_requests(got, native, case.query_lens, atol, rtol)
        return failed(cmp.message + note + requests + where, **errs)
    return Verdict(cmp.outcome, cmp.message + (where if cmp.outcome is not Outcome.PASS else ""), **errs)


# ----- cache_write ----------------------------------------------------------------------------------------------
def _changed_blocks(cache: torch.Tensor, before: torch.Tensor) -> list[int]:
    """The blocks whose bytes differ from `before` (`_block_bytes` of the cache earlier)."""
    return [int(b) for b in (_words(cache) != before).any(dim=1).nonzero().flatten()]


def _block_bytes(cache: torch.Tensor) -> torch.Tensor:
    """A copy of each block's bytes, a row per block (compared as 8-byte words where a block's bytes allow: the size
    cases' caches hold 65,547 blocks)."""
    return _words(cache).clone()


def _words(cache: torch.Tensor) -> torch.Tensor:
    flat = cache.reshape(cache.shape[0], -1)
    raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    return raw.view(torch.int64) if raw.shape[1] % 8 == 0 and raw.is_contiguous() else raw


def _describe_blocks(blocks: list[int], num_blocks: int) -> str:
    parts = []
    for b in blocks:
        if b == 0:
            parts.append("block 0 (the null block)")
        elif b == num_blocks - 1:
            parts.append(f"block {b} (the last, where a slot of -1 used as an index lands)")
        else:
            parts.append(f"block {b}")
    return ", ".join(parts)


def _named_case_batch(ctx: CheckContext, unit: Unit, backend):
    """(case, where, batch) of a unit naming one declared case: the case at a block size the backend declares, in
    the order its builder wants, and the batch built from it with the unit's dtype, KV dtype and seed."""
    from reference_impl.attention.batch import make_batch
    from reference_impl.attention.cases import CASES_BY_NAME, ordered_for

    name, kv = split_case(unit.case)
    case, dtype, seed = declared_block(backend, ordered_for(backend, CASES_BY_NAME[name])), unit_dtype(unit), \
        _seed(ctx, unit)
    return case, _where(unit, case, kv, seed, ctx), make_batch(case, dtype, kv, seed, ctx.device)


@check("attention", "cache_write", units=cache_write_units)
@attention_errors
def cache_write(ctx: CheckContext, unit: Unit) -> Verdict:
    from reference_impl.attention.batch import BackendRun

    if (verdict := _not_brought(ctx, unit)) is not None:
        return verdict
    backend = _backend(ctx, unit)
    case, where, batch = _named_case_batch(ctx, unit, backend)
    run = BackendRun(backend, batch, call=call_impl)
    n = batch.num_blocks
    unaddressed = sorted(set(range(n)) - set(batch.addressed_blocks))
    start = _block_bytes(run.cache)

    padding = torch.full_like(batch.metadata.slot_mapping, -1)
    call_impl("do_kv_cache_update (every slot -1)", run.impl.do_kv_cache_update, run.layer, batch.key, batch.value,
              run.cache, padding)
    if changed := _changed_blocks(run.cache, start):
        return failed(f"do_kv_cache_update with every slot -1 (all tokens padding) changed "
                      f"{_describe_blocks(changed, n)}: a slot < 0 must not be written{where}")
    run.write_context()
    run.write_new()
    if bad := [b for b in _changed_blocks(run.cache, start) if b in unaddressed]:
        return failed(f"writing the context and the new tokens ({case.padding} of them padding with slot -1) changed "
                      f"{_describe_blocks(bad, n)}, which slot_mapping does not address: a padded slot written, or "
                      f"a slot mapped to the wrong block{where}")
    md = run.build()
    written = _block_bytes(run.cache)
    run.forward(md)
    changed = _changed_blocks(run.cache, written)
    if backend.forward_includes_kv_cache_update:
        if bad := [b for b in changed if b in unaddressed]:
            return failed(f"forward (which writes the new tokens itself: forward_includes_kv_cache_update=True) "
                          f"changed {_describe_blocks(bad, n)}, which slot_mapping does not address{where}")
    elif changed:
        return failed(f"forward wrote the cache ({_describe_blocks(changed, n)}) although the backend declares "
                      "forward_includes_kv_cache_update=False: the layer writes it through do_kv_cache_update, and "
                      f"forward must only read it{where}")
    below = f", {case.first_block - 1} below the batch's first block" if case.first_block > 1 else ""
    return passed(f"{len(unaddressed)} unaddressed blocks (null block 0{below} and "
                  f"{len(unaddressed) - case.first_block} spare) "
                  f"byte-identical through an all-padding write, the context and new tokens ({case.padding} padded), "
                  "and forward")


# ----- aliasing -------------------------------------------------------------------------------------------------
METADATA_FIELDS = ("num_reqs", "num_actual_tokens", "max_query_len", "max_seq_len", "causal")


@check("attention", "aliasing", units=aliasing_units)
@attention_errors
def aliasing(ctx: CheckContext, unit: Unit) -> Verdict:
    from conformance.checks.common import storage_bytes
    from reference_impl.attention.batch import BackendRun

    if (verdict := _not_brought(ctx, unit)) is not None:
        return verdict
    backend = _backend(ctx, unit)
    case, where, batch = _named_case_batch(ctx, unit, backend)
    inputs = batch.tensors()
    values = {n: t.clone() for n, t in inputs}
    storages = {n: storage_bytes(t) for n, t in inputs}
    fields = {f: getattr(batch.metadata, f) for f in METADATA_FIELDS}
    out, returned, _ = BackendRun(backend, batch, call=call_impl).run()
    tokens = batch.num_actual_tokens
    if (message := _returned_elsewhere(out, returned, tokens)) is not None:
        return failed(message + where)
    unwritten = int(torch.isnan(out[:tokens]).sum())
    if unwritten:
        return failed(f"forward left {unwritten} of {out[:tokens].numel()} elements of output[:num_actual_tokens] "
                      f"unwritten (the NaN pre-fill kept){where}")
    changed = [n for n, t in inputs if not torch.equal(t, values[n])]     # the inputs hold no NaN
    outside = [n for n, t in inputs if n not in changed and not torch.equal(storage_bytes(t), storages[n])]
    if changed or outside:
        what = ", ".join(changed) or "nothing inside the views"
        extra = f"; storage outside the views of {', '.join(outside)} changed too" if outside else ""
        return failed(f"building the metadata and forward changed their inputs: {what}{extra} (the runner reuses "
                      f"them across layers and steps){where}")
    moved = [f"{f} {fields[f]!r} -> {getattr(batch.metadata, f)!r}" for f in METADATA_FIELDS
             if getattr(batch.metadata, f) != fields[f]]
    if moved:
        return failed(f"the builder changed CommonAttentionMetadata ({'; '.join(moved)}): it is shared by every "
                      f"layer's builder{where}")
    note = "" if returned is None or returned is out else "; forward returned another tensor, also written in output"
    return passed(f"the result is in output; query, key, value, sinks and every metadata tensor and field "
                  f"unchanged{note}")


# ----- steps ----------------------------------------------------------------------------------------------------
def step_cases():
    """The step sequence: one layer configuration, four batches; the last on a re-allocated cache."""
    from reference_impl.attention.cases import AttentionCase

    common = {"num_heads": 8, "num_kv_heads": 2, "head_size": 64, "block_size": 16, "sliding_window": 24,
              "logits_soft_cap": 30.0, "kv_dtypes": ("auto", "fp8_e4m3", "fp8_e5m2")}
    return [
        ("a prefill of 4 requests", AttentionCase("step1_prefill", (7, 12, 5, 9), (7, 12, 5, 9), "steps", **common)),
        ("a decode of the 4", AttentionCase("step2_decode", (1, 1, 1, 1), (8, 13, 6, 10), "steps", **common)),
        ("a chunked prefill of 2 requests (a smaller batch after a larger one)",
         AttentionCase("step3_chunk", (5, 3), (30, 21), "steps", **common)),
        ("a mixed batch of 3 on a re-allocated cache tensor",
         AttentionCase("step4_new_cache", (1, 4, 1), (40, 20, 3), "steps", **common)),
    ]


@check("attention", "steps", units=steps_units)
@attention_errors
def steps(ctx: CheckContext, unit: Unit) -> Verdict:
    from reference_impl.attention.batch import BackendRun, make_batch

    if (verdict := _not_brought(ctx, unit)) is not None:
        return verdict
    backend = _backend(ctx, unit)
    _, kv = split_case(unit.case)
    dtype, seed = unit_dtype(unit), _seed(ctx, unit)
    from reference_impl.attention.cases import ordered_for

    sequence = [(what, declared_block(backend, ordered_for(backend, case))) for what, case in step_cases()]
    batches = [make_batch(case, dtype, kv, seed + i, ctx.device) for i, (_, case) in enumerate(sequence)]
    first = BackendRun(backend, batches[0], call=call_impl,
                       cache=batches[0].new_cache(max(b.num_blocks for b in batches[:3])))
    worst, truncated = 0.0, ""
    for i, ((what, case), batch) in enumerate(zip(sequence, batches)):
        cache = first.cache if i < 3 else batch.new_cache(batch.num_blocks + 3)
        run = first if i == 0 else BackendRun(backend, batch, call=call_impl, layer=first.layer,
                                              builder=first.builder, cache=cache)
        out, returned, _ = run.run()
        tokens = batch.num_actual_tokens
        native = _native(case, dtype, kv, seed + i, ctx.device)
        cmp = grade(out[:tokens].cpu(), native, batch.problem, case, dtype)
        where = f" [backend {unit.provider}, {unit.dtype}, kv_cache_dtype {kv}, step {i + 1} of {len(sequence)}: " \
                f"{what}: {case.describe(kv)}; seed {ctx.seed}]"
        if cmp.outcome is Outcome.FAIL and (truncation := _truncation(out[:tokens].cpu(), batch.problem, dtype)):
            truncated = truncated or f"step {i + 1} ({what}): {truncation}{where}"
            continue
        if cmp.outcome is Outcome.FAIL:
            return failed(f"step {i + 1} ({what}): {cmp.message}{_fresh_note(i, backend, case, dtype, kv, seed, ctx, native)}"
                          f"{where}", max_abs_err=cmp.max_abs_err, max_rel_err=cmp.max_rel_err,
                          err_to_tol=cmp.err_to_tol)
        worst = max(worst, cmp.err_to_tol or 0.0)
    if truncated:
        return Verdict(Outcome.QUALITY_WARNING, f"{len(sequence)} steps on one impl and builder, each within "
                       f"tolerance of the truncating fp8 quantiser's oracle: {truncated}")
    return passed(f"{len(sequence)} steps on one impl and builder (prefill, decode, a smaller chunked batch, a "
                  "re-allocated cache) each within tolerance", err_to_tol=worst)


def _fresh_note(i, backend, case, dtype, kv, seed, ctx, native) -> str:
    """After step 1: whether the same batch passes on a fresh impl, builder and cache (state kept between steps)."""
    from reference_impl.attention.batch import BackendRun, make_batch

    if i == 0:
        return ""
    batch = make_batch(case, dtype, kv, seed + i, ctx.device)
    try:
        out, _, _ = BackendRun(backend, batch, call=call_impl).run()
    except KernelRaised:
        return ""
    if grade(out[: batch.num_actual_tokens].cpu(), native, batch.problem, case, dtype).outcome is Outcome.FAIL:
        return ""
    return (". The same batch passes on a fresh impl, builder and cache: the backend keeps state from an earlier "
            "step (seq_lens or another per-batch tensor kept from a larger batch, or the cache tensor of an earlier "
            "call)")


# ----- compile --------------------------------------------------------------------------------------------------
def not_traced(ctx: CheckContext, unit: Unit) -> Verdict | None:
    """SKIP where the platform runs attention as one opaque custom op (`opaque_attention_op()` True: vLLM's CPU, CUDA
    and ROCm platforms, our cpu platform): torch.compile then never enters the backend, and a compiled run calls the
    same backend code eagerly, so comparing it with eager would grade only the op wrapped around it. None where the
    platform lets Dynamo trace the backend."""
    if not call_impl("the platform's opaque_attention_op", ctx.platform.opaque_attention_op):
        return None
    bridged = getattr(ctx.platform, "conformance_class", None)
    who = (f"{bridged}.opaque_attention_op() is True, so vLLM runs" if isinstance(bridged, str) else
           f"the platform's opaque_attention_op() is True ({type(ctx.platform).__qualname__}), so it runs")
    return Verdict(Outcome.SKIP, f"not traced: {who} attention as one opaque custom op and torch.compile never "
                   f"traces {unit.provider}'s code (compiled and eager run the same calls); nothing of the backend is "
                   "graded here")


@check("attention", "compile", units=compile_units)
@attention_errors
def compile(ctx: CheckContext, unit: Unit) -> Verdict:  # noqa: A001 - the check's name
    """The backend's own code traced: the layer (the cache write through the backend's `do_kv_cache_update`, then
    its `forward`) under torch.compile(fullgraph=True, dynamic=True) against eager on two batches; outputs and cache
    bytes must equal eager's, and the second batch (fewer requests and tokens) must reuse the graph. A platform
    that never lets Dynamo into the backend (opaque_attention_op) is a SKIP saying so (`not_traced`)."""
    from conformance.checks.compile import availability
    from reference_impl.attention.batch import BackendRun, make_batch
    from reference_impl.attention.cases import ordered_for

    if (verdict := _not_brought(ctx, unit)) is not None:
        return verdict
    if (reason := availability()) is not None:
        return Verdict(Outcome.SKIP, reason)
    if (verdict := not_traced(ctx, unit)) is not None:
        return verdict
    backend = _backend(ctx, unit)
    dtype, seed = unit_dtype(unit), _seed(ctx, unit)
    sequence = step_cases()
    cases = [declared_block(backend, ordered_for(backend, sequence[i][1])) for i in (0, 2)]
    batches = [make_batch(c, dtype, "auto", seed + i, ctx.device) for i, c in enumerate(cases)]
    first = BackendRun(backend, batches[0], call=call_impl)
    layer = first.layer
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, cache, md, slots: layer(q, k, v, cache, md, slots),
                             backend=counting, fullgraph=True, dynamic=True)
    where = (f" [backend {unit.provider}, {unit.dtype}, batches {cases[0].describe()} then {cases[1].describe()}; "
             f"seed {ctx.seed}]")
    counts = []
    for i, batch in enumerate(batches):
        run = first if i == 0 else BackendRun(backend, batch, call=call_impl, layer=layer, builder=first.builder)
        run.write_context()
        md = run.build()
        eager_cache, compiled_cache = run.cache.clone(), run.cache.clone()
        slots = batch.metadata.slot_mapping
        eager = call_impl("the layer, eager", layer, batch.query, batch.key, batch.value, eager_cache, md, slots)
        try:
            got = compiled(batch.query, batch.key, batch.value, compiled_cache, md, slots)
        except Exception as exc:  # noqa: BLE001 - a tracing failure is the result
            return failed(f"torch.compile(fullgraph=True) cannot trace the backend, and the platform does not run "
                          f"attention as one opaque op (opaque_attention_op() is False): {exception_line(exc)}. Make "
                          f"the backend traceable, or return True from opaque_attention_op{where}")
        counts.append(len(graphs))
        atol, rtol = _tolerance(dtype)
        cmp = compare_outputs(got[:batch.num_actual_tokens], eager[:batch.num_actual_tokens], None, atol=atol,
                              rtol=rtol, compare_nan=True, dtype=dtype,
                              tolerance_hint="(compiled and eager must agree)")
        if cmp.outcome is Outcome.FAIL:
            return failed(f"batch {i + 1}: the compiled layer differs from eager: {cmp.message}{where}")
        if not torch.equal(compiled_cache, eager_cache):
            return failed(f"batch {i + 1}: the compiled layer left other KV-cache bytes than eager{where}")
    if counts[1] != counts[0]:
        return failed(f"the second batch ({len(cases[1].query_lens)} requests, {sum(cases[1].query_lens)} tokens, "
                      f"after {len(cases[0].query_lens)} and {sum(cases[0].query_lens)}) compiled another graph: the "
                      f"graph guards on a batch's sizes or metadata, so every batch recompiles{where}")
    return passed(f"the backend's code traced in one graph (fullgraph, dynamic): its cache write and forward, "
                  f"compiled, equal eager on two batches, cache included, and the second batch reused the graph "
                  f"({counts[0]} graph{'s' if counts[0] != 1 else ''})")


# ----- dispatch -------------------------------------------------------------------------------------------------
@check("attention", "dispatch", units=dispatch_units)
@attention_errors
def dispatch(ctx: CheckContext, unit: Unit) -> Verdict:
    if unit.case == "resolve":
        return _resolve(ctx)
    if (verdict := _not_brought(ctx, unit)) is not None:
        return verdict
    return _probe(ctx, unit, _backend(ctx, unit))


def _resolve(ctx: CheckContext) -> Verdict:
    """Every selector config the family asks resolves to an importable backend with the contract's class methods."""
    from reference_impl.attention.registry import REFERENCE_BACKEND, AttentionBackendEnum, resolve

    platform = ctx.platform
    chosen: dict[str, int] = {}
    unregistered = set()
    count = 0
    for case, dtype, kv, config in selector_configs(platform):
        count += 1
        label = f"head_size={config.head_size}, {dtype_name(dtype)}, kv_cache_dtype={kv}, features {case.features()}"
        qualname = call_impl(f"get_attn_backend_cls ({label})", platform.get_attn_backend_cls, None, config,
                             case.num_heads)
        if not isinstance(qualname, str):
            return failed(f"get_attn_backend_cls returned a {type(qualname).__name__} for {label}: it returns the "
                          "backend's qualname (a string), as vLLM 0.32's hook does")
        try:
            backend = resolve(qualname)
        except Exception as exc:  # noqa: BLE001 - the platform named something that is not there
            return failed(f"get_attn_backend_cls returned {qualname!r} for {label}, which does not resolve: "
                          f"{exception_line(exc)}")
        missing = [m for m in ("get_name", "get_impl_cls", "get_builder_cls", "validate_configuration")
                   if not callable(getattr(backend, m, None))]
        if missing:
            return failed(f"{qualname} (selected for {label}) has no {', '.join(missing)}: an attention backend "
                          "subclasses reference_impl.attention.AttentionBackend")
        backend_name = call_impl(f"{qualname}.get_name", backend.get_name)
        if backend_name not in AttentionBackendEnum:
            unregistered.add(f"{backend_name} ({qualname})")
        chosen[qualname] = chosen.get(qualname, 0) + 1
    if set(chosen) == {REFERENCE_BACKEND}:
        return passed(f"get_attn_backend_cls resolves for all {count} selector configs, to the reference backend: the "
                      "platform brings no attention backend of its own")
    summary = "; ".join(f"{q} for {n}" for q, n in sorted(chosen.items()))
    note = (f"; get_name() of {', '.join(sorted(unregistered))} is not a registered name: vLLM's Attention looks "
            "it up with AttentionBackendEnum[get_name()], so register it (register_backend(name, class_path))"
            if unregistered else "")
    return passed(f"get_attn_backend_cls resolves for all {count} selector configs: {summary}{note}")


def _probe(ctx: CheckContext, unit: Unit, backend) -> Verdict:
    """One capability: declared or not, against what the backend does with a case that needs it."""
    from reference_impl.attention.batch import BackendRun, make_batch
    from reference_impl.attention.cases import PROBES, ordered_for

    probe = PROBES[unit.case]
    declared = bool(probe.declared(backend))
    dtypes = backend_dtypes(ctx.platform, backend) or [d for d in ctx.platform.supported_dtypes]
    dtype = getattr(torch, probe.dtype) if probe.dtype else dtypes[0]
    case, kv = ordered_for(backend, probe.case), probe.kv_cache_dtype
    if not unit.case.startswith("block_size_"):
        case = declared_block(backend, case)
    seed = unit_seed(ctx.seed, OP, unit.case, dtype_name(dtype))
    said = (f"{probe.feature} is declared ({probe.declare})" if declared else
            f"{probe.feature} is declared unsupported ({probe.declare})")
    where = f" [backend {unit.provider}, {dtype_name(dtype)}, probe case: {case.describe(kv)}; seed {ctx.seed}]"
    try:
        native = _native(case, dtype, kv, seed, ctx.device)
        batch = make_batch(case, dtype, kv, seed, ctx.device)
        out, returned, _ = BackendRun(backend, batch, call=call_impl).run()
    except KernelRaised as exc:
        if declared:
            return failed(f"{said}, but {exc.where} raised {exception_line(exc.exc)}{where}")
        return not_supported(f"{said}, and the backend refuses it: {exc.where} raised {exception_line(exc.exc)}{where}")
    tokens = batch.num_actual_tokens
    cmp = grade(out[:tokens].cpu(), native, batch.problem, case, dtype)
    if (message := _returned_elsewhere(out, returned, tokens)) is not None:
        return failed(f"{said}: {message}{where}")
    if cmp.outcome is Outcome.FAIL and (truncation := _truncation(out[:tokens].cpu(), batch.problem, dtype)):
        return Verdict(Outcome.QUALITY_WARNING, f"{said} and computed, but {truncation}{where}",
                       max_abs_err=cmp.max_abs_err, max_rel_err=cmp.max_rel_err, err_to_tol=cmp.err_to_tol)
    if cmp.outcome is Outcome.FAIL:
        advice = ("" if declared else ": a backend that cannot compute it must raise (NotImplementedError or "
                  "ValueError) rather than return a wrong result")
        return failed(f"{said}, and the result is wrong{advice}: {cmp.message}{where}", max_abs_err=cmp.max_abs_err,
                      max_rel_err=cmp.max_rel_err, err_to_tol=cmp.err_to_tol)
    if declared:
        return passed(f"{said} and computed within tolerance")
    return passed(f"{said}, yet computed within tolerance: declare it ({probe.declare}), so that platforms "
                  f"select this backend for it{where}")
