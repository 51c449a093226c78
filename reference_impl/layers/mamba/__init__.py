"""Mamba layers (docs/catalog.md): the Mamba2 gated group RMS norm (`gated_norm`:
`mixer2_gated_rms_norm`), the sequence operators (`scans`) and the mixers built on them (`mixer`:
`mamba_mixer`, `mixer2`: `mamba_mixer2`, `plamo2`: `plamo2_mamba_mixer`, `short_conv`:
`short_conv`). The names below stay importable from `reference_impl.layers.mamba`.
"""

from reference_impl.layers.mamba.gated_norm import Mixer2RMSNormGated
from reference_impl.layers.mamba.mixer import MambaMixer
from reference_impl.layers.mamba.mixer2 import MambaMixer2
from reference_impl.layers.mamba.plamo2 import Plamo2MambaMixer
from reference_impl.layers.mamba.scans import CONV_ACTIVATIONS, causal_conv1d, selective_scan, ssd_scan
from reference_impl.layers.mamba.short_conv import ShortConv, ShortConvConfig

__all__ = ["CONV_ACTIVATIONS", "MambaMixer", "MambaMixer2", "Mixer2RMSNormGated", "Plamo2MambaMixer", "ShortConv",
           "ShortConvConfig", "causal_conv1d", "selective_scan", "ssd_scan"]
