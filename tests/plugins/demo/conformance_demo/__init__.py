"""Demo vendor plugin: what a correct plugin looks like. The harness must find nothing wrong with it.

Three registration paths, as docs/plugin-api.md allows: the platform class's `import_ir_kernels()`
registers the IR kernels, and a general plugin of the same distribution registers the
`RMSNorm` replacement.
"""


def register() -> str:
    """Platform-plugin entry point: the demo 'device' is the CPU, always present."""
    return "conformance_demo.platform.DemoPlatform"


def register_layers() -> None:
    """General-plugin entry point: CustomOp replacements."""
    import conformance_demo.layers  # noqa: F401
