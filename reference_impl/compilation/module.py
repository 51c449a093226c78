"""Compile a whole module built from CustomOp layers under a RuntimeConfig.

`CompilationConfig.mode` picks the path: NONE runs eagerly; STOCK_TORCH_COMPILE uses plain
torch.compile with `backend`; DYNAMO_TRACE_ONCE is the same but a second compilation raises;
REFERENCE_COMPILE goes through `ReferenceCompileBackend` (inner compiler = `backend`).
CustomOp layers pick their forward at construction, so `compile_module` re-binds them under the
config first: with inductor and a compiling mode, custom ops are off unless `custom_ops` enables them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from reference_impl.compilation.backend import ReferenceCompileBackend
from reference_impl.config import CompilationMode, RuntimeConfig, get_current_config, set_current_config
from reference_impl.custom_op import CustomOp


class RecompileError(RuntimeError):
    """A module compiled with DYNAMO_TRACE_ONCE needed a second Dynamo trace."""


def bind_custom_ops(module: nn.Module, config: RuntimeConfig) -> dict[str, str]:
    """Re-pick every CustomOp submodule's forward under `config`; returns {submodule: method name}."""
    bound = {}
    with set_current_config(config):
        for name, sub in module.named_modules():
            if isinstance(sub, CustomOp):
                sub._forward_method = sub.dispatch_forward()
                bound[name or type(sub).__name__] = sub._forward_method.__name__
    return bound


class _TraceOnce:
    """Wraps a stock backend so that a second compilation raises instead of recompiling."""

    def __init__(self, backend: Callable):
        self.backend = backend
        self.compilations = 0

    def __call__(self, gm, example_inputs):
        self.compilations += 1
        if self.compilations > 1:
            raise RecompileError("DYNAMO_TRACE_ONCE: the module was traced again (a guard failed, for "
                                 "example a static batch size); mark the varying dimensions dynamic")
        return self.backend(gm, example_inputs)


class CompiledModule(nn.Module):
    """The module with its compiled callable; calls run under the config it was compiled with.

    `backend` is the ReferenceCompileBackend (REFERENCE_COMPILE mode) for inspection, else None;
    `custom_op_forwards` shows which forward each CustomOp layer was bound to.
    """

    def __init__(self, module: nn.Module, config: RuntimeConfig, compiled: Callable,
                 backend: ReferenceCompileBackend | None, custom_op_forwards: dict[str, str],
                 dynamic_batch: bool):
        super().__init__()
        self.module = module
        self.config = config
        self._compiled = compiled
        self.backend = backend
        self.custom_op_forwards = custom_op_forwards
        self.dynamic_batch = dynamic_batch

    def forward(self, *args, **kwargs):
        if self.dynamic_batch:
            for t in (*args, *kwargs.values()):
                if isinstance(t, torch.Tensor) and t.dim() >= 1:
                    torch._dynamo.maybe_mark_dynamic(t, 0)
        if get_current_config() is self.config:
            return self._compiled(*args, **kwargs)
        with set_current_config(self.config):
            return self._compiled(*args, **kwargs)


def compile_module(module: nn.Module, config: RuntimeConfig | None = None, *, fullgraph: bool = True,
                   dynamic_batch: bool = True, fusion: bool = True) -> CompiledModule:
    """Compile `module` as `config.compilation_config` says (see the module docstring).

    `dynamic_batch` marks dim 0 of tensor arguments dynamic so a new batch size does not
    recompile (call first with a batch of at least 2: sizes 0 and 1 are specialized by torch).
    """
    config = config if config is not None else get_current_config()
    cc = config.compilation_config
    forwards = bind_custom_ops(module, config)
    backend = None
    if cc.mode == CompilationMode.NONE:
        compiled: Callable = module
    elif cc.mode == CompilationMode.REFERENCE_COMPILE:
        backend = ReferenceCompileBackend(cc, fusion=fusion)
        compiled = torch.compile(module, backend=backend, fullgraph=fullgraph)
    else:
        stock = torch._dynamo.lookup_backend(cc.backend)
        if cc.mode == CompilationMode.DYNAMO_TRACE_ONCE:
            stock = _TraceOnce(stock)
        compiled = torch.compile(module, backend=stock, fullgraph=fullgraph)
    return CompiledModule(module, config, compiled, backend, forwards, dynamic_batch)
