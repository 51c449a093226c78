"""The CRASH message names the signal the code raised, even when a crash handler then ended the process otherwise."""

from __future__ import annotations

import signal

from conformance.run.crash_report import crash_message, first_fatal_signal

_STACK = """
Current thread 0x00007f7088ea1b80 (most recent call first):
  File "plugin/segfault_shape_kernels.py", line 15 in _crash_on_odd_half
  File "conformance/checks/common.py", line 128 in call_impl

Extension modules: torch._C (total: 1)
"""
NOTE = {"unit": {"family": "numerics", "check": "ir_case", "op": "rotary_embedding", "provider": "broken",
                 "case": "c", "dtype": "bfloat16"}, "call": "provider 'broken' of rotary_embedding", "args": "x=Tensor(4,)"}


def test_the_first_signal_faulthandler_saw_is_the_one_reported():
    """faulthandler wrote SIGSEGV; torch's native-stack printer then failed a heap check and aborted (SIGABRT is the
    exit status): the first line names SIGSEGV, the second says how the process ended."""
    fault = "Fatal Python error: Segmentation fault\n" + _STACK + "Fatal Python error: Aborted\n" + _STACK
    assert first_fatal_signal(fault) == signal.SIGSEGV
    lines = crash_message(-signal.SIGABRT, NOTE, fault, "double free or corruption (out)\n", "the worker").splitlines()
    assert lines[0] == ("the worker died of signal SIGSEGV (11) in provider 'broken' of rotary_embedding called with "
                        "x=Tensor(4,) (numerics.ir_case of op rotary_embedding, provider broken, case c, dtype bfloat16).")
    assert lines[1] == "(It then died of signal SIGABRT (6) while its crash handlers ran; the first signal is the code's.)"
    assert "_crash_on_odd_half" in "\n".join(lines[2:])


def test_one_signal_gives_one_line():
    fault = "Fatal Python error: Segmentation fault\n" + _STACK
    lines = crash_message(-signal.SIGSEGV, NOTE, fault, "", "the worker").splitlines()
    assert lines[0].startswith("the worker died of signal SIGSEGV (11) in provider 'broken'")
    assert lines[1] == "Python stack of the crashed process (most recent call first):"
    assert first_fatal_signal("") is None and first_fatal_signal("Fatal Python error: something else\n") is None


def test_stacks_end_at_the_checks_entry_whichever_process_ran_it():
    """Below `run_unit` lie the harness's own frames (a worker started from scratch, one forked by the zygote, or
    `conformance repro`), and below the last Python frames the process's entry: both are cut, so the message is the
    same whichever process crashed."""
    entry = '  File "/x/conformance/checks/__init__.py", line 42 in run_unit\n'

    def fault(plumbing: str) -> str:
        return ("Fatal Python error: Segmentation fault\n" + _STACK.split("\nExtension")[0] + "\n" + entry + plumbing
                + "\nExtension modules: torch._C (total: 1)\n")

    def native(depth: int) -> str:
        return (f"SIGSEGV(11), PID: 7, Thread 7:\nframe #0: c10::FatalSignalHandler::fatalSignalHandler(int) + 0x1 "
                f"(0x1 in libc10.so)\nframe #1: kernel + 0x2 (0x2 in libkernel.so)\n<omitting python frames>\n"
                f"frame #{depth}: <unknown function> + 0x2724a (0x3 in /lib/libc.so.6)\n"
                f"frame #{depth + 1}: __libc_start_main + 0x85 (0x4 in /lib/libc.so.6)\n"
                f"frame #{depth + 2}: _start + 0x21 (0x5 in python)\n")

    spawned = crash_message(-signal.SIGSEGV, NOTE, fault('  File "/x/conformance/run/worker.py", line 348 in <module>'),
                            native(25), "the worker")
    forked = crash_message(-signal.SIGSEGV, NOTE, fault('  File "/x/conformance/run/zygote.py", line 66 in serve\n'
                                                        '  File "<frozen runpy>", line 88 in _run_code'),
                           native(30), "the worker")
    assert spawned == forked
    assert spawned.splitlines()[-1] == "frame #1: kernel + 0x2 (in libkernel.so)"
    assert "in run_unit" in spawned and "worker.py" not in spawned and "_start" not in spawned
