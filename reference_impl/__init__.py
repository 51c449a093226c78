"""Reference implementation of a vLLM-style op layer: platforms, CustomOp, the functional IR,
layers, kernels and compile passes that vendor plugins are checked against.

Importing the package wires its layers together in one place: the functional IR
(`reference_impl.ir`, which imports nothing else of the package) takes its provider priorities
from the runtime's current config and platform (`reference_impl.priorities`).
"""

from reference_impl import ir, priorities

ir.set_priority_source(priorities.RuntimePriorities())

__version__ = "0.1.0"
