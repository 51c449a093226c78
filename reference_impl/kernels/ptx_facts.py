"""What the compiled GPU kernels do, read without a GPU: per kernel and architecture, its 16-byte
global loads and stores (in the PTX), its packed code stores, instructions per byte moved, and for
the CUDA kernels registers, stack and spills (ptxas's resource report).

The GPU speed targets rest on properties the compiler output shows before any GPU runs: 16-byte
vector memory operations (a warp moves 512 contiguous bytes per instruction), no spills to local
memory, the hardware fp8 conversion on sm_90, and arithmetic under the memory's pace.
`tests/kernels/test_cuda_build.py` asserts them on the objects `_build_cuda.compile_check(keep=True)`
leaves (`python -m reference_impl.kernels._build_cuda --facts` prints them);
`tests/kernels/test_kernels_triton.py` on the Triton kernels' sm_90 PTX.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

_ENTRY = re.compile(r"^\.(?:visible\s+)?\.?entry\s+(\S+?)\(", re.M)
# A global load or store instruction: `ld.global[.qualifiers][.v2|.v4].<type><bits>`, where the
# qualifiers (.nc, cache and eviction hints) vary by compiler.
_GLOBAL_ACCESS = re.compile(r"\b(ld|st)\.global((?:\.[\w:]+)+)")
_TYPE_BITS = re.compile(r"^[bufs](8|16|32|64)$")
_FP8_CVT = re.compile(r"\bcvt\.rn\.satfinite\.e4m3x2\.f32\b")
_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)' for 'sm_(\d+)'")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


@dataclasses.dataclass(frozen=True)
class KernelFacts:
    """One kernel entry compiled for one architecture."""

    source: str             # the .cu file
    arch: str               # "80", "90"
    mangled: str
    name: str               # demangled where c++filt exists
    loads_16b: int          # 16-byte global load instructions in its PTX
    stores_16b: int         # 16-byte global stores
    packed_stores: int      # 4- and 8-byte global stores (packed fp8 codes)
    fp8_hw_converts: int    # cvt.rn.satfinite.e4m3x2.f32 (two codes per instruction, sm_89+)
    registers: int
    stack_bytes: int
    spill_bytes: int        # spill stores + spill loads


def global_accesses(ptx: str) -> list[tuple[str, int]]:
    """("ld" or "st", bytes per thread) of every global load and store instruction in `ptx`."""
    found = []
    for kind, suffix in _GLOBAL_ACCESS.findall(ptx):
        parts = suffix.split(".")[1:]
        bits = _TYPE_BITS.match(parts[-1])
        if bits is None:
            continue
        lanes = int(parts[-2][1:]) if len(parts) > 1 and parts[-2] in ("v2", "v4", "v8") else 1
        found.append((kind, lanes * int(bits.group(1)) // 8))
    return found


def instructions_per_byte(ptx: str) -> float:
    """PTX instructions per byte of global memory a thread moves: a proxy for whether a kernel is
    memory-bound. An H100 issues about 29.6e12 thread-instructions/s against 3.35e12 bytes/s of
    HBM, so a kernel above ~8.8 runs out of issue slots before bandwidth (PTX counts an expanding
    instruction such as div.rn.f32 once, so the proxy flatters kernels that use them)."""
    body = ptx[ptx.index("{"):] if "{" in ptx else ptx
    count = sum(1 for line in body.splitlines()
                if line.strip().endswith(";") and not line.strip().startswith((".reg", ".shared", ".loc", "//")))
    moved = sum(nbytes for _, nbytes in global_accesses(ptx))
    return count / moved if moved else float("inf")


def memory_ops(ptx: str) -> dict[str, int]:
    """Counts in a kernel's PTX: 16-byte global loads and stores, 4- and 8-byte global stores
    (packed fp8 codes), and hardware fp8 conversions."""
    accesses = global_accesses(ptx)
    return {"loads_16b": accesses.count(("ld", 16)), "stores_16b": accesses.count(("st", 16)),
            "packed_stores": accesses.count(("st", 4)) + accesses.count(("st", 8)),
            "fp8_hw_converts": len(_FP8_CVT.findall(ptx))}


def _demangle(names: list[str]) -> dict[str, str]:
    """Mangled -> readable C++ names (anonymous namespaces dropped); identity without c++filt."""
    if not names or shutil.which("c++filt") is None:
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    tidy = [re.sub(r"\w+::\(anonymous namespace\)::", "", n) for n in out]
    return dict(zip(names, tidy)) if len(tidy) == len(names) else {n: n for n in names}


def _ptx_entries(ptx: str) -> dict[str, str]:
    """Kernel entry name -> its PTX body (up to the next entry)."""
    matches = list(_ENTRY.finditer(ptx))
    return {m.group(1): ptx[m.end():matches[i + 1].start() if i + 1 < len(matches) else len(ptx)]
            for i, m in enumerate(matches)}


def _ptxas_resources(log: str) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(mangled, arch) -> (registers, stack bytes, spill bytes) from `ptxas -v` output."""
    found: dict[tuple[str, str], tuple[int, int, int]] = {}
    current: tuple[str, str] | None = None
    frame = (0, 0)
    for line in log.splitlines():
        if (m := _PTXAS_ENTRY.search(line)):
            current, frame = (m.group(1), m.group(2)), (0, 0)
        elif current and (m := _PTXAS_FRAME.search(line)):
            frame = (int(m.group(1)), int(m.group(2)) + int(m.group(3)))
        elif current and (m := _PTXAS_REGS.search(line)):
            found[current] = (int(m.group(1)), *frame)
            current = None
    return found


def kernel_facts(out_dir: Path) -> list[KernelFacts]:
    """Facts of every kernel that `compile_check(out_dir, keep=True)` compiled, per arch."""
    facts = []
    for log_path in sorted(out_dir.glob("*.ptxas.log")):
        stem = log_path.name[: -len(".ptxas.log")]
        resources = _ptxas_resources(log_path.read_text())
        for ptx_path in sorted((out_dir / f"{stem}.keep").glob(f"{stem}.compute_*.ptx")):
            arch = ptx_path.suffixes[-2].removeprefix(".compute_")
            entries = _ptx_entries(ptx_path.read_text())
            names = _demangle(list(entries))
            for mangled, body in entries.items():
                registers, stack, spills = resources.get((mangled, arch), (-1, -1, -1))
                facts.append(KernelFacts(source=f"{stem}.cu", arch=arch, mangled=mangled, name=names[mangled],
                                         **memory_ops(body), registers=registers, stack_bytes=stack,
                                         spill_bytes=spills))
    return facts


def facts_table(facts: list[KernelFacts]) -> str:
    """One line per kernel and arch."""
    header = f"{'source':14} {'sm':>3} {'ld16':>5} {'st16':>5} {'st4/8':>6} {'regs':>5} {'spill':>6}  kernel"
    lines = [header] + [f"{f.source:14} {f.arch:>3} {f.loads_16b:5d} {f.stores_16b:5d} {f.packed_stores:6d} "
                        f"{f.registers:5d} {f.spill_bytes:6d}  {f.name.split('(')[0]}" for f in facts]
    return "\n".join(lines)
