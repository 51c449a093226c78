"""bench_generate.py --compare's own code (engines, rounds, table) on a tiny model against transformers, so a
mistake in it shows here and not first in a long benchmark run. Times are not checked."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

from reference_impl.models import DecoderConfig
from reference_impl.platforms import CpuPlatform, activate_platform

pytest.importorskip("transformers", reason="transformers (the [test] extra) is the engine compared with")
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_generate.py"


def test_compare_runs_the_engines_interleaved_and_prints_ratios(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))                  # its engines module sits beside it
    spec = importlib.util.spec_from_file_location("bench_generate_under_test", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "LLAMA_125M", DecoderConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                                                           num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16))
    import _generate_engines as engines

    runs = []
    for cls in (engines.Ours, engines.Transformers):
        original = cls.run

        def counted(self, prompts, new_tokens, _original=original):
            runs.append((self.name, len(prompts)))
            return _original(self, prompts, new_tokens)
        monkeypatch.setattr(cls, "run", counted)
    monkeypatch.setattr(bench, "SETTLE_S", 0.0)
    args = argparse.Namespace(dtypes=["float32"], batches=[1, 2], prompt_len=8, new_tokens=3, repeats=1, no_vllm=True,
                              vllm_default_placement=False)
    with activate_platform(CpuPlatform()):
        bench.compare(args)
    out = capsys.readouterr().out
    # a warm-up round and one measured round, every engine at every batch, in rotating order
    assert runs == [("ours", 1), ("transformers", 1), ("ours", 2), ("transformers", 2),
                    ("transformers", 1), ("ours", 1), ("transformers", 2), ("ours", 2)]
    rows = [line for line in out.splitlines() if line.startswith("float32, ")]
    assert [r.split()[1] for r in rows[-2:]] == ["1", "2"]
    for row in rows[-2:]:
        cells = row.split()
        assert cells[2].replace(".", "").isdigit() and cells[-1].replace(".", "").isdigit()   # a rate; a ratio
    assert "ours/transformers (prefill, decode)" in out
    assert "ours/vLLM" not in out      # no vLLM column where vLLM was not measured
