"""One rank of the sharded-audit tests (tests/test_distributed.py starts two of these on localhost).

For each case the rank builds the same seeded model as every other rank, keeps an unsharded
copy, shards the model (FSDP2 or tensor parallelism), audits it with its local batch, and
audits the unsharded copy in-process with the global batch. It prints one JSON line: both
reports' findings, the largest relative difference between their statistics, and the state
of the sharded model afterwards.
"""
from __future__ import annotations

import copy
import datetime
import json
import math
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
from rank_exit import Exit

CASES = ("fsdp_mlp", "tp_mlp", "fsdp_llama")
BATCH = 8


def bad_mlp() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 8))
    with torch.no_grad():
        nn.init.kaiming_normal_(model[0].weight, nonlinearity="relu")
        model[2].weight.fill_(0.05)          # IL008: every unit the same
        nn.init.kaiming_normal_(model[4].weight, nonlinearity="relu")
        model[4].bias.fill_(-3.0)            # IL003: most units dead on every rank's batch
    return model


def small_llama() -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                      attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.mul_(60.0)  # IL011: attention saturates
        model.model.layers[0].self_attn.k_proj.weight.mul_(60.0)
        model.model.layers[1].mlp.up_proj.weight.fill_(0.02)      # IL008
    return model


def inputs(case: str, rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + rank)
    if case == "fsdp_llama":
        return torch.randint(0, 256, (BATCH // 2, 16), generator=gen)
    return torch.randn(BATCH, 32, generator=gen)


def shard(case: str, model: nn.Module, mesh) -> None:
    if case.startswith("fsdp"):
        from torch.distributed.fsdp import fully_shard

        blocks = model.model.layers if case == "fsdp_llama" else [m for m in model if isinstance(m, nn.Linear)]
        for block in blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel(),
                                         "4": ColwiseParallel(), "6": RowwiseParallel()})


SAMPLED = frozenset({"token_cos", "entropy", "maxprob", "onehot_rows", "log_keys"})
"""Statistics taken on a sample of rows (IL013's token similarity; the attention and softmax rows of
IL004 and IL011): a mean of each rank's sample of its local batch, not the single-process sample
of the global batch. The findings built on them must still be equal (asserted above)."""


def largest_difference(a, b, skip=frozenset()):
    """Largest relative difference between two probe results' statistics (inf if their keys differ),
    and the statistic where it is."""
    worst, where = 0.0, ""
    for table in ("ops", "params", "grads"):
        x, y = getattr(a, table), getattr(b, table)
        if set(x) != set(y):
            return math.inf, table
        for key in x:
            if set(x[key]) != set(y[key]):
                return math.inf, f"{table}[{key}]"
            for name, u in x[key].items():
                v = y[key][name]
                if (u != u and v != v) or name in skip:
                    continue
                diff = abs(u - v) / max(abs(u), abs(v), 1e-12)
                if diff > worst:
                    worst, where = diff, f"{table}[{key}].{name}"
    return worst, where


def run_case(case: str, rank: int, world: int, mesh) -> dict:
    import initlint

    model = small_llama() if case == "fsdp_llama" else bad_mlp()
    reference_model = copy.deepcopy(model)
    shard(case, model, mesh)
    local = inputs(case, rank if case.startswith("fsdp") else 0)
    if case == "fsdp_mlp":
        model(local)  # a model that already ran forward: FSDP has initialised its state lazily
    shards = {n: (p.to_local() if hasattr(p, "to_local") else p).detach().clone() for n, p in model.named_parameters()}
    sharded = initlint.audit(model, local)
    data = torch.cat([inputs(case, r) for r in range(world)]) if case.startswith("fsdp") else local
    reference = initlint.audit(reference_model, data)
    unchanged = all(torch.equal((p.to_local() if hasattr(p, "to_local") else p).detach(), shards[n])
                    for n, p in model.named_parameters())
    no_grad = all(p.grad is None for p in model.parameters())
    out = model(local)  # the user's next forward still works (FSDP initialises lazily here, as it should)
    finite = bool(torch.isfinite(out.logits if hasattr(out, "logits") else out).all())
    return {
        "sharded": [[f.code, f.module, f.message, f.fix] for f in sharded.findings],
        "reference": [[f.code, f.module, f.message, f.fix] for f in reference.findings],
        "difference": largest_difference(sharded.probe, reference.probe, skip=SAMPLED),
        "backward_ran": [sharded.probe.backward_ran, reference.probe.backward_ran],
        "unchanged": unchanged, "no_grad": no_grad, "next_forward": finite, "notes": sharded.notes,
    }


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ending = Exit(rank, world, datetime.timedelta(seconds=200))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    code = 0
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world,))
        results = {case: run_case(case, rank, world, mesh) for case in sys.argv[1:] or CASES}
        print(json.dumps({"rank": rank, "results": results}), flush=True)
    except BaseException:
        traceback.print_exc()
        code = 1
    ending.leave(code)  # the ranks leave the group together (rank_exit)


if __name__ == "__main__":
    main()
