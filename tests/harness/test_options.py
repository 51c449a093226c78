"""Option values the harness cannot use are the caller's mistake: exit 4 and one line naming the option and the
allowed values, before any check runs (never a TIMEOUT or a failure blamed on the platform)."""

from __future__ import annotations

import pytest

from conformance.exit_codes import ExitCode
from conformance.run import options
from harness_runner import run_harness


@pytest.mark.parametrize("text", ["-1", "0", "0.0", "nan", "inf", "1e9", "abc", ""])
def test_a_timeout_outside_its_range_is_refused_naming_the_range(text):
    with pytest.raises(options.OptionError) as info:
        options.timeout(text)
    message = str(info.value)
    assert message.startswith(f"--conformance-timeout={text}: ")
    assert f"greater than 0 and at most {options.MAX_TIMEOUT_S:g}" in message and "\n" not in message


def test_usable_values_pass_through():
    assert options.timeout("0.5") == 0.5 and options.timeout(120.0) == 120.0
    assert options.timeout(str(options.MAX_TIMEOUT_S)) == options.MAX_TIMEOUT_S
    assert options.seed("1234") == 1234 and options.seed(-3) == -3 and options.seed(" 7 ") == 7
    assert options.level("quick") == "quick"
    assert options.input_file("--conformance-waivers", None) is None
    assert options.output_file("--conformance-json", "out/results.json") == "out/results.json"


@pytest.mark.parametrize("call, fragment", [
    (lambda: options.seed("12a"), "--conformance-seed=12a: not an integer"),
    (lambda: options.seed("1.5"), "--conformance-seed=1.5: not an integer"),
    (lambda: options.level("fast"), "--conformance-level=fast: unknown level; give one of quick, standard, full"),
    (lambda: options.input_file("--conformance-waivers", ""), "--conformance-waivers= is empty"),
    (lambda: options.input_file("--conformance-baseline", " "), "--conformance-baseline= is empty"),
    (lambda: options.output_file("--conformance-json", ""), "--conformance-json= is empty"),
])
def test_other_options_name_what_is_allowed(call, fragment):
    with pytest.raises(options.OptionError) as info:
        call()
    assert str(info.value).startswith(fragment) and "\n" not in str(info.value)


def test_directories_are_refused_where_a_file_is_meant(tmp_path):
    with pytest.raises(options.OptionError, match="is a directory, not a file"):
        options.input_file("--conformance-baseline", str(tmp_path))
    with pytest.raises(options.OptionError, match="is a directory; give the path of a file"):
        options.output_file("--conformance-json", str(tmp_path))


@pytest.mark.parametrize("args, fragment", [
    (["--conformance-timeout=0"], "--conformance-timeout=0: out of range"),
    (["--conformance-timeout=-1", "--conformance-seed=x"], "--conformance-seed=x: not an integer"),
    (["--conformance-waivers="], "--conformance-waivers= is empty"),
])
def test_the_run_stops_before_any_check_with_one_line(tmp_path, args, fragment):
    run = run_harness(tmp_path, "cpu", *args, "-k", "rms_norm and float32 and ir_case")
    assert run.returncode == ExitCode.USAGE_ERROR, run.output[-2000:]
    (line,) = [ln for ln in run.output.splitlines() if ln.strip()]
    assert line.startswith("ERROR: ") and fragment in line
    assert run.doc is None   # nothing was judged, so no results file either


def test_a_results_file_path_that_cannot_be_written_stops_the_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    run = run_harness(tmp_path, "cpu", f"--conformance-json={blocker}/results.json", "-k", "rms_norm")
    assert run.returncode == ExitCode.USAGE_ERROR, run.output[-2000:]
    (line,) = [ln for ln in run.output.splitlines() if ln.strip()]
    assert line.startswith(f"ERROR: --conformance-json={blocker}/results.json: cannot write it")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]   # no stray temporary file either
