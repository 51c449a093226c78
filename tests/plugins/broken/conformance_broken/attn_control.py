"""Platform of the 'attn_control' control: a correct attention backend that computes sinks it declares unsupported."""

from conformance_broken.base import make_platform
from conformance_broken.records import Control

Platform = make_platform("attn_control", {}, attention=True)

EXPECTED = Control(family="attention", dtypes=("float32", "bfloat16"),
                   checked_by=("test_the_attention_control_passes_every_check_and_is_told_to_declare_sinks",))
