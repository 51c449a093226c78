"""conformance/run/shm_files.py: what killed rank groups and engines leave in /dev/shm is removed, and nothing a live
process uses, nothing of another program's and nothing older than the run's multiprocessing files is touched.
Every case runs in a directory of its own standing in for /dev/shm."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from conformance import shm_files
from process_tree import dead_pid


def _file(d, name, size=4096):
    p = d / name
    p.write_bytes(b"\0" * size)
    return p


@pytest.fixture
def holder():
    """Start a process that maps a file (as vLLM's ranks map their group's files) and keeps it mapped."""
    procs = []

    def hold(path):
        code = ("import mmap, sys, time; f = open(sys.argv[1], 'r+b'); m = mmap.mmap(f.fileno(), 0); f.close(); "
                "print('mapped', flush=True); time.sleep(120)")
        proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "mapped"
        procs.append(proc)
        return proc

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_groups_files_go_by_its_identifier_unless_a_live_process_maps_one(tmp_path, holder):
    ident = shm_files.new_ident()
    assert ident.startswith(f"conformance-{os.getpid()}-")
    mine = [_file(tmp_path, f"{ident}-tp:0-[0-1]-cpushm_{r}") for r in (0, 1)]
    again = _file(tmp_path, f"{ident}-g2-tp:0-[0-1]-cpushm_0")     # the group's next communicator
    mapped = _file(tmp_path, f"{ident}-dp:0-[0-1]-cpushm_0")
    other = _file(tmp_path, f"{shm_files.new_ident()}-tp:0-[0-1]-cpushm_0")
    holder(mapped)
    removed = shm_files.remove_ident(ident, tmp_path)
    assert sorted(removed) == sorted(p.name for p in mine + [again])
    assert mapped.exists() and other.exists()
    assert shm_files.remove_ident("vllm_dist_abc", tmp_path) == []     # an identifier the harness did not make


def test_orphans_are_the_files_of_a_group_runner_that_is_gone(tmp_path):
    dead = _file(tmp_path, f"conformance-{dead_pid()}-0123abcd-tp:0-[0-1]-cpushm_0")
    live = _file(tmp_path, f"conformance-{os.getpid()}-0123abcd-tp:0-[0-1]-cpushm_0")
    lookalike = _file(tmp_path, "conformance-report.html")
    # the reference communicator's file and named pipes, of a rank killed before it removed them
    comm_file = _file(tmp_path, f"reference-comm-{dead_pid()}-89abcdef")
    comm_pipe = tmp_path / f"{comm_file.name}-0to1"
    os.mkfifo(comm_pipe)
    comm_live = _file(tmp_path, f"reference-comm-{os.getpid()}-89abcdef")
    assert sorted(shm_files.remove_orphans(tmp_path)) == sorted([dead.name, comm_file.name, comm_pipe.name])
    assert live.exists() and lookalike.exists() and comm_live.exists()


def test_vllms_unused_files_go_and_multiprocessings_only_when_made_during_the_run(tmp_path, holder):
    started = time.time()
    group_file = _file(tmp_path, "vllm_dist_0f3c-tp:0-[0-1]-cpushm_0")
    in_use = _file(tmp_path, "vllm_dist_77aa-tp:0-[0-1]-cpushm_1")
    new_segment = _file(tmp_path, "psm_1a2b3c4d")
    semaphore = _file(tmp_path, "sem.mp-abcd1234", 32)
    old_segment = _file(tmp_path, "psm_99999999")
    os.utime(old_segment, (started - 3600, started - 3600))
    unrelated = _file(tmp_path, "pulse-shm-12345")
    holder(in_use)
    assert shm_files.remove_unused(None, tmp_path) == [group_file.name]   # at a run's start: group files only
    assert new_segment.exists()
    removed = shm_files.remove_unused(started, tmp_path)                   # at its end: this run's segments too
    assert removed == [new_segment.name]
    # a semaphore is never removed: glibc maps it under another name, so one in use looks unused
    assert in_use.exists() and old_segment.exists() and unrelated.exists() and semaphore.exists()


def test_a_missing_directory_is_nothing_to_remove(tmp_path):
    gone = tmp_path / "no-shm"
    assert shm_files.remove_orphans(gone) == [] and shm_files.remove_unused(0.0, gone) == []
    assert shm_files.remove_ident(shm_files.new_ident(), gone) == []
