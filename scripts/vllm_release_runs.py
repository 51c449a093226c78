#!/usr/bin/env python3
"""Run `pytest --platform=vllm` (the standard level, vLLM's own CpuPlatform) on each vLLM release of the supported
window and write one table of outcomes per release into docs/vllm.md (issue 43; not run in CI: each run takes one to
two minutes on 2 cores, and the releases need an environment each, docs/vllm-releases.md "Installing each release").

    python scripts/vllm_release_runs.py --python 0.28=/venvs/vllm-0.28.0/bin/python \\
        --python 0.32=.venv/bin/python --doc docs/vllm.md [--json runs.json] [--level standard] [-n 2]

Each environment's Python must have vLLM and this project installed. A run goes from a scratch directory with the
environment's own pytest; its results file gives the counts, and the results that gate (FAIL, ERROR, CRASH,
TIMEOUT) are listed grouped by check, op, provider and outcome with the first line of one message, so that a
release's failures can be read beside another's. The part of the page between the markers is replaced; the
explanations of each failure stay hand-written outside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

BEGIN = "<!-- vllm_release_runs: begin (generated; edit scripts/vllm_release_runs.py, not this part) -->"
END = "<!-- vllm_release_runs: end -->"
GATING = ("FAIL", "ERROR", "CRASH", "TIMEOUT")
ORDER = ("PASS", "QUALITY_WARNING", "FAIL", "ERROR", "CRASH", "TIMEOUT", "NOT_SUPPORTED", "NOT_IMPLEMENTED", "SKIP",
         "XFAIL", "XPASS")
MESSAGE_CHARS = 150


def check_of(result: dict) -> str:
    """family.check of a result (its suite function is test_<check>)."""
    nodeid = result.get("nodeid") or ""
    name = nodeid.split("::test_", 1)[1].split("[", 1)[0] if "::test_" in nodeid else "?"
    return f"{result['check']}.{name}"


def first_line(message: str | None) -> str:
    line = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    line = line.replace("|", "/").replace("`", "'")
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 3] + "..."


def summarise(doc: dict, wall_s: float, returncode: int) -> dict:
    """What the page shows of one run: release, wall time, verdict, counts, the gating results grouped."""
    counts = Counter(r["outcome"] for r in doc["results"])
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in doc["results"]:
        if r["outcome"] in GATING:
            groups[(check_of(r), r["op"], r["provider"] or "", r["outcome"])].append(r)
    rows = [{"check": k[0], "op": k[1], "provider": k[2], "outcome": k[3], "count": len(v),
             "dtypes": sorted({r["dtype"] or "-" for r in v}), "example": first_line(v[0]["message"])}
            for k, v in sorted(groups.items())]
    return {"vllm": doc["environment"].get("vllm"), "wall_s": round(wall_s, 1), "returncode": returncode,
            "verdict": doc.get("verdict"), "complete": (doc.get("run") or {}).get("complete"),
            "counts": {o: counts[o] for o in ORDER if counts[o]}, "gating": rows}


def run_one(python: str, level: str, workers: int) -> dict:
    """One standard run in a scratch directory with this environment's Python; its summary."""
    with tempfile.TemporaryDirectory(prefix="vllm-release-run-") as tmp:
        results = Path(tmp) / "results.json"
        cmd = [python, "-m", "pytest", "--platform=vllm", f"--conformance-level={level}", "-p", "no:cacheprovider",
               "-q", f"--conformance-json={results}"] + (["-n", str(workers)] if workers > 1 else [])
        env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}   # vLLM's own platform, every plugin
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        if not results.exists():
            raise SystemExit(f"{python}: the run wrote no results file (exit {proc.returncode}):\n"
                             f"{(proc.stdout + proc.stderr)[-3000:]}")
        return summarise(json.loads(results.read_text()), wall, proc.returncode)


def _group_key(row: dict) -> tuple:
    return (row["check"], row["op"], row["provider"], row["outcome"])


