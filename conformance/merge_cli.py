"""The `merge` and `compare` subcommands: read files, call conformance.merge / conformance.compare, write, exit.

Exit statuses follow pytest's table: 0 done, 1 regressions found (compare), 4 nothing was judged
(a file cannot be read, or the shards cannot be merged).
"""

from __future__ import annotations

import sys

from conformance.exit_codes import ExitCode
from conformance.results import ResultsFileError, load_results, write_json_atomically


def run_merge(paths: list[str], output: str) -> int:
    from conformance.merge import MergeError, merge_documents

    try:
        docs = [(p, load_results(p)) for p in paths]
        merged = merge_documents(docs)
    except ResultsFileError as exc:
        print(f"conformance merge: {exc}", file=sys.stderr)
        return ExitCode.USAGE_ERROR
    except MergeError as exc:
        print(f"conformance merge: not merged, {len(exc.problems)} problems:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return ExitCode.USAGE_ERROR
    write_json_atomically(output, merged)
    summary = ", ".join(f"{v} {k}" for k, v in merged["summary"].items()) or "no results"
    print(f"merged {len(paths)} shards into {output}: {len(merged['results'])} results ({summary}); "
          f"verdict {merged['verdict']}")
    return ExitCode.OK


def run_compare(old_path: str, new_path: str, markdown: str | None) -> int:
    from conformance.compare import compare, render_markdown, render_text

    try:
        old, new = load_results(old_path), load_results(new_path)
    except ResultsFileError as exc:
        print(f"conformance compare: {exc}", file=sys.stderr)
        return ExitCode.USAGE_ERROR
    result = compare(old, new, old_path, new_path)
    print(render_text(result))
    if markdown:
        with open(markdown, "w") as fh:
            fh.write(render_markdown(result))
    return ExitCode.FAILED if result.regressions else ExitCode.OK
