"""Where the kernel sources are: `reference_impl/_csrc/` in an installed package (the wheel ships
`csrc/` there, see setup.py), else the repository's `csrc/` in a source checkout or editable install.

The `cpp` and `cuda` providers JIT-build from these sources, so a non-editable install needs them.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # reference_impl/
PACKAGED = PACKAGE_DIR / "_csrc"
CHECKOUT = PACKAGE_DIR.parent / "csrc"


def csrc_dir() -> Path:
    """The kernel source root holding cpu/, cuda/ and common/: the packaged copy when present."""
    return PACKAGED if PACKAGED.is_dir() else CHECKOUT
