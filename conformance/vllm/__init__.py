"""The vLLM bridge: the platform vLLM resolves, as the harness's plugin model.

`pytest --platform=vllm` grades what vLLM itself would run here: vLLM resolves its platform (its
built-in one for the machine, or the one out-of-tree vLLM platform plugin, honouring
`VLLM_PLUGINS`), and the bridge translates it into a reference `Platform` whose IR providers are
vLLM's IR implementations and whose CustomOp replacements run vLLM's layers. Every check family,
outcome, report, waiver, baseline, shard and repro then works unchanged. vLLM is imported only here,
only on demand. Modules: discover (find and check vLLM and its plugins), worker_setup (vLLM config
and IR priorities), ir_bridge, layer_bridge, coverage (what is not graded, by name), platform.
"""

from __future__ import annotations

NAME = "vllm"   # the --platform name that asks for the bridge
