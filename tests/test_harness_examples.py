"""The shipped vendor example is conformant, and fixture dist-infos match their pyproject.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from harness_runner import PLUGINS, as_distribution, entry_points_of, run_harness

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "vendor_plugin"


def test_vendor_example_reaches_a_conformant_scorecard(tmp_path):
    site = as_distribution(EXAMPLE, tmp_path / "site")
    run = run_harness(tmp_path, "myvendor", "-k", "rms_norm or RMSNorm or coverage", dist=site)
    assert run.returncode == 0, run.output[-3000:]
    assert run.doc["verdict"] == "CONFORMANT"
    assert run.outcomes(check="numerics", op="rms_norm", provider="myvendor") == {"PASS"}
    assert run.outcomes(check="numerics", provider="MyVendorRMSNorm") == {"PASS"}
    # its kernel is a torch.library custom op with a fake: lowering traces it
    assert run.outcomes(check="compile", op="rms_norm", provider="myvendor") == {"PASS"}


@pytest.mark.parametrize("dist", ["demo", "broken"])
def test_committed_dist_info_matches_pyproject(dist):
    root = PLUGINS / dist
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    (info,) = root.glob("*.dist-info")
    assert info.name == f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    assert entry_points_of(info) == project["entry-points"]
