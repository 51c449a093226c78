"""compile: torch.compile(fullgraph=True) through the project's backend matches eager, selects alike."""

import pytest


@pytest.mark.conformance("compile", "ir_compile")
def test_ir_compile(conformance_unit, conformance_check):
    conformance_check(conformance_unit)
