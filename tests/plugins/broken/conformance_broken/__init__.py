"""Deliberately broken platform plugins, one entry point per fault the harness claims to catch.

Each fault is a module `conformance_broken.<fault>` defining `Platform` (an OOT platform whose
`import_ir_kernels()` imports the module's faulty kernels); `register_<fault>` entry points return
its qualified name. tests/plugins/README.md lists the faults and how to add one.
"""

FAULTS = ("odd_numerics", "strides", "wrong_dtype", "mutates_input", "writes_weight", "returns_input",
          "batch_guard", "nonbool_supports", "oot_name", "missing_default", "raises", "hangs", "segfault",
          "traced_branch", "untraceable", "batch_guard_large", "contiguous_only",
          "oot_never_runs", "missing_epsilon", "segfault_shape", "precise_rotary", "coarse_rotary",
          "cache_dtype", "ignores_neox", "no_saturation", "caches_per_signature", "reuses_output",
          "refuses_tail", "tanh_gelu", "loosens_tolerance")


def _register(fault: str):
    def register() -> str:
        return f"conformance_broken.{fault}.Platform"

    register.__name__ = register.__qualname__ = f"register_{fault}"
    return register


for _fault in FAULTS:
    globals()[f"register_{_fault}"] = _register(_fault)


def register_absent():
    """A plugin whose device is absent: register() returns None."""
    return None
