"""Inductor's FX graph and AOTAutograd caches with our post-grad passes (reference_impl/compilation/cache_key.py).

The uuid our post-grad pass gives inductor moves with everything the passes' output depends on,
so a changed priority, registration, pipeline or donation compiles afresh; a second process
compiling the same program is served from the cache; the cache stays out of the working directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import Tensor

from reference_impl import ir
from reference_impl.compilation.cache_key import pipeline_uuid

ROOT = Path(__file__).resolve().parents[2]


def test_the_uuid_moves_with_priorities_registrations_pipeline_and_donations():
    def scale_for_cache(x: Tensor, factor: float = 2.0) -> Tensor:
        return x * factor

    op = ir.register_op(name="t_cache_key_scale")(scale_for_cache)
    pipeline = ["inductor", "rms_norm_quant_fusion", "ir_lowering", "clone_elimination"]
    base = pipeline_uuid(pipeline)
    assert pipeline_uuid(pipeline) == base                                  # deterministic
    assert pipeline_uuid(pipeline, (2, 0, [(0, "f32")])) != base            # what the pre-grad pass found
    assert pipeline_uuid(pipeline[:1] + pipeline[2:]) != base               # fusion left out
    impl = op.register_impl("fast")(lambda x, factor=2.0: x * factor)
    registered = pipeline_uuid(pipeline)
    assert registered != base
    with op.set_priority(["fast"]):
        assert pipeline_uuid(pipeline) != registered                        # the lowering would pick "fast"
    op.impls["fast"].supported = False
    assert pipeline_uuid(pipeline) != registered
    op.impls["fast"].supported = True
    op.impls["fast"].impl_fn = torch.mul                                    # other code
    assert pipeline_uuid(pipeline) != registered
    op.impls["fast"].impl_fn = impl
    assert pipeline_uuid(pipeline) == registered
    op.remove_impl("fast")
    assert pipeline_uuid(pipeline) == base


_CHILD = textwrap.dedent("""
    import json, sys, torch
    from torch._dynamo.utils import counters
    from reference_impl import ir
    from reference_impl.compilation import ReferenceCompileBackend

    def f(x, w):
        return ir.ops.rms_norm(x, w, 1e-6) * 2

    def compile_and_run():
        torch._dynamo.reset()
        counters.clear()
        backend = ReferenceCompileBackend(inner="inductor")
        x, w = torch.randn(8, 64), torch.randn(64)
        with torch.no_grad():
            out = torch.compile(f, backend=backend, fullgraph=True)(x, w)
            torch.testing.assert_close(out, f(x, w))
        return {"hits": counters["inductor"]["fxgraph_cache_hit"], "misses": counters["inductor"]["fxgraph_cache_miss"],
                "autograd_hits": counters["aot_autograd"]["autograd_cache_hit"],
                "cached": backend.pass_context.post_grad_cached, "selected": backend.selected_impls}

    runs = [compile_and_run()]
    if sys.argv[1] == "then-native":
        with ir.ops.rms_norm.set_priority(["native"]):
            runs.append(compile_and_run())
    print(json.dumps(runs))
""")


def _compile_in_a_fresh_process(tmp_path: Path, mode: str) -> list[dict]:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", _CHILD, mode], cwd=work, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(work.iterdir()) == [], "the compile wrote into the working directory"
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(sys.platform != "linux", reason="inductor's C++ backend: Linux here")
def test_a_fresh_process_is_served_from_the_cache_and_a_changed_priority_misses(tmp_path):
    """A subprocess per run: being a fresh process is the point (the first call there finds the
    compiled graph in the cache and runs it before any kernel call loaded our kernel library)."""
    (first,) = _compile_in_a_fresh_process(tmp_path, "once")
    assert first["misses"] >= 1 and first["hits"] == 0 and not first["cached"]
    assert set(first["selected"]) == {"rms_norm"}                 # our passes ran and lowered the op
    second, native = _compile_in_a_fresh_process(tmp_path, "then-native")
    assert second["hits"] >= 1 and second["misses"] == 0 and second["autograd_hits"] >= 1
    assert second["cached"] and second["selected"] == {}          # our passes did not run: nothing to say
    assert native["misses"] >= 1 and native["hits"] == 0 and not native["cached"]
    assert native["selected"] == {"rms_norm": {"rms_norm": "native"}}
