"""The project's import graph: no module imports itself through others, and the IR is a leaf.

Read statically with `ast` from the sources (nothing is imported): every `import` and
`from ... import` statement of a module, at module level, inside functions and under
`if TYPE_CHECKING:` alike, is an arrow to the project module it names. `from pkg import name`
points at `pkg.name` where that is a module, else at `pkg`. Importing a submodule runs its
package's `__init__` first; that implicit step is not an arrow (every module would otherwise
"import" its own package), only what a file writes down is.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The project's top-level packages whose import graphs must have no cycle.
PACKAGES = [
    "reference_impl",
    "conformance",
    "suites",
]


def module_files() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name (a package by its `__init__`)."""
    modules = {}
    for package in ("reference_impl", "conformance", "suites"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that module `name` (source at `path`) imports anywhere in its body."""

    def known(dotted: str) -> str | None:
        """`dotted` or its longest prefix that is a project module (None outside the project)."""
        parts = dotted.split(".")
        while parts:
            candidate = ".".join(parts)
            if candidate in modules:
                return candidate
            parts.pop()
        return None

    package = name if _is_package(path) else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets.update(filter(None, (known(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else known(base)
                if target:
                    targets.add(target)
    targets.discard(name)
    return targets


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]], members: set[str]) -> list[set[str]]:
    """The strongly connected components of `graph` restricted to `members` that hold more than
    one module: each a set of modules that all reach each other through imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    counter = 0

    def strongconnect(start: str) -> None:        # Tarjan's algorithm, iterative
        nonlocal counter
        work = [(start, iter(sorted(graph[start] & members)))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child] & members))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)

    for node in sorted(members):
        if node not in index:
            strongconnect(node)
    return components


def find_cycles(graph: dict[str, set[str]], members: set[str]) -> list[list[str]]:
    """One cycle per circle of `graph` within `members`, written as a closed path (the first module
    repeated last)."""
    return [_closed_path(graph, component) for component in circles(graph, members)]


def _closed_path(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the alphabetically first module of a strongly connected component."""
    start = min(component)
    previous = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start} in its component {sorted(component)}")


def _describe(graph: dict[str, set[str]], components: list[set[str]]) -> str:
    """Per circle: one cycle through it, and every module in it when there are more."""
    lines = []
    for component in components:
        line = " -> ".join(_closed_path(graph, component))
        if len(component) > len(_closed_path(graph, component)) - 1:
            line += f"  (a circle of {len(component)} modules: {', '.join(sorted(component))})"
        lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    graph = import_graph()
    members = {m for m in graph if m == package or m.startswith(package + ".")}
    assert members, f"no modules found for package {package!r} under {ROOT}"
    found = circles(graph, members)
    assert not found, f"import cycles in {package}:\n{_describe(graph, found)}"


def test_no_import_cycle_across_packages():
    graph = import_graph()
    found = [c for c in circles(graph, set(graph)) if len({m.split(".")[0] for m in c}) > 1]
    assert not found, f"import cycles across packages:\n{_describe(graph, found)}"


def test_ir_imports_nothing_else_of_reference_impl():
    graph = import_graph()
    outside = {(module, target) for module, targets in graph.items()
               if module == "reference_impl.ir" or module.startswith("reference_impl.ir.")
               for target in targets
               if target != "reference_impl.ir" and not target.startswith("reference_impl.ir.")}
    assert not outside, "reference_impl.ir imports other project modules: " + ", ".join(
        f"{m} -> {t}" for m, t in sorted(outside))


def test_cycle_finder_names_the_cycle():
    """The checker itself: a planted two-module cycle and a three-module one are both reported
    as closed paths, and an acyclic graph gives none."""
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    cycles = find_cycles(graph, set(graph))
    assert sorted(map(tuple, cycles)) == [("a", "b", "a"), ("c", "d", "e", "c")]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}, {"a", "b", "c"}) == []


def test_reader_sees_function_level_and_relative_imports(tmp_path):
    """The reader finds imports inside functions, relative imports and `from pkg import module`."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from .sub import thing\n")
    (tmp_path / "pkg" / "sub.py").write_text("def f():\n    from pkg import other\n    import pkg.deep.leaf\n")
    (tmp_path / "pkg" / "other.py").write_text("")
    (tmp_path / "pkg" / "deep").mkdir()
    (tmp_path / "pkg" / "deep" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "deep" / "leaf.py").write_text("from ..other import x\nfrom . import sibling\n")
    modules = {"pkg": tmp_path / "pkg" / "__init__.py", "pkg.sub": tmp_path / "pkg" / "sub.py",
               "pkg.other": tmp_path / "pkg" / "other.py", "pkg.deep": tmp_path / "pkg" / "deep" / "__init__.py",
               "pkg.deep.leaf": tmp_path / "pkg" / "deep" / "leaf.py"}
    assert imported_modules("pkg", modules["pkg"], modules) == {"pkg.sub"}
    assert imported_modules("pkg.sub", modules["pkg.sub"], modules) == {"pkg.other", "pkg.deep.leaf"}
    assert imported_modules("pkg.deep.leaf", modules["pkg.deep.leaf"], modules) == {"pkg.other", "pkg.deep"}


