"""Small decoder models built from the reference layers (eager or through reference_impl.compilation),
with a KV cache, batched generation and Hugging Face-style checkpoints."""

from reference_impl.models.generation import (
    BatchGeneration,
    Generation,
    Sampler,
    SamplingParams,
    generate,
    greedy_generate,
)
from reference_impl.models.decoder_config import DecoderConfig
from reference_impl.models.kv_cache import KVCache, using_kv_cache
from reference_impl.models.llama import LlamaForCausalLM, LlamaModel, build_model
from reference_impl.models.weights import expected_shapes, random_checkpoint

__all__ = ["DecoderConfig", "LlamaForCausalLM", "LlamaModel", "build_model", "expected_shapes", "random_checkpoint",
           "Generation", "greedy_generate", "BatchGeneration", "Sampler", "SamplingParams", "generate", "KVCache",
           "using_kv_cache"]
