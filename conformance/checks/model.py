"""Model family: a small decoder built from the reference layers, the platform's implementations against native,
at the shapes a runtime uses: a prefill of packed prompts of different lengths, then decode steps of one
token per sequence against the paged KV cache.

The reference run builds the decoder with no CustomOp replacement, every CustomOp on
`forward_native` (custom_ops none), every IR op forced to native and its attention on the REFERENCE
backend. The platform run builds the same decoder (same checkpoint) under the platform: its replacements
are constructed, its IR priorities select, and its attention runs on the backend its
`get_attn_backend_cls` selects, writing and reading the paged cache end to end (a backend that declares the
decoder's configuration unsupported, e.g. vLLM's CPU_ATTN its head size 16, is left to the attention family and
the platform run attends on REFERENCE, which the message says). Both prefill `PROMPT_LENS` prompts and decode greedily for `NEW_TOKENS` tokens;
the logits of every position computed on a common prefix must be within `MODEL_TOLERANCES` of
native's (graded against a float64 full recompute for QUALITY_WARNING), and the tokens must be
identical. The `compiled` case runs the platform's model through `compile_module`
(REFERENCE_COMPILE, inner compiler aot_eager), then a second batch with fewer sequences and other
lengths, which must not compile another graph (tokens and sequences are dynamic dimensions).

The model and prompts are fixed (`MODEL_SEED`), not drawn from the run's seed: at every step the
native top-1/top-2 gap of every sequence is more than twice what a flip needs (both logits moving
by their full tolerance) in every dtype (tests/runtime/test_model.py), so a platform within tolerance
cannot flip a token. The hidden size is odd (65), like the numerics cases, so kernels that
mishandle a tail past a power-of-two width show up here too. Every tensor lives on the platform's
device.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from conformance.checks.common import (
    CheckContext,
    KernelRaised,
    Verdict,
    call_impl,
    compare_outputs,
    exception_line,
    failed,
    native_only,
    passed,
    unit_dtype,
)
from conformance.checks.record import check
from conformance.collect.inventory import Inventory
from conformance.collect.units import Unit, dtype_name
from conformance.results.result import Outcome

MODEL_NAME = "decoder"
CASES = ("eager", "compiled")
MODEL_SEED = 173
PROMPT_LENS = (6, 2, 5)        # one prefill of 13 packed tokens, then decode steps of 3 sequences
PROMPT_SEEDS = (174, 1073, 197)  # chosen for wide greedy margins (tests/runtime/test_model.py)
SECOND_BATCH = (1, 2)          # compiled: the prompts rerun as a batch of 2 must reuse the graph
NEW_TOKENS = 4


def model_tolerances() -> dict[torch.dtype, tuple[float, float]]:
    """Per dtype, the (atol, rtol) the logits are judged by: the `MODEL_TOLERANCES` entry of the one
    tolerance table, reference_impl/ir/tolerances.py (imported on call, like every reference module
    this module uses)."""
    from reference_impl.ir.tolerances import MODEL_TOLERANCES

    return MODEL_TOLERANCES


def model_config():
    from reference_impl.models import DecoderConfig

    return DecoderConfig(vocab_size=300, hidden_size=65, intermediate_size=128, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16)


def prompts(config) -> list[list[int]]:
    """The fixed prompts (token ids), drawn on the CPU from seeded generators."""
    return [torch.randint(0, config.vocab_size, (n,), generator=torch.Generator().manual_seed(seed),
                          device="cpu").tolist() for n, seed in zip(PROMPT_LENS, PROMPT_SEEDS)]


# ----- building the two models ---------------------------------------------------------------------
@contextlib.contextmanager
def without_replacements():
    """Every in-tree CustomOp constructs itself inside the block (all register_oot entries set aside)."""
    from reference_impl.custom_op import CustomOp

    saved = dict(CustomOp.op_registry_oot)
    CustomOp.op_registry_oot.clear()
    try:
        yield
    finally:
        CustomOp.op_registry_oot.clear()
        CustomOp.op_registry_oot.update(saved)


NATIVE_ATTENTION = "REFERENCE"   # the reference run's attention backend: the pure-torch paged one


def build_reference(config, dtype: torch.dtype, checkpoint, device="cpu"):
    """The decoder on native everything (attention on the REFERENCE backend), on `device` (call it inside
    `native_only()`)."""
    from reference_impl.config import CompilationConfig, RuntimeConfig, set_current_config
    from reference_impl.models import build_model

    with without_replacements(), set_current_config(RuntimeConfig(CompilationConfig(custom_ops=["none"]))):
        return build_model(config, dtype, checkpoint=checkpoint, device=device, attn_backend=NATIVE_ATTENTION)


@dataclasses.dataclass
class Exercised:
    """What of the platform the decoder ran: IR op -> providers selected, replacement classes, and the attention
    backends its layers selected (over the paged cache)."""

    providers: dict[str, set[str]]
    layers: set[str]
    attention: list[str] = dataclasses.field(default_factory=list)
    attention_note: str = ""     # why the platform's own attention backend did not run, if it did not

    @property
    def anything(self) -> bool:
        return (bool(self.layers) or any(p != "native" for ps in self.providers.values() for p in ps)
                or any(name != NATIVE_ATTENTION for name in self.attention))

    def describe(self) -> str:
        ops = ", ".join(f"{op}: {'/'.join(sorted(ps))}" for op, ps in sorted(self.providers.items()))
        layers = ", ".join(sorted(self.layers)) or "none"
        attention = ", ".join(self.attention) or "none"
        return (f"IR providers selected: {ops or 'none'}; CustomOp replacements: {layers}; attention backend: "
                f"{attention}{self.attention_note}")


def attention_refusal(model) -> str | None:
    """Why the platform's attention backend cannot serve the decoder, as its declarations say (None: it can)."""
    problems = model.model.attention.problems
    if not problems:
        return None
    reasons = sorted({r for rs in problems.values() for r in rs})
    layer = model.model.layers[0].self_attn.attn
    return (f"{', '.join(model.attention_backends)} declares this decoder's attention (head size {layer.head_size}, "
            f"block {layer.block_size}, {str(layer.dtype).removeprefix('torch.')}) unsupported: "
            f"{'; '.join(reasons)}")


