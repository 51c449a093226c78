"""The `merge` and `compare` subcommands: read files, call conformance.merge / conformance.compare, write, exit.

Exit statuses follow pytest's table: 0 done, 1 regressions found (compare), 4 nothing was judged
(a file cannot be read, or the shards cannot be merged).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

OK, FAILED, USAGE_ERROR = 0, 1, 4


class _Unreadable(Exception):
    pass


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise _Unreadable(f"{path}: no such results file") from None
    except (OSError, ValueError) as exc:
        raise _Unreadable(f"{path}: cannot read it as JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise _Unreadable(f"{path}: not a results file (no results list)")
    return doc


def write_json(path: str, doc: dict[str, Any]) -> None:
    """Atomically, like the harness writes its results file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".conformance-", suffix=".json", dir=directory)
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=1, allow_nan=False)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def run_merge(paths: list[str], output: str) -> int:
    from conformance.merge import MergeError, merge_documents

    try:
        docs = [(p, _load(p)) for p in paths]
        merged = merge_documents(docs)
    except _Unreadable as exc:
        print(f"conformance merge: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except MergeError as exc:
        print(f"conformance merge: not merged, {len(exc.problems)} problems:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return USAGE_ERROR
    write_json(output, merged)
    summary = ", ".join(f"{v} {k}" for k, v in merged["summary"].items()) or "no results"
    print(f"merged {len(paths)} shards into {output}: {len(merged['results'])} results ({summary}); "
          f"verdict {merged['verdict']}")
    return OK


def run_compare(old_path: str, new_path: str, markdown: str | None) -> int:
    from conformance.compare import compare, render_markdown, render_text

    try:
        old, new = _load(old_path), _load(new_path)
    except _Unreadable as exc:
        print(f"conformance compare: {exc}", file=sys.stderr)
        return USAGE_ERROR
    result = compare(old, new, old_path, new_path)
    print(render_text(result))
    if markdown:
        with open(markdown, "w") as fh:
            fh.write(render_markdown(result))
    return FAILED if result.regressions else OK
