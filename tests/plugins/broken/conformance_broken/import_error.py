"""Fault: the plugin's entry-point module fails to import."""

raise ImportError("conformance_broken.import_error needs libvendor.so, which is not installed (simulated)")
