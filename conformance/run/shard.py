"""`--conformance-shard=I/N`: a deterministic split of the result-producing items, balanced by expected cost.

Every process that collects (a plain run, each xdist worker) computes the same plan from the same
collected items, so a shard combines with `-n`: xdist sees identical collections on all workers.
The plan is greedy longest-first: items sorted by (expected cost, nodeid) descending go one by one
to the shard with the least cost so far (ties to the lower index), which keeps shards within about
one heavy item of each other. Costs are relative, measured per check on the cpu platform.

Under `-n`, `longest_first` orders every worker's collection by the same costs, and the controller hands
items out a few at a time (`SCHED_CHUNK`): the heavy checks start first and spread over the workers, and the
run ends on cheap items instead of one worker finishing a long tail while the others wait.
"""

from __future__ import annotations

import dataclasses
import heapq
import re
from collections.abc import Sequence

import pytest

# Seconds per item, rounded from the `duration_s` of a cpu platform standard run on 2 cores (the check's
# own time), plus about 0.005 s of pytest and worker round trip that every item pays. The fake-tensor
# probes of supports_args (every case x dtype) and the model dominate, compile comes next; numerics
# cases are cheap. layer_compile (no cpu units) is rated like a model check. Unknown checks count
# as a plain case.
ITEM_OVERHEAD_S = 0.005
CHECK_COST_S = {
    "dispatch.supports_args": 1.0,
    "model.decoder": 1.0,
    "compile.layer_compile": 1.0,
    "compile.ir_compile": 0.3,
    "numerics.ir_property": 0.12,
    "dispatch.priority": 0.04,
    "numerics.layer_case": 0.02,
    "aliasing.ir_case": 0.015,
    "numerics.ir_case": 0.005,
    "attention.compile": 1.3,
    "attention.steps": 0.06,
    "attention.forward": 0.03,
    "attention.dispatch": 0.02,
    "attention.cache_write": 0.007,
    "attention.aliasing": 0.005,
    "engine.generate": 60.0,   # vLLM's engine process, an engine per model (--platform=vllm only; docs/vllm.md)
}
DEFAULT_CHECK_COST_S = 0.002
SCHED_CHUNK = 4   # items the xdist controller sends a worker at a time (its --maxschedchunk), see longest_first

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


class ShardSpecError(ValueError):
    """`--conformance-shard` is not I/N with 1 <= I <= N."""


@dataclasses.dataclass(frozen=True)
class Shard:
    index: int   # 1-based
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = _SPEC.match(text or "")
        if not match:
            raise ShardSpecError(f"--conformance-shard must be I/N (e.g. 2/4), got {text!r}")
        index, count = int(match.group(1)), int(match.group(2))
        if count < 1 or not 1 <= index <= count:
            raise ShardSpecError(f"--conformance-shard {text!r}: need 1 <= I <= N")
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def item_cost(family: str | None, check: str | None) -> float:
    """Expected seconds of one item of `family.check` (relative weights are what matter)."""
    return ITEM_OVERHEAD_S + CHECK_COST_S.get(f"{family}.{check}", DEFAULT_CHECK_COST_S)


def plan(items: Sequence[tuple[str, float]], count: int) -> list[int]:
    """For (nodeid, cost) pairs, the 0-based shard of each; depends only on the pairs, not their order."""
    order = sorted(range(len(items)), key=lambda i: (-items[i][1], items[i][0]))
    loads = [(0.0, s) for s in range(count)]   # (cost so far, shard) as a heap
    heapq.heapify(loads)
    assignment = [0] * len(items)
    for i in order:
        load, shard = heapq.heappop(loads)
        assignment[i] = shard
        heapq.heappush(loads, (load + items[i][1], shard))
    return assignment


def _family_check(item: pytest.Item) -> tuple[str | None, str | None]:
    """(family, check) from the item's conformance marker, (None, None) without one."""
    marker = item.get_closest_marker("conformance")
    return tuple(marker.args[:2]) if marker is not None and len(marker.args) >= 2 else (None, None)


def _cost_of(item: pytest.Item) -> float:
    return item_cost(*_family_check(item))


def longest_first(items: list[pytest.Item]) -> None:
    """Order `items` in place by expected cost, heaviest first (ties keep collection order), the model checks
    last: the model runs every default provider, so it must come after their own checks, which find a provider
    that hangs or crashes and poison it (conformance.run.poison) before the model waits on it again."""
    def key(item: pytest.Item) -> tuple[bool, float]:
        family, check = _family_check(item)
        return (family == "model", -item_cost(family, check))

    items.sort(key=key)


class ShardSelector:
    """Plugin object: keeps this shard's items at the end of collection, deselects the others."""

    def __init__(self, shard: Shard):
        self.shard = shard
        self.total_items = 0
        self.kept_cost = 0.0
        self.total_cost = 0.0

    @pytest.hookimpl(trylast=True)   # after -k/-m deselection, so a shard splits what the selection left
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        costs = [(item.nodeid, _cost_of(item)) for item in items]
        assignment = plan(costs, self.shard.count)
        keep, drop = [], []
        for item, (_, cost), shard in zip(items, costs, assignment):
            (keep if shard == self.shard.index - 1 else drop).append(item)
            if shard == self.shard.index - 1:
                self.kept_cost += cost
        self.total_items = len(items)
        self.total_cost = sum(c for _, c in costs)
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep

    def pytest_report_header(self, config: pytest.Config) -> str:
        return f"conformance: shard {self.shard} (items split by expected cost; merge the shards' files with " \
               f"`python -m conformance merge`)"


SHARD_PLUGIN_NAME = "conformance-shard"


def install(config: pytest.Config, text: str | None) -> Shard | None:
    """Register the selector for `--conformance-shard=text` (None: no sharding); UsageError when malformed."""
    if not text:
        return None
    try:
        shard = Shard.parse(text)
    except ShardSpecError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(ShardSelector(shard), SHARD_PLUGIN_NAME)
    return shard
