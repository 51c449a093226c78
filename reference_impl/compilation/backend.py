"""`ReferenceCompileBackend`: a torch.compile backend running the project's passes around AOTAutograd.

Pipeline per Dynamo graph (one `PassContext` each):
  Dynamo graph -> [pre-grad] inplace functionalization -> AOTAutograd (post-grad graph)
  -> [post-grad] rms_norm+quant fusion -> IR lowering -> clone elimination -> inner compiler.
With `inner="inductor"` the post-grad passes run as inductor's `post_grad_custom_post_pass` and
inductor generates the code; with `inner="aot_eager"` (alias `"eager"`) AOTAutograd runs alone and
the final FX graph executes as Python: cheap, for checks about graphs rather than generated code.

With inductor, its FX graph cache and AOTAutograd's cache are on (`cache=True`): our post-grad
pass gives them a uuid that hashes our passes, the IR's lowering choices and the implementations'
and kernels' code (reference_impl/compilation/cache_key.py), so a change of any of them misses.
A compilation served from those caches skips our post-grad passes: its `PassContext` says so
(`post_grad_cached`) and holds no lowering decisions; `cache=False` always runs them. The caches
live where torch keeps them (`TORCHINDUCTOR_CACHE_DIR`, default `<tmp>/torchinductor_<user>`),
never in the working directory.

Known torch 2.13 limitation: inductor's C++ backend crashes (`KeyError: 'bufN'` in outer-loop
fusion, pytorch/pytorch#196570) on a kernel that writes its result into an input with Python
`copy_`, with or without this pipeline. In-place providers built as torch ops that declare their
mutated arguments (the reference C++ kernels) are unaffected; aot_eager handles both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx import Graph, GraphModule

from reference_impl.compilation.cache_key import pipeline_uuid
from reference_impl.compilation.clone_elimination import CloneEliminationPass
from reference_impl.compilation.fusion import RmsNormQuantFusionPass
from reference_impl.compilation.fx_utils import fake_value, placeholders
from reference_impl.compilation.inplace_functionalization import InplaceFunctionalizationPass
from reference_impl.compilation.lowering import IrLoweringPass, inductor_decompositions
from reference_impl.compilation.pass_manager import POST_GRAD, PRE_GRAD, PassContext, PassManager
from reference_impl.config import CompilationConfig, get_current_config
from reference_impl.kernels import load_built_libraries

INNER_COMPILERS = ("inductor", "aot_eager", "eager")


class ReferenceCompileBackend:
    """`torch.compile(fn, backend=ReferenceCompileBackend(...), fullgraph=True)`.

    `inner`: "inductor" (default: `config.backend`, itself "inductor" by default) or "aot_eager"
    ("eager" is accepted as the same). `fusion=False` leaves IR fusion out of the pipeline.
    `cache=False` turns inductor's and AOTAutograd's caches off for this backend's compilations
    (for callers that inspect the post-grad passes' decisions of every compilation).
    After a call, `selected_impls`, `graph_snapshots` and `pass_context` describe the latest
    compilation; `contexts` holds one PassContext per compilation (`num_compilations`).
    """

    def __init__(self, config: CompilationConfig | None = None, inner: str | None = None, *,
                 fusion: bool = True, cache: bool = True):
        self.config = config if config is not None else get_current_config().compilation_config
        inner = inner if inner is not None else self.config.backend
        if inner not in INNER_COMPILERS:
            raise ValueError(f"ReferenceCompileBackend: inner compiler {inner!r} is not one of {INNER_COMPILERS}")
        self.inner = "aot_eager" if inner == "eager" else inner
        self.lowering_pass = IrLoweringPass(inductor_decompositions() if self.inner == "inductor" else None)
        passes = [InplaceFunctionalizationPass()]
        if fusion:
            passes.append(RmsNormQuantFusionPass())
        passes += [self.lowering_pass, CloneEliminationPass()]
        self.pass_manager = PassManager(passes)
        self.cache = cache
        self.contexts: list[PassContext] = []

    # ----- introspection -------------------------------------------------------------------
    @property
    def pass_context(self) -> PassContext:
        if not self.contexts:
            raise RuntimeError("ReferenceCompileBackend has not compiled anything yet; call the compiled "
                               "function first (torch.compile compiles on the first call)")
        return self.contexts[-1]

    @property
    def selected_impls(self) -> dict[str, dict[str, str]]:
        """op name -> {node name -> provider} chosen by the lowering in the latest compilation
        ({} before the first compilation)."""
        return self.contexts[-1].selected_impls if self.contexts else {}

    @property
    def graph_snapshots(self) -> dict[str, Graph]:
        """stage -> graph after that stage, in pipeline order, for the latest compilation ({} before)."""
        return self.contexts[-1].graph_snapshots if self.contexts else {}

    @property
    def num_compilations(self) -> int:
        return len(self.contexts)

    def stages(self) -> list[str]:
        """Snapshot names in pipeline order."""
        return ["dynamo", *self.pass_manager.names(PRE_GRAD), "post_grad", *self.pass_manager.names(POST_GRAD)]

    # ----- the backend ---------------------------------------------------------------------
    def __call__(self, gm: GraphModule, example_inputs: Sequence[Any]) -> Callable:
        ctx = PassContext(index=len(self.contexts), inner=self.inner)
        self.contexts.append(ctx)
        ctx.num_lifted_params = len({**dict(gm.named_parameters(remove_duplicate=False)),
                                     **dict(gm.named_buffers(remove_duplicate=False))})
        ctx.snapshot("dynamo", gm.graph)
        self.pass_manager.run(PRE_GRAD, gm.graph, ctx)
        gm.recompile()
        donated_meta = {i: _describe_input(p) for i, p in enumerate(placeholders(gm.graph))
                        if i in ctx.donated_input_ids}

        def post_grad(graph: Graph) -> None:
            ctx.post_grad_cached = False
            ctx.snapshot("post_grad", graph)
            ctx.donated_post_grad_ids = _map_donated(graph, ctx, donated_meta)
            self.pass_manager.run(POST_GRAD, graph, ctx)

        if self.inner == "inductor":
            uuid = None
            if self.cache:     # what the post-grad passes' output depends on (cache_key.py)
                uuid = pipeline_uuid([self.inner, *self.pass_manager.names(POST_GRAD)],
                                     (ctx.num_pre_grad_inputs, ctx.num_lifted_params, sorted(donated_meta.items())))
                load_built_libraries()      # a cached graph calls our kernel libraries directly
            ctx.post_grad_cached = True       # until post_grad runs
            compiled = _compile_with_inductor(gm, example_inputs, post_grad, uuid)
            if ctx.post_grad_cached:
                ctx.note("post_grad", "served from inductor's caches: the post-grad passes did not run")
            return compiled
        return _compile_with_aot_eager(gm, example_inputs, post_grad)


def _describe_input(node) -> tuple | None:
    val = fake_value(node)
    return (val.dtype, val.dim()) if isinstance(val, torch.Tensor) else None


def _map_donated(graph: Graph, ctx: PassContext, donated_meta: dict[int, tuple | None]) -> set[int] | None:
    """Donated Dynamo-graph input indices, as post-grad placeholder indices (AOTAutograd prepends
    lifted parameters); None, so nothing counts as donated, when the inputs do not line up."""
    inputs = placeholders(graph)
    lifted = len(inputs) - ctx.num_pre_grad_inputs
    if not donated_meta:
        return set()
    if lifted != ctx.num_lifted_params:
        ctx.note("post_grad", f"post-grad graph has {len(inputs)} inputs for {ctx.num_pre_grad_inputs} Dynamo "
                 f"inputs and {ctx.num_lifted_params} lifted parameters; donations ignored")
        return None
    mapped = set()
    for i, meta in donated_meta.items():
        if _describe_input(inputs[i + lifted]) != meta:
            ctx.note("post_grad", f"post-grad input {inputs[i + lifted].name} does not match donated Dynamo "
                     f"input {ctx.donated_input_names[i]}; donations ignored")
            return None
        mapped.add(i + lifted)
    return mapped


def _compile_with_aot_eager(gm: GraphModule, example_inputs, post_grad: Callable[[Graph], None]) -> Callable:
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    def fw_compiler(fw_gm: GraphModule, fw_inputs):
        post_grad(fw_gm.graph)
        fw_gm.recompile()
        return boxed_nop(fw_gm, fw_inputs)

    return aot_autograd(fw_compiler=fw_compiler, keep_inference_input_mutations=True)(gm, example_inputs)


def _compile_with_inductor(gm: GraphModule, example_inputs, post_grad: Callable[[Graph], None],
                           uuid: str | None) -> Callable:
    """inductor with our post-grad passes; `uuid` None turns its FX graph and AOTAutograd caches off."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class _PostGradHook(CustomGraphPass):
        """Runs our post-grad passes inside inductor; `uuid()` keys inductor's caches on them."""

        def __call__(self, graph: Graph) -> None:
            post_grad(graph)

        def uuid(self):
            return uuid

    caching = uuid is not None
    with inductor_config.patch(post_grad_custom_post_pass=_PostGradHook(), fx_graph_cache=caching), \
            torch._functorch.config.patch(enable_autograd_cache=caching):
        return compile_fx(gm, example_inputs)
