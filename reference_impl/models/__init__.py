"""Small decoder models built from the reference layers (eager or through reference_impl.compilation)."""

from reference_impl.models.generation import Generation, greedy_generate
from reference_impl.models.llama import (
    DecoderConfig,
    LlamaForCausalLM,
    LlamaModel,
    build_model,
    random_checkpoint,
)

__all__ = ["DecoderConfig", "LlamaForCausalLM", "LlamaModel", "build_model", "random_checkpoint", "Generation",
           "greedy_generate"]
