"""The identity of one result across files: what merge and compare match results by.

(check, test, op, provider, dtype, case): the suite test's name is part of it because two dispatch
checks can share the other fields (priority and supports_args of one provider; coverage of an IR op
and of the CustomOp of the same name). The nodeid's path is not: it depends on where pytest ran.
"""

from __future__ import annotations

from typing import Any

CaseKey = tuple


def suite_function(nodeid: str | None) -> str:
    """'suites/test_dispatch.py::test_priority[rms_norm-cpp]' -> 'test_priority'."""
    return (nodeid or "").rpartition("::")[2].partition("[")[0]


def case_key(result: dict[str, Any]) -> CaseKey:
    return (result.get("check"), suite_function(result.get("nodeid")), result.get("op"), result.get("provider"),
            result.get("dtype"), result.get("case"))


def describe(key: CaseKey) -> str:
    """'numerics.test_ir_case rms_norm cpp float32 tokens=7,hidden=769' (absent fields left out)."""
    check, test, *rest = key
    head = f"{check}.{test}" if test else str(check)
    return " ".join([head, *(str(x) for x in rest if x is not None)])
