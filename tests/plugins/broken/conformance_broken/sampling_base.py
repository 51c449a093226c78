"""Shared piece of the sampling fixtures: a platform whose `get_sampler()` answers its kernels module's `Sampler`
(reference_impl.sampling's contract), with no IR providers."""

from conformance_broken.base import make_platform


def sampling_platform(fault: str):
    base = make_platform(fault, {})

    class SamplingPlatform(base):
        def get_sampler(self):
            import importlib

            return importlib.import_module(f"conformance_broken.{fault}_kernels").Sampler()

    SamplingPlatform.__qualname__ = SamplingPlatform.__name__ = "Platform"
    SamplingPlatform.__module__ = f"conformance_broken.{fault}"
    return SamplingPlatform
