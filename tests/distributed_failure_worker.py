"""One rank of the tests of a sharded audit in which one rank fails (tests/test_distributed_failure.py).

Usage: ``distributed_failure_worker.py CASE FAILING_RANK`` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set; the process group's timeout is PG_TIMEOUT seconds (180 unless set). The rank
builds an FSDP2-sharded model and audits it, as a training script would:

- ``forward_raises``: the failing rank's forward raises (as an out-of-memory error on one device would);
- ``trace_differs``: the same, but it raises while fx traces it too, so fx traces the model on the other ranks only;
- ``backward_raises``: the failing rank's backward raises (its forward does not);
- ``wrong_width``: the failing rank's batch has 63 features where the others have 64;
- ``nan_batch``: the failing rank's batch holds a NaN;
- ``dynamic_padding``: token batches that differ only in length (2 x 32 tokens, 2 x 40 on the failing rank).

Whatever the audit does, the process stays alive and prints one JSON line: the rank, the seconds
the audit took, its error (type and message) or its findings. Then it waits, through the process
group's store (not a collective), until every rank has printed or the timeout has passed twice
over, as a training script would carry on, and the ranks leave together (``rank_exit.Exit``).
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time
from typing import Callable

import torch
import torch.distributed as dist
import torch.fx
import torch.nn as nn
from rank_exit import Exit, wait

FEATURES = 64
FAIL_MESSAGE = "CUDA out of memory. Tried to allocate 20.00 GiB (simulated on this rank)"
FAILS = {"forward": -1, "backward": -1}
"""The rank whose forward, or backward, raises (set by main)."""


def _fails(where: str) -> bool:
    return FAILS[where] == dist.get_rank()


def fail_here(x: torch.Tensor) -> torch.Tensor:
    """Raises on the failing rank while the probe runs (opaque to fx: traced as one call, run for real)."""
    if _fails("forward"):
        raise RuntimeError(FAIL_MESSAGE)
    return x


torch.fx.wrap("fail_here")


class _FailBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        if _fails("backward"):
            raise RuntimeError(FAIL_MESSAGE)
        return grad


def fail_in_backward(x: torch.Tensor) -> torch.Tensor:
    """Raises on the failing rank when the gradient flows back through it."""
    return _FailBackward.apply(x)


torch.fx.wrap("fail_in_backward")


class FailInBackward(nn.Module):
    """Inside a block, so the probe's recomputation of that block takes its gradient."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fail_in_backward(x)


def fail_even_traced(x: torch.Tensor) -> torch.Tensor:
    """Raises on the failing rank whenever it runs, fx's symbolic trace included."""
    if _fails("forward"):
        raise RuntimeError(FAIL_MESSAGE)
    return x


class FlakyMLP(nn.Module):
    """A ReLU MLP whose second block raises on the failing rank. With ``checked``, its forward checks
    its input's rank first, which fx cannot trace: every rank runs the runtime capture only."""

    def __init__(self, checked: bool, fail: Callable[[torch.Tensor], torch.Tensor] = fail_here) -> None:
        super().__init__()
        self.checked = checked
        self.fail = fail
        widths = (FEATURES, 96, 48, 32)  # blocks of different sizes: gathers out of step cannot pair up unnoticed
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(widths, widths[1:])])
        self.head = nn.Linear(widths[-1], 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checked and x.dim() != 2:
            raise ValueError(f"expected a batch of feature vectors, got {x.dim()} dimensions")
        x = self.blocks[0](x)
        x = self.fail(self.blocks[1](x))
        return self.head(self.blocks[2](x))


class TokenMLP(nn.Module):
    """Token embeddings through a ReLU MLP: the batch's length is free. The second block's bias of -3
    leaves its ReLU dead (IL003), so the report has a finding to agree on."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, FEATURES)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.ReLU()) for _ in range(2)])
        self.head = nn.Linear(FEATURES, 256)
        with torch.no_grad():
            self.blocks[1][0].bias.fill_(-3.0)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(case: str, rank: int, failing: int, mesh) -> tuple:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    if case == "dynamic_padding":
        model = TokenMLP()
    else:
        fail = fail_even_traced if case == "trace_differs" else fail_here
        model = FlakyMLP(checked=case == "forward_raises", fail=fail)
        if case == "backward_raises":
            model.blocks[1].append(FailInBackward())

    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    gen = torch.Generator().manual_seed(100 + rank)
    if case == "dynamic_padding":
        batch = torch.randint(0, 256, (2, 40 if rank == failing else 32), generator=gen)
    else:
        width = FEATURES - 1 if case == "wrong_width" and rank == failing else FEATURES
        batch = torch.randn(8, width, generator=gen)
        if case == "nan_batch" and rank == failing:
            batch[3, 5] = float("nan")
    return model, batch


def main() -> None:
    case, failing = sys.argv[1], int(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if case in ("forward_raises", "trace_differs", "backward_raises"):
        FAILS["backward" if case == "backward_raises" else "forward"] = failing
    timeout = datetime.timedelta(seconds=float(os.environ.get("PG_TIMEOUT", "180")))
    ending = Exit(rank, world, timeout)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    from torch.distributed.device_mesh import init_device_mesh

    import initlint

    model, batch = build(case, rank, failing, init_device_mesh("cpu", (world,)))
    out = {"rank": rank, "error": None, "findings": None}
    start = time.perf_counter()
    try:
        report = initlint.audit(model, batch)
        out["findings"] = [[f.code, f.module, f.message] for f in report.findings]
    except Exception as exc:  # the rank carries on, as a training script that catches it would
        out["error"] = [type(exc).__name__, str(exc)]
    out["seconds"] = time.perf_counter() - start
    print(json.dumps(out), flush=True)
    store = dist.distributed_c10d._get_default_store()
    deadline = time.monotonic() + 2 * timeout.total_seconds()
    wait(store, "audited", world, deadline)
    ending.leave()


if __name__ == "__main__":
    main()
