"""Platform of the 'attn_seq_limit' fault (attention backend in conformance_broken.attn_seq_limit_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("attn_seq_limit", {}, attention=True)

EXPECTED = Fault(family="attention", outcome="FAIL",
                 fragments=("first bad request 4096 (its token 0, token 4096 of the batch; bad: request 4096)",),
                 dtype="bfloat16", level="standard", in_process=False, clean_too=True,
                 end_to_end=("--conformance-level=standard", "-k",
                             "attention and forward and (decode or seqs_4097_past_limit)"))
