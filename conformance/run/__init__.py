"""Run: each unit in an isolated kernel worker, so that a crash or hang costs one result, never the run."""
