"""The pass manager and the per-compilation pass context (what each pass saw and decided)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

from torch.fx import Graph

from reference_impl.compilation.fx_utils import copy_graph

logger = logging.getLogger("reference_impl.compilation")

PRE_GRAD = "pre_grad"
POST_GRAD = "post_grad"


@dataclasses.dataclass
class PassContext:
    """State of one compilation (one Dynamo graph), filled in by the passes as they run.

    - `donated_input_ids`: indices (into the Dynamo graph's placeholders) of graph inputs passed as
      activations to a `maybe_inplace` call; `donated_post_grad_ids` the same inputs in the
      post-grad graph (None when they could not be mapped: then no input counts as donated).
    - `selected_impls`: op name -> {node name -> provider} chosen by the lowering.
    - `graph_snapshots`: stage -> copy of the graph after that stage (`"dynamo"`, each pass name,
      `"post_grad"` for AOTAutograd's output); `before(name)` / `after(name)` look them up.
    - `notes`: pass name -> human-readable decisions (fusions made, clones removed / kept and why).
    - `post_grad_cached`: inductor served this compilation from its caches, so the post-grad
      passes did not run (no lowering decisions, no post-grad snapshots).
    """

    index: int = 0
    inner: str = "inductor"
    donated_input_ids: set[int] = dataclasses.field(default_factory=set)
    donated_input_names: dict[int, str] = dataclasses.field(default_factory=dict)
    num_pre_grad_inputs: int = 0
    num_lifted_params: int = 0
    donated_post_grad_ids: set[int] | None = None
    selected_impls: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    graph_snapshots: dict[str, Graph] = dataclasses.field(default_factory=dict)
    pass_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    notes: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    post_grad_cached: bool = False

    def snapshot(self, stage: str, graph: Graph) -> None:
        self.graph_snapshots[stage] = copy_graph(graph)

    def note(self, pass_name: str, message: str) -> None:
        self.notes.setdefault(pass_name, []).append(message)
        logger.debug("[%s #%d] %s", pass_name, self.index, message)

    def after(self, stage: str) -> Graph:
        try:
            return self.graph_snapshots[stage]
        except KeyError:
            raise KeyError(f"no snapshot '{stage}'; stages: {list(self.graph_snapshots)}") from None

    def before(self, stage: str) -> Graph:
        stages = list(self.graph_snapshots)
        if stage not in stages:
            raise KeyError(f"no snapshot '{stage}'; stages: {stages}")
        i = stages.index(stage)
        if i == 0:
            raise KeyError(f"'{stage}' is the first stage; nothing was recorded before it")
        return self.graph_snapshots[stages[i - 1]]


class GraphPass:
    """A graph-to-graph pass: mutates `graph` in place, records its decisions in `ctx`."""

    name: str = "pass"
    stage: str = POST_GRAD

    def __call__(self, graph: Graph, ctx: PassContext) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, stage={self.stage!r})"


class PassManager:
    """Runs the passes of one stage in order, linting and snapshotting the graph after each."""

    def __init__(self, passes: Sequence[GraphPass] = ()):
        self.passes: list[GraphPass] = []
        for p in passes:
            self.add(p)

    def add(self, graph_pass: GraphPass, *, before: str | None = None) -> None:
        """Append `graph_pass` (or insert it before the pass named `before`)."""
        if graph_pass.stage not in (PRE_GRAD, POST_GRAD):
            raise ValueError(f"pass {graph_pass.name!r}: stage must be {PRE_GRAD!r} or {POST_GRAD!r}, "
                             f"got {graph_pass.stage!r}")
        if any(p.name == graph_pass.name for p in self.passes):
            raise ValueError(f"a pass named {graph_pass.name!r} is already registered")
        if before is None:
            self.passes.append(graph_pass)
            return
        names = [p.name for p in self.passes]
        if before not in names:
            raise ValueError(f"no pass named {before!r}; passes: {names}")
        self.passes.insert(names.index(before), graph_pass)

    def names(self, stage: str | None = None) -> list[str]:
        return [p.name for p in self.passes if stage is None or p.stage == stage]

    def run(self, stage: str, graph: Graph, ctx: PassContext) -> None:
        for graph_pass in self.passes:
            if graph_pass.stage != stage:
                continue
            start = time.perf_counter()
            graph_pass(graph, ctx)
            graph.lint()
            ctx.pass_seconds[graph_pass.name] = time.perf_counter() - start
            ctx.snapshot(graph_pass.name, graph)
