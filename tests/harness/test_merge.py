"""`conformance merge`: shards join into the unsharded file; missing, duplicate, overlapping or foreign shards are refused."""

from __future__ import annotations

import json

import pytest

from conformance.cli import main
from conformance.gate.merge import MergeError, merge_documents


def _r(op, outcome="PASS", case="c1"):
    return {"nodeid": f"suites/test_numerics.py::test_ir_case[{op}-p-float32-{case}]", "check": "numerics",
            "op": op, "provider": "p", "dtype": "float32", "case": case, "outcome": outcome,
            "message": None if outcome == "PASS" else "broken", "max_abs_err": 0.0, "max_rel_err": 0.0,
            "repro": None, "duration_s": 0.01}


def _shard(spec, results, verdict="CONFORMANT", complete=True, seed=1, keyword=None, platform="plat", level="quick"):
    return {"schema_version": 1, "platform": {"name": platform, "class": "x.Plat", "device_type": "cpu"},
            "environment": {"python": "3.11", "torch": "2.13.0", "reference_impl": "0.1.0", "seed": seed},
            "run": {"level": level, "seed": seed,
                    "selection": {"partial": True, "keyword": keyword, "markexpr": None, "paths": [], "shard": spec},
                    "expected_results": len(results) + (0 if complete else 1), "written_results": len(results),
                    "complete": complete},
            "results": results, "summary": {}, "verdict": verdict}


def test_merge_joins_shards_in_nodeid_order_with_summary_and_verdict():
    merged = merge_documents([("s2", _shard("2/2", [_r("b", "FAIL")], "NOT_CONFORMANT")),
                              ("s1", _shard("1/2", [_r("c"), _r("a")]))])
    assert [r["op"] for r in merged["results"]] == ["a", "b", "c"]
    assert merged["summary"] == {"PASS": 2, "FAIL": 1}
    assert merged["verdict"] == "NOT_CONFORMANT"
    assert merged["run"] == {"level": "quick", "seed": 1, "selection": {"partial": False, "keyword": None,
                             "markexpr": None, "paths": [], "shard": None},
                             "expected_results": 3, "written_results": 3, "complete": True}
    assert list(merged) == ["schema_version", "platform", "environment", "run", "results", "summary", "verdict"]
    ok = merge_documents([("s1", _shard("1/2", [_r("a")])), ("s2", _shard("2/2", [_r("b")]))])
    assert ok["verdict"] == "CONFORMANT"


def test_a_keyword_selection_stays_partial_after_merging():
    merged = merge_documents([("s1", _shard("1/2", [_r("a")], keyword="rms")),
                              ("s2", _shard("2/2", [_r("b")], keyword="rms"))])
    assert merged["run"]["selection"]["partial"] is True and merged["run"]["selection"]["shard"] is None


@pytest.mark.parametrize("docs, problem", [
    ([("s1", _shard("1/3", [_r("a")])), ("s3", _shard("3/3", [_r("c")]))], "missing shards: 2/3"),
    ([("s1", _shard("1/2", [_r("a")])), ("again", _shard("1/2", [_r("b")])), ("s2", _shard("2/2", [_r("c")]))],
     "shard 1 given more than once: s1, again"),
    ([("s1", _shard("1/2", [_r("a"), _r("b")])), ("s2", _shard("2/2", [_r("b")]))],
     "1 results appear in more than one shard: numerics.test_ir_case b p float32 c1 (in s1 and s2)"),
    ([("s1", _shard("1/2", [_r("a")])), ("s2", _shard("2/3", [_r("b")]))],
     "the shards are of different runs: the shard count N differs (2 in s1; 3 in s2)"),
    ([("s1", _shard("1/2", [_r("a")])), ("s2", _shard("2/2", [_r("b")], seed=7))],
     "the shards are of different runs: run.seed differs (1 in s1; 7 in s2)"),
    ([("s1", _shard("1/2", [_r("a")])), ("s2", _shard("2/2", [_r("b")], platform="other"))],
     "the shards are of different runs: platform differs ({'name': 'plat', 'class': 'x.Plat', 'device_type': 'cpu'} "
     "in s1; {'name': 'other', 'class': 'x.Plat', 'device_type': 'cpu'} in s2)"),
    ([("s1", _shard("1/2", [_r("a")])), ("s2", _shard("2/2", [_r("b")], level="standard"))],
     "the shards are of different runs: run.level differs ('quick' in s1; 'standard' in s2)"),
    ([("s1", _shard("1/2", [_r("a")])), ("s2", _shard("2/2", [_r("b")], complete=False))],
     "s2: incomplete shard (1 of 2 results written): rerun it"),
    ([("s1", _shard("1/2", [_r("a")])), ("s2", _shard(None, [_r("b")]))],
     "s2: no run.selection.shard (was it written by a run with --conformance-shard=I/N?)"),
])
def test_problems_are_reported_not_merged(docs, problem):
    with pytest.raises(MergeError) as info:
        merge_documents(docs)
    assert problem in info.value.problems


def test_merge_cli_writes_the_file_or_lists_the_problems(tmp_path, capsys):
    paths = []
    for spec, results in (("1/2", [_r("a")]), ("2/2", [_r("b")])):
        path = tmp_path / f"s{spec[0]}.json"
        path.write_text(json.dumps(_shard(spec, results)))
        paths.append(str(path))
    out = tmp_path / "all.json"
    assert main(["merge", *paths, "-o", str(out)]) == 0
    assert f"merged 2 shards into {out}: 2 results (2 PASS); verdict CONFORMANT" in capsys.readouterr().out
    assert len(json.loads(out.read_text())["results"]) == 2
    out.unlink()
    assert main(["merge", paths[0], "-o", str(out)]) == 4
    err = capsys.readouterr().err
    assert "not merged, 1 problems:\n  missing shards: 2/2" in err and not out.exists()