def render(runs: list[dict], level: str, workers: int, machine: str) -> str:
    """The generated part of the page: a counts table, then each release's gating results, then what differs."""
    out = [BEGIN, "", f"Regenerate with `python scripts/vllm_release_runs.py --python X.Y=PATH ... --doc docs/vllm.md` "
           f"(level {level}, `-n {workers}`; {machine}).", "",
           "| vLLM | wall | verdict | " + " | ".join(ORDER) + " |",
           "| --- | ---: | --- | " + " | ".join("---:" for _ in ORDER) + " |"]
    for run in runs:
        out.append(f"| {run['vllm']} | {run['wall_s']:.0f} s | {run['verdict']}"
                   + ("" if run["complete"] else " (incomplete)") + " | "
                   + " | ".join(str(run["counts"].get(o, "")) for o in ORDER) + " |")
    newest = runs[-1]
    for run in runs:
        out += ["", f"#### vLLM {run['vllm']}: results that gate", ""]
        if not run["gating"]:
            out.append("none")
            continue
        out += ["| check | op | provider | outcome | n | dtypes | one message |", "| --- | --- | --- | --- | ---: | --- | --- |"]
        out += [f"| {r['check']} | {r['op']} | {r['provider']} | {r['outcome']} | {r['count']} | "
                f"{', '.join(r['dtypes'])} | {r['example']} |" for r in run["gating"]]
        if run is not newest:
            theirs = {_group_key(r) for r in newest["gating"]}
            mine = {_group_key(r) for r in run["gating"]}
            only_here = sorted(mine - theirs)
            only_newest = sorted(theirs - mine)
            out.append("")
            out.append(f"Only on {run['vllm']}: " + ("; ".join(" ".join(k) for k in only_here) or "nothing") + ".")
            out.append(f"Only on {newest['vllm']}: " + ("; ".join(" ".join(k) for k in only_newest) or "nothing")
                       + ".")
    out += ["", END]
    return "\n".join(out)


def write_doc(path: Path, generated: str) -> None:
    """Replace the part between the markers (appended at the end when the page has none yet)."""
    text = path.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + generated + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + generated + "\n"
    path.write_text(text)


def _machine() -> str:
    import platform as pyplatform

    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), pyplatform.machine()) if Path("/proc/cpuinfo").exists() else "?"
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{os.cpu_count()} cores, {model}, {isa}{' and AMX' if 'amx_tile' in flags else ''}, {time.strftime('%Y-%m-%d')}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", action="append", default=[], metavar="RELEASE=PATH",
                        help="a release's environment: its label and its Python (repeat, oldest first)")
    parser.add_argument("--from-json", type=Path, metavar="RUNS.json",
                        help="write the page from an earlier --json instead of running")
    parser.add_argument("--machine", help="the machine the runs were on, for the page (default: this one)")
    parser.add_argument("--level", default="standard")
    parser.add_argument("-n", dest="workers", type=int, default=2)
    parser.add_argument("--doc", type=Path, help="the page whose generated part is replaced (docs/vllm.md)")
    parser.add_argument("--json", type=Path, help="also write every run's summary here")
    args = parser.parse_args(argv)
    if bool(args.python) == bool(args.from_json):
        parser.error("give either --python RELEASE=PATH (one or more) or --from-json RUNS.json")
    runs = json.loads(args.from_json.read_text()) if args.from_json else []
    for spec in args.python:
        label, sep, python = spec.partition("=")
        if not sep or not Path(python).exists():
            parser.error(f"--python {spec!r}: expected RELEASE=PATH to an existing Python")
        print(f"vLLM {label}: running the {args.level} level with {python} ...", file=sys.stderr, flush=True)
        run = run_one(python, args.level, args.workers)
        if not (run["vllm"] or "").startswith(label):
            parser.error(f"--python {spec!r}: that environment runs vLLM {run['vllm']}, not {label}")
        print(f"vLLM {run['vllm']}: {run['wall_s']} s, {run['verdict']}, {run['counts']}", file=sys.stderr)
        runs.append(run)
    generated = render(runs, args.level, args.workers, args.machine or _machine())
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")
    if args.doc:
        write_doc(args.doc, generated)
    else:
        print(generated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
