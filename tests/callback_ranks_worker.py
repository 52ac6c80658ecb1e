"""One rank of a data-parallel run whose training callback stops on one rank's batch only
(tests/test_callback_ranks.py).

Usage: ``callback_ranks_worker.py FAILING_RANK HOW`` with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
SIDE_PORT set; the process group's timeout is PG_TIMEOUT seconds. Every rank audits the same model (a
layer whose units a bias of -4 keeps dead on inputs of std 1) on its own first batch, as the callbacks do:
the others' batches have std 100, on which the units live; the failing rank's (HOW ``finding``) std 1, or
(HOW ``error``) its audit raises (a setting it refuses). Then, unless the audit stopped it, the rank takes
the first step's collective, as a data-parallel run does. It prints one JSON line: the rank, the seconds it
took, and the audit's stop message, its error or "trained".
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from rank_exit import Exit


def main() -> None:
    failing, how = int(sys.argv[1]), sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=float(os.environ.get("PG_TIMEOUT", "60")))
    leave = Exit(rank, world, timeout)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    from initlint.integrations._core import BatchAuditor, InitlintFailure

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    nn.init.constant_(model[0].bias, -4.0)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(rank))
    x = x * (1.0 if rank == failing and how == "finding" else 100.0)
    settings = {"select": ["IL003"], "seed": "not a seed" if rank == failing and how == "error" else 0}
    start = time.monotonic()
    try:
        BatchAuditor("TestCallback", settings=settings).audit(model, x, logging.getLogger("ranks"))
        dist.all_reduce(torch.ones(1))  # the first step's gradient reduction
        outcome = "trained"
    except Exception as exc:  # noqa: BLE001 - what the rank's training would see
        outcome = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"rank": rank, "seconds": time.monotonic() - start, "outcome": outcome}), flush=True)
    leave.leave()


if __name__ == "__main__":
    main()
