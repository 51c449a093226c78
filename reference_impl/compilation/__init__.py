"""The compile pipeline: a torch.compile backend that keeps eager-compile consistency for the IR.

`ReferenceCompileBackend` runs inplace functionalization (pre-grad), then fusion, IR lowering
with the eager selection rule and clone elimination (post-grad) around AOTAutograd and inductor.
`compile_module` compiles a CustomOp-built module under a `RuntimeConfig`.
A `DonatedInputReuseError` raised at compile time reaches the caller wrapped by torch._dynamo
(`BackendCompilerFailed`); `find_cause(exc, DonatedInputReuseError)` unwraps it.
"""

from reference_impl.compilation.backend import INNER_COMPILERS, ReferenceCompileBackend
from reference_impl.compilation.clone_elimination import CloneEliminationPass
from reference_impl.compilation.errors import CompilationPipelineError, DonatedInputReuseError, find_cause
from reference_impl.compilation.fusion import ProducerConsumerPattern, RmsNormQuantFusionPass
from reference_impl.compilation.inplace_functionalization import InplaceFunctionalizationPass
from reference_impl.compilation.lowering import IrLoweringPass
from reference_impl.compilation.module import CompiledModule, RecompileError, bind_custom_ops, compile_module
from reference_impl.compilation.pass_manager import POST_GRAD, PRE_GRAD, GraphPass, PassContext, PassManager

__all__ = [
    "ReferenceCompileBackend", "INNER_COMPILERS", "DonatedInputReuseError", "CompilationPipelineError",
    "find_cause", "compile_module", "CompiledModule", "RecompileError", "bind_custom_ops",
    "PassContext", "PassManager", "GraphPass", "PRE_GRAD", "POST_GRAD",
    "InplaceFunctionalizationPass", "RmsNormQuantFusionPass", "ProducerConsumerPattern", "IrLoweringPass",
    "CloneEliminationPass",
]
