"""The torch the project runs on: inside the declared range, with every private API the code uses.

The compile pipeline and the harness lean on torch internals whose names and behaviour move
between releases. Listing them here makes a torch upgrade that moves one fail once, by name,
instead of as scattered ERRORs; the declared range (pyproject.toml) is what was actually run
(see README, "Supported torch").
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch


PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

# (module, attribute) of every private or version-sensitive torch API used outside tests.
PRIVATE_APIS = [
    ("torch._C", "_len_torch_dispatch_stack"),             # reference_impl/ir/op.py fast path
    ("torch._C", "_is_torch_function_mode_enabled"),
    ("torch._C._dynamo.guards", "TensorGuards"),          # reference_impl/ir/guard.py (with a Python fallback)
    ("torch.compiler", "is_compiling"),
    ("torch._dynamo", "mark_dynamic"),                     # conformance/checks/compile.py
    ("torch._dynamo", "maybe_mark_dynamic"),
    ("torch._dynamo", "reset"),
    ("torch._dynamo.utils", "counters"),
    ("torch._dynamo.backends.common", "aot_autograd"),     # reference_impl/compilation/backend.py
    ("torch._dynamo.backends.debugging", "boxed_nop"),
    ("torch._inductor.compile_fx", "compile_fx"),
    ("torch._inductor.custom_graph_pass", "CustomGraphPass"),
    ("torch._inductor.config", "post_grad_custom_post_pass"),
    ("torch._functorch.config", "enable_autograd_cache"),
    ("torch._inductor.decomposition", "select_decomp_table"),  # reference_impl/compilation/lowering.py
    ("torch._dispatch.python", "enable_python_dispatcher"),
    ("torch._guards", "detect_fake_mode"),
    ("torch._subclasses", "FakeTensor"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode"),   # conformance/checks/fakes.py: FakeTensor(mode, meta, device)
    ("torch._dynamo.source", "LocalSource"),
    ("torch.fx.experimental.symbolic_shapes", "ShapeEnv"),  # .create_symbolic_sizes_strides_storage_offset
    ("torch.fx.experimental.symbolic_shapes", "StatelessSymbolicContext"),
    ("torch.fx.experimental.symbolic_shapes", "DimDynamic"),
    ("torch.fx.experimental.proxy_tensor", "make_fx"),
    ("torch.fx.experimental.symbolic_shapes", "statically_known_true"),
    ("torch.fx.experimental.symbolic_shapes", "GuardOnDataDependentSymNode"),  # conformance/checks/tracing.py
    ("torch._subclasses.fake_tensor", "DataDependentOutputException"),
    ("torch.library", "opcheck"),                          # conformance/checks/aliasing.py: its test_schema
    ("torch._subclasses.fake_utils", "_check_fake_real_tensors"),  # aliasing.py: opcheck's fake-tensor comparisons
    ("torch._subclasses.fake_utils", "_check_alias_info"),
    ("torch._subclasses.fake_tensor", "UnsupportedFakeTensorException"),
    ("torch._inductor.utils", "run_and_get_code"),         # benchmarks/bench_compile.py
]


def _version(text: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", text).groups()
    return int(major), int(minor)


def test_installed_torch_is_inside_the_declared_range():
    declared = re.search(r'"torch>=([0-9.]+)"', PYPROJECT.read_text())
    assert declared, "pyproject.toml declares no lower bound for torch"
    assert _version(torch.__version__) >= _version(declared.group(1)), (torch.__version__, declared.group(1))


@pytest.mark.parametrize("module,attr", PRIVATE_APIS, ids=[f"{m}.{a}" for m, a in PRIVATE_APIS])
def test_private_torch_api_is_present(module, attr):
    assert hasattr(importlib.import_module(module), attr), f"torch {torch.__version__} has no {module}.{attr}"


def test_opcheck_reports_each_sub_check_without_raising():
    """The aliasing family reads opcheck's public per-test results (raise_exception=False): a failed
    sub-check is its exception, a passed one the string SUCCESS."""
    lib = torch.library.Library("test_torch_support", "FRAGMENT")
    lib.define("bad_fake(Tensor x) -> Tensor")
    lib.impl("bad_fake", lambda x: x * 2, "CPU")
    torch.library.register_fake("test_torch_support::bad_fake", lambda x: x.new_empty(x.shape[0] + 1), lib=lib)
    results = torch.library.opcheck(torch.ops.test_torch_support.bad_fake.default, (torch.ones(3),),
                                    test_utils=("test_schema", "test_faketensor"), raise_exception=False)
    assert results["test_schema"] == "SUCCESS"
    assert isinstance(results["test_faketensor"], BaseException), results
