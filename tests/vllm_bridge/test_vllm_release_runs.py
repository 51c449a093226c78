"""scripts/vllm_release_runs.py: what it makes of each release's results file, and how it writes the table of
outcomes per release into docs/vllm.md (the runs themselves need one environment per release: not in CI)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "vllm_release_runs.py"


def _script():
    spec = importlib.util.spec_from_file_location("vllm_release_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


runs = _script()


def _r(outcome, op="rotary_embedding", dtype="bfloat16", message=None, test="ir_case", check="numerics"):
    return {"nodeid": f"suites/test_{check}.py::test_{test}[{op}-p-{dtype}-c]", "check": check, "op": op,
            "provider": "vllm:RotaryEmbedding", "dtype": dtype, "case": "c", "outcome": outcome, "message": message}


def _doc(release, results):
    return {"environment": {"vllm": release}, "run": {"complete": True}, "verdict": "NOT_CONFORMANT",
            "results": results}


def test_a_run_is_counted_and_its_gating_results_grouped_with_one_message():
    doc = _doc("0.28.0", [_r("PASS"), _r("FAIL", message="rotates only the first head\nsecond line"),
                          _r("FAIL", dtype="float32", message="x"), _r("CRASH", message="SIGSEGV | in `kernel`"),
                          _r("NOT_SUPPORTED")])
    s = runs.summarise(doc, 61.26, 1)
    assert s["vllm"] == "0.28.0" and s["wall_s"] == 61.3 and s["returncode"] == 1
    assert s["counts"] == {"PASS": 1, "FAIL": 2, "CRASH": 1, "NOT_SUPPORTED": 1}
    assert s["gating"] == [
        {"check": "numerics.ir_case", "op": "rotary_embedding", "provider": "vllm:RotaryEmbedding", "outcome": "CRASH",
         "count": 1, "dtypes": ["bfloat16"], "example": "SIGSEGV / in 'kernel'"},
        {"check": "numerics.ir_case", "op": "rotary_embedding", "provider": "vllm:RotaryEmbedding", "outcome": "FAIL",
         "count": 2, "dtypes": ["bfloat16", "float32"], "example": "rotates only the first head"}]
    long = runs.first_line("y" * 400)
    assert len(long) == runs.MESSAGE_CHARS and long.endswith("...")


def test_the_page_gets_a_table_per_release_and_what_differs_from_the_newest(tmp_path):
    old = runs.summarise(_doc("0.28.0", [_r("PASS"), _r("ERROR", op="attention", test="forward", check="attention",
                                                        message="FP8 KV cache is only supported")]), 60, 1)
    new = runs.summarise(_doc("0.32.0", [_r("PASS"), _r("FAIL", message="first head")]), 80, 1)
    text = runs.render([old, new], "standard", 2, "2 cores, test machine")
    assert text.startswith(runs.BEGIN) and text.endswith(runs.END)
    assert "| 0.28.0 | 60 s | NOT_CONFORMANT | 1 |  | " in text
    assert "#### vLLM 0.28.0: results that gate" in text and "#### vLLM 0.32.0: results that gate" in text
    assert "Only on 0.28.0: attention.forward attention vllm:RotaryEmbedding ERROR." in text
    assert "Only on 0.32.0: numerics.ir_case rotary_embedding vllm:RotaryEmbedding FAIL." in text
    page = tmp_path / "vllm.md"
    page.write_text(f"# head\n\n{runs.BEGIN}\nold part\n{runs.END}\n\ntail stays\n")
    runs.write_doc(page, text)
    written = page.read_text()
    assert "old part" not in written and written.count(runs.BEGIN) == 1 and written.endswith("\n\ntail stays\n")
    assert written.startswith("# head\n\n" + text)


def test_an_environment_is_named_by_its_release_or_the_script_stops(tmp_path, capsys):
    with pytest.raises(SystemExit):
        runs.main(["--python", f"0.28={tmp_path / 'absent' / 'python'}"])
    assert "expected RELEASE=PATH to an existing Python" in capsys.readouterr().err


def test_the_page_can_be_rewritten_from_an_earlier_json(tmp_path, capsys):
    import json

    summary = runs.summarise(_doc("0.32.0", [_r("PASS"), _r("FAIL", message="first head")]), 80, 1)
    saved = tmp_path / "runs.json"
    saved.write_text(json.dumps([summary]))
    assert runs.main(["--from-json", str(saved), "--machine", "a test machine"]) == 0
    out = capsys.readouterr().out
    assert "a test machine" in out and "| 0.32.0 | 80 s | NOT_CONFORMANT | 1 |" in out
    with pytest.raises(SystemExit):
        runs.main([])
    assert "give either --python" in capsys.readouterr().err