def exercised(model, batch: list[list[int]], device) -> Exercised:
    """One probing prefill + decode step of the platform's model: the IR selections and replacement layers."""
    from reference_impl.custom_op import CustomOp
    from reference_impl.models import generate
    from reference_impl.models.introspect import probe_providers

    cache = model.allocate_kv_cache(len(batch), max(map(len, batch)) + 1)
    providers = probe_providers(lambda: generate(model, batch, 2, cache=cache, device=device))
    replacements = set(CustomOp.op_registry_oot.values())
    layers = {f"{type(m).__qualname__}" for m in model.modules() if type(m) in replacements}
    return Exercised(providers, layers, model.attention_backends)


# ----- the check ------------------------------------------------------------------------------------
def _generate(model, batch, device):
    from reference_impl.models import generate

    owner = getattr(model, "module", model)   # a CompiledModule's cache comes from the module it compiled
    cache = owner.allocate_kv_cache(len(batch), max(map(len, batch)) + NEW_TOKENS)
    return generate(model, batch, NEW_TOKENS, cache=cache, device=device, prompt_logits=True)


def _golden(config, checkpoint, batch, tokens, device) -> list[torch.Tensor]:
    """Float64 full recompute (no cache) of every sequence followed by native's tokens: its positions' logits."""
    model = build_reference(config, torch.float64, {k: v.to(torch.float64) for k, v in checkpoint.items()}, device)
    out = []
    with native_only(), torch.no_grad():
        for p, t in zip(batch, tokens):
            ids = torch.tensor(p + t[:-1], device=device)
            out.append(model(ids, torch.arange(ids.numel(), device=device)))
    return out


