"""Headless Debian chromium for the report tests: find or install it, load a page, read console messages.

Chromium is launched with a fresh profile and every background service off (no network is
reachable here, and without these flags it keeps retrying). Console messages arrive on stderr
(`--enable-logging=stderr --v=0`) as lines holding `:CONSOLE`; the report page has no script, so
any such line (a script error, a blocked inline script, a failed load) is a fault of the page.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--enable-logging=stderr", "--v=0"]
NAMES = ("chromium", "chromium-browser")


def find() -> str | None:
    return next((p for p in map(shutil.which, NAMES) if p), None)


def ensure_chromium() -> str:
    """The chromium executable; installs Debian's package when missing and possible, else skips saying why."""
    found = find()
    if found:
        return found
    if shutil.which("apt-get") is None:
        pytest.skip("chromium is not installed and there is no apt-get to install it")
    if os.geteuid() != 0:
        pytest.skip("chromium is not installed and installing it needs root (apt-get install chromium)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]):
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            pytest.skip(f"`{' '.join(cmd)}` did not finish within 900 s")
        if proc.returncode != 0:
            tail = " ".join(proc.stderr.strip().splitlines()[-1:]) or f"exit status {proc.returncode}"
            pytest.skip(f"cannot install chromium: `{' '.join(cmd)}` failed: {tail}")
    found = find()
    if not found:
        pytest.skip("apt-get installed chromium, yet no chromium executable is on PATH")
    return found


def load(exe: str, page: Path, profile: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run chromium on `page` (a local file) with a new empty profile directory; extra args say what to do."""
    profile.mkdir(parents=True, exist_ok=False)
    cmd = [exe, *FLAGS, f"--user-data-dir={profile}", *args, page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def console_messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def png_rgb(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes) of an 8-bit RGB or RGBA, non-interlaced PNG (a chromium screenshot),
    decoded here so the layout tests need no imaging library."""
    import struct
    import zlib

    data = path.read_bytes()
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    width, height, depth, color, _, _, interlace = header
    if depth != 8 or color not in (2, 6) or interlace:
        raise ValueError(f"{path}: PNG of bit depth {depth}, colour type {color}, interlace {interlace} not decoded")
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, corner = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(bytes(line) if bpp == 3 else bytes(b for j, b in enumerate(line) if j % 4 != 3))
        prev = line
    return width, height, rows
