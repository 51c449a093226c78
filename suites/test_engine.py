"""engine: the whole platform through vLLM's LLM engine against the reference runtime (under --platform=vllm)."""

import pytest


@pytest.mark.conformance("engine", "generate")
def test_engine_generate(conformance_unit, conformance_check):
    conformance_check(conformance_unit)