def _recompiled(runner, batch, device) -> str | None:
    """Run a second, smaller batch of other lengths; a message if that compiled another graph."""
    before = runner.backend.num_compilations
    second = [batch[i] + batch[0][: i + 1] for i in SECOND_BATCH]
    _generate(runner, second, device)
    after = runner.backend.num_compilations
    if after == before:
        return None
    return (f"the compiled decoder compiled {after - before} more graph(s) when the batch went from {len(batch)} "
            f"sequences of lengths {[len(p) for p in batch]} to {len(second)} of {[len(p) for p in second]} "
            "(tokens and sequences are dynamic dimensions: a guard on their sizes recompiles every step)")


def model_units(inventory: Inventory, family: str, check: str, level: str) -> list[Unit]:
    """Per dtype the model declares a tolerance for: eager and compiled (quick: compiled in the first only)."""
    dtypes = inventory.dtypes_for(model_tolerances())
    return [Unit(family, check, MODEL_NAME, None, dtype_name(d), case) for i, d in enumerate(dtypes)
            for case in CASES if case == "eager" or level != "quick" or i == 0]


@check("model", "decoder", units=model_units)
def decoder(ctx: CheckContext, unit: Unit) -> Verdict:
    from reference_impl.config import CompilationConfig, CompilationMode, RuntimeConfig
    from reference_impl.models import build_model, random_checkpoint

    if unit.case not in CASES:
        return Verdict(Outcome.ERROR, f"model case {unit.case!r} is not one of {CASES}")
    dtype = unit_dtype(unit)
    config = model_config()
    # drawn on the CPU (the same model on every device), then kept on the platform's device
    checkpoint = {k: v.to(ctx.device) for k, v in random_checkpoint(config, MODEL_SEED, dtype).items()}
    batch = prompts(config)
    atol, rtol = model_tolerances()[dtype]
    where = (f" [decoder hidden={config.hidden_size} layers={config.num_layers} vocab={config.vocab_size}, "
             f"{unit.case}, {unit.dtype}, model seed {MODEL_SEED}, prompts of {list(PROMPT_LENS)} tokens + "
             f"{NEW_TOKENS - 1} decode steps over the paged KV cache]")

    reference = build_reference(config, dtype, checkpoint, ctx.device)
    with native_only():
        expected = _generate(reference, batch, ctx.device)
    golden = _golden(config, checkpoint, batch, expected.tokens, ctx.device)

    model = call_impl("building the decoder with the platform's layers",
                      lambda: build_model(config, dtype, checkpoint=checkpoint, device=ctx.device))
    refused = attention_refusal(model)
    if refused is not None:   # graded by the attention family on the cases it declares; the rest of the platform here
        model = call_impl("building the decoder with the platform's layers",
                          lambda: build_model(config, dtype, checkpoint=checkpoint, device=ctx.device,
                                              attn_backend=NATIVE_ATTENTION))
    used = call_impl("the decoder on the platform (probing prefill and decode)", exercised, model, batch, ctx.device)
    if refused is not None:
        used.attention_note = f" (the platform's {refused}, so the decoder attended on {NATIVE_ATTENTION})"
    if not used.anything:
        return Verdict(Outcome.NOT_IMPLEMENTED, "the decoder ran entirely on native implementations: the platform "
                       f"brings none of the IR ops, layers or attention backend it uses ({used.describe()}){where}")
    runner = model
    if unit.case == "compiled":
        from conformance.checks.compile import availability

        reason = availability()
        if reason is not None:
            return Verdict(Outcome.SKIP, reason)
        from reference_impl.compilation import compile_module

        torch._dynamo.reset()
        compile_config = RuntimeConfig(CompilationConfig(mode=CompilationMode.REFERENCE_COMPILE, backend="aot_eager"))
        runner = compile_module(model, compile_config)
    try:
        got = call_impl(f"the decoder on the platform ({unit.case})", _generate, runner, batch, ctx.device)
    except KernelRaised as exc:
        told = _told_by_compile(ctx, exc, used) if unit.case == "compiled" else None
        if told is None:
            raise
        return failed(f"the compiled decoder does not compile, for the cause {told} reports with its fix (the same "
                      f"root cause, not told again here): {exception_line(exc.exc)}; {used.describe()}{where}")
    return _verdict(got, expected, golden, dtype, used, where,
                    lambda: call_impl("the compiled decoder on a second batch", _recompiled, runner, batch,
                                      ctx.device) if unit.case == "compiled" else None)


