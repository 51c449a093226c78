"""Platform of the 'oot_never_runs' fault (replacements in conformance_broken.oot_never_runs_layers)."""

from conformance_broken.base import make_platform

Platform = make_platform("oot_never_runs", {})
Platform.import_ir_kernels = lambda self: __import__("conformance_broken.oot_never_runs_layers")
