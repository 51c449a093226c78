"""Judge: an implementation's outputs against native semantics, and what a pattern of failures points to."""
