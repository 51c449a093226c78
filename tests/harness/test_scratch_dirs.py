"""conformance/scratch_dirs.py: the harness's directories are named for their process, live inside the run's directory
in a kernel worker, and a killed process's are removed by the next run, never a live process's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from conformance.results import running_note
from conformance import scratch_dirs
from process_tree import dead_pid


@pytest.fixture
def tmpdir_is(tmp_path, monkeypatch):
    """The temporary directory is tmp_path/tmp (tempfile caches it: reset), and this is no kernel worker."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.delenv(running_note.NOTE_ENV, raising=False)
    return tmp


def test_a_directory_is_named_for_its_process_and_goes_after_the_block(tmpdir_is):
    with scratch_dirs.directory("engine-tp") as path:
        assert os.path.dirname(path) == str(tmpdir_is)
        ns = os.stat("/proc/self/ns/pid").st_ino
        assert os.path.basename(path).startswith(f"conformance-engine-tp-{os.getpid()}-{ns}-") and os.path.isdir(path)
        assert len(os.path.basename(path)) == scratch_dirs.name_length("engine-tp")
    assert not os.path.exists(path)


def test_in_a_kernel_worker_it_is_inside_the_run_directory(tmpdir_is, tmp_path, monkeypatch):
    run = tmp_path / "conformance-run-1-abcdefgh"
    run.mkdir()
    monkeypatch.setenv(running_note.NOTE_ENV, str(run / "conformance-worker-x.running.json"))
    path = scratch_dirs.new_directory("vllm-model")
    assert os.path.dirname(path) == str(run)
    assert not list(tmpdir_is.iterdir())


def test_a_kind_that_would_not_parse_back_is_refused(tmpdir_is):
    for kind in ("Run", "run-2", "", "run_dir"):
        with pytest.raises(ValueError, match=f"scratch directory kind {kind!r}"):
            scratch_dirs.new_directory(kind)


def test_orphans_are_the_directories_of_gone_processes_only(tmpdir_is):
    dead, ns = dead_pid(), os.stat("/proc/self/ns/pid").st_ino
    gone = [tmpdir_is / f"conformance-run-{dead}-{ns}-abcd_123",
            tmpdir_is / f"conformance-engine-process-{dead}-{ns}-x1y2z3w4"]
    for d in gone:
        (d / "inside").mkdir(parents=True)
    live = tmpdir_is / f"conformance-run-{os.getpid()}-{ns}-abcd1234"     # this process: alive
    legacy = tmpdir_is / f"conformance-run-{dead}-abcd1234"               # no namespace: not ours to judge
    elsewhere = tmpdir_is / f"conformance-run-{dead}-{ns + 1}-abcd1234"   # another pid namespace's process
    other = tmpdir_is / f"someone-run-{dead}-{ns}-abcd1234"
    for d in (live, legacy, elsewhere, other):
        d.mkdir()
    a_file = tmpdir_is / f"conformance-run-{dead}-{ns}-efgh5678"          # not a directory
    a_file.write_text("")
    assert scratch_dirs.remove_orphans() == sorted(d.name for d in gone)
    assert not any(d.exists() for d in gone)
    assert live.exists() and legacy.exists() and elsewhere.exists() and other.exists() and a_file.exists()
    assert scratch_dirs.remove_orphans() == []


def test_a_directory_kept_for_the_process_goes_when_it_exits(tmp_path):
    code = ("import sys, tempfile; tempfile.tempdir = sys.argv[1]; from conformance import scratch_dirs; "
            "print(scratch_dirs.new_directory('vllm-model', remove_at_exit=True))")
    env = {k: v for k, v in os.environ.items() if k != running_note.NOTE_ENV}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                         check=True)
    path = out.stdout.strip()
    assert os.path.dirname(path) == str(tmp_path) and not os.path.exists(path)


def test_vllms_sockets_go_to_a_scratch_directory_of_the_engine_process(tmpdir_is, monkeypatch):
    """vLLM leaves a tensor-parallel engine's ZMQ sockets in the temporary directory even after a clean shutdown (8 an
    engine, seen with 0.32): the engine runner points VLLM_RPC_BASE_PATH at a directory of its own, unless the user
    set it or the directory's path would leave no room for vLLM's socket names (AF_UNIX: 107 bytes)."""
    from conformance.vllm import engine_runner

    short = tempfile.mkdtemp(prefix="cs", dir="/tmp")    # pytest's tmp_path is too long a base for a socket
    monkeypatch.setattr(tempfile, "tempdir", short)
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    try:
        engine_runner._contain_vllms_sockets()
        base = os.environ["VLLM_RPC_BASE_PATH"]
        assert os.path.dirname(base) == short and os.path.isdir(base)
    finally:
        shutil.rmtree(short)
    assert os.path.basename(base).startswith(f"conformance-vllm-rpc-{os.getpid()}-")
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", "/theirs")
    engine_runner._contain_vllms_sockets()
    assert os.environ["VLLM_RPC_BASE_PATH"] == "/theirs"
    deep = tmpdir_is / ("d" * 60)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    monkeypatch.delenv("VLLM_RPC_BASE_PATH")
    engine_runner._contain_vllms_sockets()
    assert "VLLM_RPC_BASE_PATH" not in os.environ and not list(deep.iterdir())