# The harness's stages and what each may import of the others (docs/architecture.md draws them). A stage is a
# subpackage of `conformance` (or a top-level module); the front doors import every stage and nothing imports them.
# `vllm` (the bridge) and `checks` are siblings: the checks reach vLLM only through the platform object they are
# handed, and the bridge never runs a check.
STAGE_IMPORTS = {
    "exit_codes": set(),
    "shm_files": set(),
    "scratch_dirs": {"results", "shm_files"},
    "collect": set(),
    "results": {"collect"},
    "judge": {"collect", "results"},
    "vllm": {"collect", "results", "scratch_dirs"},
    "checks": {"collect", "results", "judge", "shm_files", "scratch_dirs"},
    "gate": {"collect", "results", "checks"},
    "run": {"collect", "results", "judge", "checks", "gate", "exit_codes", "shm_files", "scratch_dirs"},
    "report": {"collect", "results", "judge", "gate"},
}
FRONT_DOORS = {"conformance", "pytest_plugin", "cli", "__main__"}


def stage_of(module: str) -> str | None:
    """The harness stage `module` belongs to (None outside `conformance`)."""
    parts = module.split(".")
    if parts[0] != "conformance":
        return None
    return parts[1] if len(parts) > 1 else "conformance"


def against_the_layers(graph: dict[str, set[str]]) -> list[str]:
    """Every import from one harness stage into another that STAGE_IMPORTS does not allow, as 'a -> b'."""
    wrong = []
    for module, targets in sorted(graph.items()):
        stage = stage_of(module)
        if stage is None or stage in FRONT_DOORS:
            continue
        for target in sorted(targets):
            other = stage_of(target)
            if other is None or other == stage:
                continue
            if other in FRONT_DOORS or other not in STAGE_IMPORTS.get(stage, set()):
                wrong.append(f"{module} -> {target}  ({stage} may not import {other})")
    return wrong


def test_every_harness_stage_is_in_the_layer_table():
    stages = {stage_of(m) for m in import_graph() if stage_of(m) is not None}
    unknown = stages - set(STAGE_IMPORTS) - FRONT_DOORS
    assert not unknown, f"harness stages missing from STAGE_IMPORTS (say what each may import): {sorted(unknown)}"


def test_harness_imports_follow_the_layers():
    wrong = against_the_layers(import_graph())
    assert not wrong, "imports against the harness's layers (docs/architecture.md):\n" + "\n".join(wrong)


def test_layer_checker_names_the_import():
    """The checker itself: a planted judge -> checks import and a checks -> vllm import are reported, allowed
    arrows and the front doors are not."""
    graph = {"conformance.judge.oracle": {"conformance.checks.common", "conformance.results.result"},
             "conformance.checks.engine": {"conformance.vllm.platform", "conformance.judge.oracle"},
             "conformance.pytest_plugin": {"conformance.checks", "conformance.vllm.platform"},
             "conformance.collect.units": {"torch"}}
    assert against_the_layers(graph) == [
        "conformance.checks.engine -> conformance.vllm.platform  (checks may not import vllm)",
        "conformance.judge.oracle -> conformance.checks.common  (judge may not import checks)"]
