"""Runtime config: custom_ops lists, defaults by mode/backend, IR priorities, CLI-style parsing."""

from __future__ import annotations

import pytest

from reference_impl.config import (
    CompilationConfig,
    CompilationMode,
    ConfigError,
    KernelConfig,
    RuntimeConfig,
    get_current_config,
    parse_cli_args,
    set_current_config,
)


@pytest.mark.parametrize("entries, expected", [
    (["all,-rms_norm"], ["all", "-rms_norm"]),
    (["none", "+rms_norm", "+silu_and_mul"], ["none", "+rms_norm", "+silu_and_mul"]),
    ("none, +rms_norm", ["none", "+rms_norm"]),
    ([], []),
])
def test_custom_ops_normalization(entries, expected):
    assert CompilationConfig(custom_ops=entries).custom_ops == expected


@pytest.mark.parametrize("entries, message", [
    (["all,none"], "both 'all' and 'none'"),
    (["all", "none"], "both 'all' and 'none'"),
    (["+rms_norm", "-rms_norm"], "both enables and disables rms_norm"),
    (["rms_norm"], "invalid custom_ops entry 'rms_norm'"),
    (["+"], "invalid custom_ops entry"),
    ([3], "must be strings"),
])
def test_custom_ops_invalid(entries, message):
    with pytest.raises(ConfigError, match=message):
        CompilationConfig(custom_ops=entries)


@pytest.mark.parametrize("mode, backend, default", [
    (CompilationMode.NONE, "inductor", "all"),
    (CompilationMode.REFERENCE_COMPILE, "inductor", "none"),
    (CompilationMode.STOCK_TORCH_COMPILE, "inductor", "none"),
    (CompilationMode.REFERENCE_COMPILE, "eager", "all"),
])
def test_custom_ops_default_follows_mode_and_backend(mode, backend, default):
    cfg = CompilationConfig(mode=mode, backend=backend, custom_ops=["+rms_norm"])
    assert cfg.resolved_custom_ops() == ["+rms_norm", default]
    assert cfg.custom_op_enabled("rms_norm", cfg.all_enabled_by_default())
    assert cfg.custom_op_enabled("silu_and_mul", cfg.all_enabled_by_default()) == (default == "all")


def test_explicit_all_or_none_is_kept():
    cfg = CompilationConfig(mode=CompilationMode.REFERENCE_COMPILE, custom_ops=["all", "-rms_norm"])
    assert cfg.resolved_custom_ops() == ["all", "-rms_norm"]
    assert not cfg.custom_op_enabled("rms_norm", cfg.all_enabled_by_default())
    assert cfg.custom_op_enabled("silu_and_mul", cfg.all_enabled_by_default())


def test_kernel_config_priorities():
    kc = KernelConfig({"rms_norm": "cpp, native", "silu_and_mul": ["triton"]})
    assert kc.ir_op_priority == {"rms_norm": ["cpp", "native"], "silu_and_mul": ["triton"]}
    with pytest.raises(ConfigError, match="empty"):
        KernelConfig({"rms_norm": []})
    with pytest.raises(ConfigError, match="cpp more than once"):
        KernelConfig({"rms_norm": ["cpp", "cpp"]})


def test_cli_parsing():
    cfg = parse_cli_args([
        "--compilation-config.custom_ops", '["none,+rms_norm"]',
        "--ir-op-priority.rms_norm=cpp,native",
        "--ir_op_priority.fused_add_rms_norm", "cpp",
        "--compilation-config.mode=REFERENCE_COMPILE",
    ])
    assert cfg.compilation_config.custom_ops == ["none", "+rms_norm"]
    assert cfg.compilation_config.mode == CompilationMode.REFERENCE_COMPILE
    assert cfg.kernel_config.ir_op_priority == {"rms_norm": ["cpp", "native"], "fused_add_rms_norm": ["cpp"]}
    whole = RuntimeConfig.from_cli_args(["--compilation-config", '{"mode": 3, "backend": "eager"}'])
    assert whole.compilation_config.mode == CompilationMode.REFERENCE_COMPILE
    assert whole.compilation_config.backend == "eager"


@pytest.mark.parametrize("argv, message", [
    (["--compilation-config.custom_ops", '["all,none"]'], "both 'all' and 'none'"),
    (["--compilation-config.custom_ops", "[oops"], "not a JSON list"),
    (["--compilation-config.bogus=1"], "unknown compilation-config field"),
    (["--ir-op-priority=cpp"], "needs an op name"),
    (["--what=1"], "unknown option"),
    (["--ir-op-priority.rms_norm"], "needs a value"),
    (["stray"], "unexpected argument"),
    (["--compilation-config", '{"nope": 1}'], "unknown compilation-config fields"),
])
def test_cli_errors(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_cli_args(argv)


def test_set_current_config_restores_and_consults_platform(monkeypatch):
    from reference_impl.platforms import get_current_platform

    seen = []
    platform_cls = type(get_current_platform())
    monkeypatch.setattr(platform_cls, "check_and_update_config", classmethod(lambda cls, c: seen.append(c)))
    before = get_current_config()
    cfg = RuntimeConfig(CompilationConfig(custom_ops=["none"]))
    with set_current_config(cfg):
        assert get_current_config() is cfg
    assert seen == [cfg]
    assert get_current_config() is before
