"""Platform of the 'oot_never_runs' fault (replacements in conformance_broken.oot_never_runs_layers)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("oot_never_runs", {})
Platform.import_ir_kernels = lambda self: __import__("conformance_broken.oot_never_runs_layers")

EXPECTED = Fault(family="dispatch", outcome="FAIL",
                 fragments=("CudaOnlyRMSNorm defines forward_cuda only; on this platform the reference CustomOp runs "
                            "RMSNorm.forward_oot (reference code, inherited from CustomOp), which runs "
                            "RMSNorm.forward_native: define forward_oot",),
                 end_to_end=("-k", "oot or layer_case and float32"), clean_too=True, eager_correct=True)
