"""Reference layers (docs/catalog.md), one module per family."""
