"""scripts/vllm_release_probe.py: what it records of a vLLM release, how it writes the comparison of releases into
docs/vllm-releases.md, and (with vLLM installed) that every API the bridge uses is there in the set-up's vLLM."""

from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "vllm_release_probe.py"
PAGE = ROOT / "docs" / "vllm-releases.md"


def _probe_module():
    spec = importlib.util.spec_from_file_location("vllm_release_probe", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


probe = _probe_module()


def test_parameters_keep_names_kinds_and_defaults_but_not_annotations():
    def f(a: int, /, b: "torch.Tensor", *args, c: float = 1.5, **kw) -> None: ...

    assert probe.parameters(inspect.signature(f)) == ["a", "/", "b", "*args", "c=1.5", "**kw"]

    def g(x, *, flag=False): ...

    assert probe.normalised(inspect.signature(g)) == "(x, *, flag=False)"


def test_lacking_names_the_keywords_and_the_positional_order_the_bridge_relies_on():
    def old(self, head_size, dtype, use_mla=False): ...

    sig = inspect.signature(old)
    assert probe.lacking(sig, needs=("use_mla", "use_dcp")) == ["no parameter 'use_dcp'"]
    assert probe.lacking(sig, positional=("dtype", "head_size")) == [
        "positional order ['head_size', 'dtype'] where the bridge passes ['dtype', 'head_size']"]

    def any_keyword(self, *args, **kwargs): ...

    assert probe.lacking(inspect.signature(any_keyword), needs=("anything",)) == []


def _row(name, status="ok", params=None, detail=""):
    return {"name": name, "group": "g", "used_by": "conformance/vllm/x.py", "status": status, "detail": detail,
            "params": params, "signature": None if params is None else "(" + ", ".join(params) + ")"}


def test_the_matrix_names_each_move_by_the_first_release_with_it():
    runs = [
        {"vllm": "0.28.0", "torch": "2.13.0+cpu", "rows": [_row("f", params=["x", "eps=1e-06"]),
                                                            _row("G", "missing", detail="ImportError")]},
        {"vllm": "0.29.0", "torch": "2.13.0+cpu", "rows": [_row("f", params=["x", "eps=1e-06"]),
                                                            _row("G", params=[])]},
        {"vllm": "0.32.0", "torch": "2.13.0+cpu", "rows": [_row("f", params=["hidden", "eps=1e-05"]),
                                                            _row("G", params=[])]},
    ]
    text = probe.matrix(runs)
    assert "| `f` | conformance/vllm/x.py | ok* | ok* | ok |" in text
    assert "| `G` | conformance/vllm/x.py | missing | ok | ok |" in text
    assert "- `f`: **0.32.0** +`hidden`, -`x`, `eps=1e-06` -> `eps=1e-05`" in text
    assert "- `G`: **0.29.0** missing -> ok" in text
    assert "- **0.28.0**: `G` missing: ImportError" in text
    assert "- **0.32.0**: nothing the bridge uses" in text


def test_the_page_keeps_its_generated_part_between_the_markers_with_the_command():
    text = PAGE.read_text()
    assert text.count(probe.BEGIN) == 1 and text.count(probe.END) == 1
    generated = text.split(probe.BEGIN)[1].split(probe.END)[0]
    assert "scripts/vllm_release_probe.py --doc docs/vllm-releases.md" in generated
    assert "Releases probed: 0.27.0, 0.28.0, 0.29.0, 0.30.0, 0.31.0, 0.32.0" in generated


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here (bash "
                                                                    "scripts/setup.sh --vllm installs the CPU build)")
def test_every_api_the_bridge_uses_is_in_the_set_ups_vllm(tmp_path):
    out = tmp_path / "probe.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(out.read_text())
    # a release older than 0.32 lacks what the page records for it, each gap one the bridge adapts to (a release
    # adapter, or NOT_SUPPORTED naming the release); nothing else may be missing
    recorded = _recorded_gaps(facts["vllm"])
    bad = [f"{r['name']}: {r['status']} {r['detail']}" for r in facts["rows"]
           if r["status"] != "ok" and f"`{r['name']}`" not in recorded]
    assert not bad, "\n".join(bad)
    assert len(facts["rows"]) > 100   # every part of the bridge was probed, not only the imports


def _recorded_gaps(release: str) -> str:
    """The page's line of what `release` lacks ('' for a release it does not list, such as 0.32 or 0.33)."""
    section = PAGE.read_text().split("### What each release lacks", 1)[1]
    prefix = f"- **{release.split('+')[0]}**:"
    return next((line for line in section.splitlines() if line.startswith(prefix)), "")
