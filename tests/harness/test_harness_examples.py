"""The shipped vendor example is conformant, and the fixture plugins' entry points are the ones they declare."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from harness_runner import PLUGINS, as_distribution, broken_records, entry_points_of, harness_env, run_harness

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vendor_plugin"


def test_vendor_example_reaches_a_conformant_scorecard(tmp_path):
    site = as_distribution(EXAMPLE, tmp_path / "site")
    run = run_harness(tmp_path, "myvendor", "-k", "rms_norm or RMSNorm or coverage", dist=site)
    assert run.returncode == 0, run.output[-3000:]
    assert run.doc["verdict"] == "CONFORMANT"
    assert run.outcomes(check="numerics", op="rms_norm", provider="myvendor") == {"PASS"}
    assert run.outcomes(check="numerics", provider="MyVendorRMSNorm") == {"PASS"}
    # its kernel is a torch.library custom op with a fake: lowering traces it
    assert run.outcomes(check="compile", op="rms_norm", provider="myvendor") == {"PASS"}


def test_committed_dist_info_matches_pyproject():
    root = PLUGINS / "demo"
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    (info,) = root.glob("*.dist-info")
    assert info.name == f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    assert entry_points_of(info) == project["entry-points"]


def test_broken_fixtures_entry_points_come_from_their_records():
    """No list of the broken fixtures is committed: pyproject.toml leaves the entry points to setup.py, and the
    harness subprocess gets a dist-info made from the records (harness_runner.plugin_roots). There,
    importlib.metadata finds one `broken_<fixture>` per record plus the special ones, and each resolves to a
    register function returning its module's Platform."""
    records = broken_records()
    root = PLUGINS / "broken"
    assert not list(root.glob("*.dist-info"))
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert "entry-points" not in project and "entry-points" in project["dynamic"]
    assert "records.entry_points()" in (root / "setup.py").read_text()
    code = ("import json\nfrom importlib.metadata import entry_points\n"
            f"eps = [ep for ep in entry_points(group={records.GROUP!r}) if ep.name.startswith('broken_')]\n"
            "print(json.dumps({ep.name: [ep.value, None if ep.name == 'broken_import' else ep.load()()] "
            "for ep in eps}))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=harness_env("broken"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert {name: value for name, (value, _) in found.items()} == records.entry_points()[records.GROUP]
    assert {name: platform for name, (_, platform) in found.items() if name not in records.SPECIAL_ENTRY_POINTS} == {
        f"broken_{name}": f"conformance_broken.{name}.Platform" for name in records.fixtures()}
    assert found["broken_absent"][1] is None
    assert len(records.faults()) >= 25 and {"missing_epsilon", "segfault", "oot_name"} <= set(records.faults())
