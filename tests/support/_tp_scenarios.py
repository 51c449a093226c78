"""Scenarios run on every rank of a spawned gloo world (tests/runtime/test_distributed.py starts it once).

Each scenario builds the same full tensors on every rank (seeded), runs the tensor-parallel
layers, and compares with the single-process computation; a raise is the scenario failing.
`run_rank` reports `(rank, scenario, traceback or None)` for every scenario on a queue.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from _rank_world import run_scenarios

WORLD_SIZE = 2


def _full(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _close(a, b, tol=1e-12):
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def collectives(rank):
    from reference_impl import distributed as d

    x = torch.full((2, 3), float(rank + 1))
    kept = x.clone()
    total = d.tensor_model_parallel_all_reduce(x)
    assert torch.equal(total, torch.full((2, 3), 3.0)) and torch.equal(x, kept)   # functional: input untouched
    gathered = d.tensor_model_parallel_all_gather(x, dim=0)
    assert torch.equal(gathered, torch.cat([torch.full((2, 3), 1.0), torch.full((2, 3), 2.0)]))
    assert d.tensor_model_parallel_all_gather(x).shape == (2, 6)
    at_zero = d.tensor_model_parallel_gather(x, dst=0, dim=-1)
    assert (at_zero is None) == (rank == 1)
    assert torch.equal(d.tensor_model_parallel_broadcast(x, src=1), torch.full((2, 3), 2.0))


def column_row_linear(rank):
    from reference_impl.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear

    w1, b1, w2, b2 = _full(16, 12, seed=1), _full(16, seed=2), _full(10, 16, seed=3), _full(10, seed=4)
    x = _full(5, 12, seed=5)
    col = ColumnParallelLinear(12, 16, params_dtype=torch.float64)
    row = RowParallelLinear(16, 10, params_dtype=torch.float64)
    for layer, w, b in ((col, w1, b1), (row, w2, b2)):
        layer.weight_loader(layer.weight, w)
        layer.weight_loader(layer.bias, b)
    assert col.weight.shape == (8, 12) and row.weight.shape == (10, 8) and row.bias.shape == (10,)
    hidden, _ = col(x)
    _close(hidden, (x @ w1.T + b1)[:, rank * 8:(rank + 1) * 8])
    out, bias = row(hidden)
    assert bias is None
    _close(out, (x @ w1.T + b1) @ w2.T + b2)   # the bias is added once, not once per rank

    gathering = ColumnParallelLinear(12, 16, gather_output=True, params_dtype=torch.float64, return_bias=False)
    gathering.weight_loader(gathering.weight, w1)
    gathering.weight_loader(gathering.bias, b1)
    _close(gathering(x), x @ w1.T + b1)

    splitting = RowParallelLinear(16, 10, input_is_parallel=False, skip_bias_add=True, params_dtype=torch.float64)
    splitting.weight_loader(splitting.weight, w2)
    splitting.weight_loader(splitting.bias, b2)
    y = _full(5, 16, seed=6)
    out, bias = splitting(y)
    _close(out, y @ w2.T)
    _close(bias, b2)

    replicated = ReplicatedLinear(12, 16, params_dtype=torch.float64, return_bias=False)
    replicated.weight_loader(replicated.weight, w1)
    replicated.weight_loader(replicated.bias, b1)
    _close(replicated(x), x @ w1.T + b1)


def qkv_projection(rank):
    from reference_impl.layers.linear import QKVParallelLinear

    # 4 query heads, 1 KV head replicated on both ranks, head size 3
    wq, wk, wv = _full(12, 8, seed=7), _full(3, 8, seed=8), _full(3, 8, seed=9)
    qkv = QKVParallelLinear(8, 3, 4, 1, bias=False, params_dtype=torch.float64, return_bias=False)
    assert (qkv.num_heads, qkv.num_kv_heads, qkv.num_kv_head_replicas) == (2, 1, 2)
    qkv.weight_loader(qkv.weight, torch.cat([wq, wk, wv]))    # the fused checkpoint tensor
    x = _full(4, 8, seed=10)
    q, k, v = qkv(x).split([6, 3, 3], dim=-1)
    _close(q, (x @ wq.T)[:, rank * 6:(rank + 1) * 6])
    _close(k, x @ wk.T)
    _close(v, x @ wv.T)


def vocab_parallel(rank):
    from reference_impl.layers.logits_processor import LogitsProcessor
    from reference_impl.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    table = _full(1026, 8, seed=11)
    emb = VocabParallelEmbedding(1026, 8, params_dtype=torch.float64, org_num_embeddings=1010)
    emb.weight_loader(emb.weight, table)
    assert emb.weight.shape == (544, 8)
    ids = torch.tensor([0, 511, 512, 1009, 1010, 1025, 1026, -1, 700])
    expected = F.embedding(ids.clamp(0, 1025), table)
    expected[6:8] = 0   # 1026 and -1 are outside the vocabulary: zeros, as on every rank
    _close(emb(ids), expected)

    head = ParallelLMHead(1026, 8, bias=True, params_dtype=torch.float64, org_num_embeddings=1010)
    bias = _full(1026, seed=12)
    head.weight_loader(head.weight, table)
    head.weight_loader(head.bias, bias)
    h = _full(3, 8, seed=13)
    full = h @ table.T + bias
    logits = LogitsProcessor(1026, 1010, scale=0.5, soft_cap=4.0)(head, h)
    _close(logits, torch.tanh(full[:, :1010] / 4.0) * 4.0 * 0.5)
    everything = LogitsProcessor(1026)(head, h)   # added ids too, in id order despite the sharded layout
    _close(everything, full)


def model_greedy(rank):
    from reference_impl.distributed import single_rank_tensor_parallel
    from reference_impl.models import DecoderConfig, build_model, greedy_generate

    config = DecoderConfig(vocab_size=300, hidden_size=64, num_kv_heads=2)
    prompt = torch.tensor([5, 17, 250, 3, 99])
    with single_rank_tensor_parallel():
        single = build_model(config, torch.float64, seed=3)
    sharded = build_model(config, torch.float64, seed=3)
    assert sharded.model.layers[0].self_attn.num_heads == 2
    assert sharded.model.embed_tokens.weight.shape == (160, 64)
    want = greedy_generate(single, prompt, 3)
    got = greedy_generate(sharded, prompt, 3)
    assert got.tokens == want.tokens, (got.tokens, want.tokens)
    _close(got.step_logits, want.step_logits, 1e-10)
    _close(got.prompt_logits, want.prompt_logits, 1e-10)


class _ParallelMLP(torch.nn.Module):
    """column (sharded) -> row (all-reduce) -> column with gather_output (all-gather)."""

    def __init__(self):
        super().__init__()
        from reference_impl.layers.linear import ColumnParallelLinear, RowParallelLinear

        self.up = ColumnParallelLinear(6, 8, params_dtype=torch.float64, return_bias=False)
        self.down = RowParallelLinear(8, 6, params_dtype=torch.float64, return_bias=False)
        self.out = ColumnParallelLinear(6, 4, gather_output=True, params_dtype=torch.float64, return_bias=False)

    def forward(self, x):
        return self.out(self.down(torch.relu(self.up(x))))


def compiled_collectives(rank):
    from reference_impl.compilation import compile_module
    from reference_impl.config import CompilationConfig, CompilationMode, RuntimeConfig

    mlp = _ParallelMLP()
    for i, layer in enumerate((mlp.up, mlp.down, mlp.out)):
        full_out = layer.output_size
        layer.weight_loader(layer.weight, _full(full_out, layer.input_size, seed=20 + i))
        layer.weight_loader(layer.bias, _full(full_out, seed=30 + i))
    x = _full(5, 6, seed=40)
    eager = mlp(x)
    compiled = compile_module(mlp, RuntimeConfig(CompilationConfig(mode=CompilationMode.REFERENCE_COMPILE,
                                                                   backend="aot_eager")))
    _close(compiled(x), eager)
    _close(compiled(_full(7, 6, seed=41)), mlp(_full(7, 6, seed=41)))   # new batch size, no recompile
    assert compiled.backend.num_compilations == 1
    final = str(list(compiled.backend.graph_snapshots.values())[-1])
    assert "reference_dist.all_reduce" in final and "reference_dist.all_gather" in final, final[:2000]


SCENARIOS = [collectives, column_row_linear, qkv_projection, vocab_parallel, model_greedy, compiled_collectives]


def run_rank(rank: int, init_file: str, queue) -> None:
    run_scenarios(rank, init_file, queue, WORLD_SIZE, SCENARIOS)