def _told_by_compile(ctx: CheckContext, exc: KernelRaised, used: Exercised) -> str | None:
    """The compile FAIL that already diagnoses why the compiled decoder raised (a provider it selects cannot be
    traced by lowering), or None when the raise is something else."""
    from conformance.checks import tracing
    from conformance.checks.compile import untraceable_compile_failure

    if tracing.classify_lowering_failure(exc.exc) is None:
        return None
    return untraceable_compile_failure(ctx, used.providers)


def _verdict(got, expected, golden, dtype, used, where, recompiled) -> Verdict:
    """Logits per sequence on the common token prefix, then tokens, then (compiled) the graph count."""
    atol, rtol = model_tolerances()[dtype]
    differs = [i for i, step in enumerate(zip(*got.tokens)) if list(step) != [t[i] for t in expected.tokens]]
    same = differs[0] if differs else NEW_TOKENS
    worst_abs, worst_rel, worst_ratio, warning, notes = 0.0, 0.0, 0.0, None, []
    for s in range(len(expected.tokens)):
        rows = expected.prompt_logits[s].shape[0] + min(same, NEW_TOKENS - 1)   # positions on a common prefix
        cmp = compare_outputs(got.sequence_logits(s)[:rows], expected.sequence_logits(s)[:rows], golden[s][:rows],
                              atol=atol, rtol=rtol, compare_nan=True, dtype=dtype,
                              # a requirement, no override: the model's tolerance is the harness's, not a declaration
                              tolerance_hint="(the decoder's logits tolerance, the same for every platform)")
        worst_abs = max(worst_abs, cmp.max_abs_err or 0.0)
        worst_rel = max(worst_rel, cmp.max_rel_err or 0.0)
        worst_ratio = max(worst_ratio, cmp.err_to_tol or 0.0)
        if cmp.outcome is Outcome.FAIL:
            return failed(f"logits of sequence {s} (index = (position, token id)): {cmp.message}; "
                          f"{used.describe()}{where}", max_abs_err=cmp.max_abs_err, max_rel_err=cmp.max_rel_err,
                          err_to_tol=cmp.err_to_tol)
        if cmp.outcome is Outcome.QUALITY_WARNING and warning is None:
            warning = f"sequence {s}: {cmp.message}"
        notes.append(cmp.message)
    errs = {"max_abs_err": worst_abs, "max_rel_err": worst_rel, "err_to_tol": worst_ratio}
    if differs:
        step = same
        s = next(i for i, t in enumerate(expected.tokens) if t[step] != got.tokens[i][step])
        logits = expected.step_logits[step, s].double()
        want, have = expected.tokens[s][step], got.tokens[s][step]
        return failed(f"greedy tokens differ at step {step} (sequence {s}): native generated {expected.tokens}, the "
                      f"platform {got.tokens}; at that step native's logit of {want} is {float(logits[want]):.4g} "
                      f"and of {have} {float(logits[have]):.4g}; {used.describe()}{where}", **errs)
    message = recompiled()
    if message is not None:
        return failed(f"{message}; {used.describe()}{where}", **errs)
    if warning is not None:
        return Verdict(Outcome.QUALITY_WARNING, f"{warning}; {used.describe()}{where}", **errs)
    return passed(f"tokens {got.tokens} as native; logits {notes[0]}; {used.describe()}", **errs)
