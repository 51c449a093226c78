"""FusedMMInputNorm (docs/catalog.md `fused_mm_input_norm`): rescaling and normalisation of image pixels
on the device, `(pixels * rescale_factor - mean) / std` per channel, vLLM 0.32's semantics and cases."""

from __future__ import annotations

import torch

from reference_impl.custom_op import CustomOp
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases


@CustomOp.register("fused_mm_input_norm")
class FusedMMInputNorm(CustomOp):
    """`forward(pixel_values [patches, channel * patch_size], visual_dtype) -> [patches, ...] in visual_dtype`:
    each row holds `channel` consecutive blocks, block c scaled by `weight[c] = rescale_factor / std[c]`
    and shifted by `bias[c] = -mean[c] / std[c]` (float32 buffers, so the arithmetic is float32 for
    uint8 or half pixels), then cast to `visual_dtype`. vLLM always enables this op (its `enabled()`
    is True); here custom_ops governs it like every CustomOp.
    """

    def __init__(self, image_mean: list[float], image_std: list[float], rescale_factor: float, channel: int = 3,
                 *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        if not len(image_mean) == len(image_std) == channel:
            raise ValueError(f"FusedMMInputNorm: image_mean/image_std must have {channel} entries, got "
                             f"{len(image_mean)} / {len(image_std)}")
        if rescale_factor == 0.0:
            raise ValueError("FusedMMInputNorm: rescale_factor must be non-zero")
        self.channel = channel
        mean = torch.tensor(image_mean, dtype=torch.float32)
        std = torch.tensor(image_std, dtype=torch.float32)
        self.register_buffer("weight", rescale_factor / std)
        self.register_buffer("bias", -mean / std)

    @property
    def input_dtype(self) -> torch.dtype:
        return torch.uint8

    def forward_native(self, pixel_values: torch.Tensor, visual_dtype: torch.dtype) -> torch.Tensor:
        if pixel_values.dim() != 2 or pixel_values.shape[1] % self.channel:
            raise ValueError(f"FusedMMInputNorm expects pixel_values [patches, {self.channel} * patch_size], got "
                             f"{tuple(pixel_values.shape)}")
        patches, size = pixel_values.shape
        x = pixel_values.reshape(patches, self.channel, size // self.channel)
        x = x * self.weight.view(1, self.channel, 1) + self.bias.view(1, self.channel, 1)
        return x.reshape(patches, size).to(visual_dtype)

    def extra_repr(self) -> str:
        return f"channel={self.channel}"


_CLIP = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
         "rescale_factor": 1 / 255}


def _case(name, patches, patch_size, *, pixels="uint8", level="quick"):
    def make_inputs(dtype, device, gen):
        values = torch.randint(0, 256, (patches, 3 * patch_size), generator=gen)
        if pixels == "uint8":
            return (values.to(device=device, dtype=torch.uint8), dtype)
        return (values.to(device=device, dtype=dtype), dtype)   # already-decoded pixels in the visual dtype

    return LayerCase(name, lambda dtype: dict(_CLIP), make_inputs, level=level)


declare_cases(FusedMMInputNorm, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    _case("patches=6,patch=588,uint8", 6, 588),
    _case("patches=4,patch=196,visual_dtype_pixels", 4, 196, pixels="visual"),
    _case("patches=1,patch=1,uint8", 1, 1),
    _case("patches=64,patch=1176,uint8", 64, 1176, level="standard"),
])
