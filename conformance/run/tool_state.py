"""Keep other tools' state out of the vendor's working directory during a conformance run.

Hypothesis (`.hypothesis/`, its example database and constants cache) and pytest-benchmark
(`.benchmarks/`) write into the current directory by default. A conformance run sends both to
`$XDG_CACHE_HOME/reference-impl-conformance/` (default `~/.cache/...`, else the temp directory).
A location the vendor chose (`HYPOTHESIS_STORAGE_DIRECTORY`, `--benchmark-storage`) is kept.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

HYPOTHESIS_ENV = "HYPOTHESIS_STORAGE_DIRECTORY"  # read by hypothesis in every process, the kernel worker too
BENCHMARK_DEFAULT_STORAGE = "file://./.benchmarks"  # pytest-benchmark's default for --benchmark-storage


def cache_root() -> Path:
    """The per-user cache directory of the harness, created; the temp directory when home is not writable."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for root in (Path(base), Path(tempfile.gettempdir())):
        try:
            (root / "reference-impl-conformance").mkdir(parents=True, exist_ok=True)
            return root / "reference-impl-conformance"
        except OSError:
            continue
    raise OSError(f"no writable cache directory (tried {base} and {tempfile.gettempdir()})")


def redirect_tool_state(options) -> None:
    """Point hypothesis and pytest-benchmark at the cache directory unless the vendor chose a place.

    `options` is pytest's `config.option`; call before pytest-benchmark's (trylast) configure.
    """
    root = cache_root()
    os.environ.setdefault(HYPOTHESIS_ENV, str(root / "hypothesis"))
    if getattr(options, "benchmark_storage", None) == BENCHMARK_DEFAULT_STORAGE:
        options.benchmark_storage = f"file://{root / 'benchmarks'}"
