"""Run `pytest --platform=<fixture>` in a subprocess with a fixture plugin on PYTHONPATH; parse its results.

Fixture plugins (tests/plugins/<dist>/) are sys.path roots holding a package and a `*.dist-info` (committed, or
for the broken fixtures made from their records: `plugin_roots`), so importlib.metadata finds their entry points
exactly as for a pip-installed vendor plugin, but only in the subprocess: they never leak into the project's own
test process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import warm_python

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


@dataclasses.dataclass
class HarnessRun:
    returncode: int
    output: str
    doc: dict | None

    @property
    def results(self) -> list[dict]:
        return self.doc["results"] if self.doc else []

    def where(self, **fields) -> list[dict]:
        return [r for r in self.results if all(r.get(k) == v for k, v in fields.items())]

    def outcomes(self, **fields) -> set[str]:
        return {r["outcome"] for r in self.where(**fields)}


def broken_records():
    """`tests/plugins/broken/conformance_broken/records.py`, loaded by path (standard library only, it puts
    nothing on sys.path): `faults()`, `controls()`, `entry_points()` of the broken fixtures."""
    import importlib.util

    name = "_conformance_broken_records"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, PLUGINS / "broken" / "conformance_broken" / "records.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_GENERATED: dict[Path, Path] = {}


def plugin_roots(dist: str | Path) -> list[Path]:
    """The sys.path roots of a fixture plugin: its directory (with its committed `*.dist-info`), and for the broken
    fixtures, whose entry points come from their records, a directory made once per process holding the dist-info
    `pip install tests/plugins/broken` would write: the pyproject's name and version, the records' entry points."""
    root = PLUGINS / dist if isinstance(dist, str) else dist
    if root != PLUGINS / "broken":
        return [root]
    if root not in _GENERATED:
        import atexit
        import shutil
        import tempfile
        import tomllib

        project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
        site = Path(tempfile.mkdtemp(prefix="fixture-dist-info-"))
        atexit.register(shutil.rmtree, site, True)
        write_dist_info(site, project["name"], project["version"], broken_records().entry_points())
        _GENERATED[root] = site
    return [root, _GENERATED[root]]


def harness_env(dist: str | Path | None = None, **extra: str) -> dict[str, str]:
    """The environment of a harness subprocess: no inherited allowlist or xdist state, `dist` on PYTHONPATH."""
    env = dict(os.environ)
    env.pop("REFERENCE_IMPL_PLUGINS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    if dist:
        roots = [str(r) for r in plugin_roots(dist)]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*roots, env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def harness_command(platform: str, out: Path, level: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", f"--platform={platform}", f"--conformance-level={level}",
            f"--conformance-json={out}", "-p", "no:cacheprovider", *args]


def run_harness(tmp_path: Path, platform: str, *args: str, dist: str | Path | None = None,
                level: str = "quick", timeout: float = 300, env: dict[str, str] | None = None) -> HarnessRun:
    """`python -m pytest --platform=... --conformance-json=...` from `tmp_path` (not the project root), forked from a
    warm interpreter where that is safe (warm_python); `env` adds variables (e.g. REFERENCE_IMPL_PLUGINS) to the
    cleaned environment."""
    out = tmp_path / f"{platform}.json"
    cmd = harness_command(platform, out, level, *args)
    run_env = harness_env(dist, **(env or {}))
    proc = warm_python.run(cmd[2:], tmp_path, run_env, timeout, template_env=harness_env())
    if proc is None:   # a run that may not fork from the warm template (warm_python says which)
        proc = subprocess.run(cmd, cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=timeout)
    doc = json.loads(out.read_text()) if out.exists() else None
    return HarnessRun(proc.returncode, proc.stdout + proc.stderr, doc)


def as_distribution(project_dir: Path, target: Path) -> Path:
    """Lay out `project_dir` (a pyproject.toml plugin) under `target` as an installed distribution:
    its packages plus a `*.dist-info` with the pyproject's entry points; returns `target`."""
    import shutil
    import tomllib

    meta = tomllib.loads((project_dir / "pyproject.toml").read_text())
    project = meta["project"]
    for package in meta["tool"]["setuptools"]["packages"]:
        shutil.copytree(project_dir / package, target / package)
    write_dist_info(target, project["name"], project["version"], project.get("entry-points", {}))
    return target


def write_dist_info(target: Path, name: str, version: str, groups: dict[str, dict[str, str]]) -> Path:
    """`<name>-<version>.dist-info/` (METADATA and entry_points.txt) under `target`, as an installer writes it."""
    info = target / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for group, eps in groups.items()))
    return info


def entry_points_of(dist_info: Path) -> dict[str, dict[str, str]]:
    """The groups and entry points of a dist-info's entry_points.txt."""
    import configparser

    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str
    parser.read(dist_info / "entry_points.txt")
    return {s: dict(parser[s]) for s in parser.sections()}


_KERNEL_WORKER_PROBE = """
import json, os
def pytest_runtest_teardown(item):
    from conformance.pytest_plugin import _state
    proc = _state(item.config).worker.proc
    with open(f"/proc/{proc.pid}/stat") as fh:
        parent = int(fh.read().rsplit(")", 1)[1].split()[1])
    with open("kernel_worker_probe.json", "w") as fh:
        json.dump({"kind": type(proc).__name__, "parent": parent, "cwd": os.readlink(f"/proc/{proc.pid}/cwd")}, fh)
"""


def kernel_worker_probe(cwd: Path) -> tuple[str, Path]:
    """A pytest plugin for a single-process harness run from `cwd` (on its sys.path): after each check it writes what
    the run's kernel worker is (the type of its process handle), whose child, in which directory. Returns the `-p`
    name and the JSON file it writes."""
    (cwd / "kernel_worker_probe.py").write_text(_KERNEL_WORKER_PROBE)
    return "kernel_worker_probe", cwd / "kernel_worker_probe.json"
