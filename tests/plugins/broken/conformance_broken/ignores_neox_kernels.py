"""Fault: rotary embedding that always rotates GPT-J style (interleaved pairs), ignoring is_neox_style."""

from conformance_broken.rotary_base import make_rotary_kernels

make_rotary_kernels(lambda positions, x, head_size, cache, neox: (cache, False))
