"""Reference layers (spec/CATALOG.md), one module per family."""
