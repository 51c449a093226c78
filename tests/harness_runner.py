"""Run `pytest --platform=<fixture>` in a subprocess with a fixture plugin on PYTHONPATH; parse its results.

Fixture plugins (tests/plugins/<dist>/) are sys.path roots holding a package and a committed
`*.dist-info`, so importlib.metadata finds their entry points exactly as for a pip-installed vendor
plugin, but only in the subprocess: they never leak into the project's own test process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

PLUGINS = Path(__file__).resolve().parent / "plugins"


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


def harness_env(dist: str | Path | None = None, **extra: str) -> dict[str, str]:
    """The environment of a harness subprocess: no inherited allowlist or xdist state, `dist` on PYTHONPATH."""
    env = dict(os.environ)
    env.pop("REFERENCE_IMPL_PLUGINS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    if dist:
        root = PLUGINS / dist if isinstance(dist, str) else dist
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def harness_command(platform: str, out: Path, level: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", f"--platform={platform}", f"--conformance-level={level}",
            f"--conformance-json={out}", "-p", "no:cacheprovider", *args]


def run_harness(tmp_path: Path, platform: str, *args: str, dist: str | Path | None = None,
                level: str = "quick", timeout: float = 300, env: dict[str, str] | None = None) -> HarnessRun:
    """`python -m pytest --platform=... --conformance-json=...` from `tmp_path` (not the project root);
    `env` adds variables (e.g. REFERENCE_IMPL_PLUGINS) to the cleaned environment."""
    out = tmp_path / f"{platform}.json"
    cmd = harness_command(platform, out, level, *args)
    proc = subprocess.run(cmd, cwd=tmp_path, env=harness_env(dist, **(env or {})), capture_output=True, text=True,
                          timeout=timeout)
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
    info = target / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = project.get("entry-points", {})
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for group, eps in groups.items()))
    return target


def entry_points_of(dist_info: Path) -> dict[str, dict[str, str]]:
    """The groups and entry points of a dist-info's entry_points.txt."""
    import configparser

    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str
    parser.read(dist_info / "entry_points.txt")
    return {s: dict(parser[s]) for s in parser.sections()}
