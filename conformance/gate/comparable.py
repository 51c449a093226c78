"""Whether two results files may be compared or gated against each other: only runs of one platform.

Results are matched by (check, op, provider, dtype, case), and providers are the platform's own
names, so a baseline of another platform matches nothing and gates nothing, and `compare` would
call every difference between two platforms a regression. Both refuse such a pair with one line
(exit 4, nothing judged); `merge` refuses shards of different runs itself (conformance.gate.merge).
"""

from __future__ import annotations

from typing import Any


class NotComparable(ValueError):
    """Two results files are of different platforms; the message is one line naming both."""


def platform_name(doc: Any) -> str | None:
    """`platform.name` of a parsed results file, None when the file does not say (an older or hand-made file)."""
    platform = doc.get("platform") if isinstance(doc, dict) else None
    name = platform.get("name") if isinstance(platform, dict) else None
    return name if isinstance(name, str) else None


def require_same_platform(first: tuple[str, str | None], second: tuple[str, str | None]) -> None:
    """NotComparable unless the two (label, platform name) pairs name one platform; an unknown name passes."""
    (label_a, name_a), (label_b, name_b) = first, second
    if name_a is not None and name_b is not None and name_a != name_b:
        raise NotComparable(f"{label_a} is a run of platform '{name_a}', {label_b} of platform '{name_b}': "
                            "runs of different platforms are not compared (their providers differ, so their "
                            "results cannot be matched); compare or gate runs of one platform")


def release_change(before: str | None, after: str | None) -> str | None:
    """'vLLM A before, vLLM B now' when two runs were made on different vLLM releases ('no vLLM' for a run that names
    none), else None: what compare and the baseline gate say, since such a change may be vLLM's, not the plugin's."""
    if before == after:
        return None
    return f"{_release(before)} before, {_release(after)} now"


def _release(version: str | None) -> str:
    return f"vLLM {version}" if version else "no vLLM"
