"""Platform of the 'row_limit' fault (kernels in conformance_broken.row_limit_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("row_limit")

EXPECTED = Fault(family="numerics", outcome="FAIL", fragments=("first bad row 4096 (row 4096 is all zero)",
                                                              "first bad row 4096 (rows 4096..65536 are all zero)"),
                 also_passes=True, level="standard", hint=("only row counts past a kernel's limit",),
                 end_to_end=("--conformance-level=standard", "-k",
                             "numerics and ir_case and float32 and rows_past_limit"))
