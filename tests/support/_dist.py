"""Make tiny installed-looking distributions (package + dist-info with entry points) for plugin tests.

importlib.metadata discovers them on sys.path exactly as it discovers a pip-installed vendor plugin.
"""

from __future__ import annotations

import textwrap
from pathlib import Path


def make_distribution(root: Path, dist_name: str, modules: dict[str, str],
                      entry_points: dict[str, dict[str, str]]) -> Path:
    """Write `modules` (dotted name -> source) and `<dist>-0.1.dist-info` under `root`; return root."""
    root.mkdir(parents=True, exist_ok=True)
    for dotted, source in modules.items():
        parts = dotted.split(".")
        pkg_dir = root.joinpath(*parts[:-1])
        pkg_dir.mkdir(parents=True, exist_ok=True)
        for i in range(1, len(parts)):
            init = root.joinpath(*parts[:i], "__init__.py")
            if not init.exists():
                init.write_text("")
        target = pkg_dir / f"{parts[-1]}.py"
        if target.name == "__init__.py" or dotted.endswith(".__init__"):
            target = pkg_dir / "__init__.py"
        target.write_text(textwrap.dedent(source))
    info = root / f"{dist_name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 0.1\n")
    lines = []
    for group, eps in entry_points.items():
        lines.append(f"[{group}]")
        lines.extend(f"{name} = {value}" for name, value in eps.items())
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines))
    return root
