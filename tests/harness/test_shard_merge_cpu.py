"""Three shards of a cpu run (one under -n 2), merged, equal the unsharded run with the same seed."""

from __future__ import annotations

import json
import subprocess
import sys

from harness_runner import run_harness

# A slice of the catalog that holds every kind of item (numerics, aliasing, property, compile, model,
# dispatch) and keeps four quick-level runs cheap.
SELECT = ["-k", "(rms_norm and not fused) or (decoder and float32 and eager)", "--conformance-seed=77"]


def _essence(doc):
    """What must agree between the merged and the unsharded file: everything but durations."""
    results = sorted(({k: v for k, v in r.items() if k != "duration_s"} for r in doc["results"]),
                     key=lambda r: r["nodeid"])
    return results, doc["summary"], doc["verdict"], doc["platform"], doc["environment"]


def test_three_cpu_shards_merge_into_the_unsharded_run(tmp_path):
    runs = {}
    for name, extra in (("whole", []), ("s1", ["--conformance-shard=1/3", "-n", "2"]),
                        ("s2", ["--conformance-shard=2/3"]), ("s3", ["--conformance-shard=3/3"])):
        (tmp_path / name).mkdir()
        runs[name] = run_harness(tmp_path / name, "cpu", *SELECT, *extra)
        assert runs[name].doc is not None, runs[name].output[-3000:]
        assert runs[name].returncode == 0, runs[name].output[-3000:]
    whole = runs["whole"].doc
    shards = [runs[f"s{i}"].doc for i in (1, 2, 3)]
    counts = [len(d["results"]) for d in shards]
    assert all(counts) and sum(counts) == len(whole["results"]) > 60
    assert [d["run"]["selection"]["shard"] for d in shards] == ["1/3", "2/3", "3/3"]
    assert all(d["run"]["complete"] and d["run"]["selection"]["partial"] for d in shards)
    # the two heavy items (the compile check, the model check) land in different shards
    heavy = [sum(1 for r in d["results"] if r["check"] in ("compile", "model")) for d in shards]
    assert sorted(heavy) == [0, 1, 1], heavy

    paths = [str(tmp_path / name / "cpu.json") for name in ("s3", "s1", "s2")]
    merged_path = tmp_path / "all.json"
    proc = subprocess.run([sys.executable, "-m", "conformance", "merge", *paths, "-o", str(merged_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    merged = json.loads(merged_path.read_text())
    assert _essence(merged) == _essence(whole)
    assert merged["run"]["selection"] == {**whole["run"]["selection"], "shard": None}
    assert merged["run"]["expected_results"] == whole["run"]["expected_results"] == len(whole["results"])
    assert merged["run"]["complete"]

    # two of three shards: refused, naming the missing one
    proc = subprocess.run([sys.executable, "-m", "conformance", "merge", *paths[:2], "-o", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4 and "missing shards: 2/3" in proc.stderr
    assert not (tmp_path / "x.json").exists()
