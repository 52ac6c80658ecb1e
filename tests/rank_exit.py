"""How the ranks of the multi-process tests end: together, without racing gloo's teardown.

A rank that ends its process while another is still taking its process group down closes sockets
under it, and gloo can abort that rank ("terminate called without an active exception"). So each
worker opens a store of its own on SIDE_PORT before its process group, and at the end every rank
leaves the group, waits on that store until every rank has, and ends; rank 0, which serves the
store, ends last, once the others read it no more.
"""
from __future__ import annotations

import datetime
import os
import sys
import time

import torch.distributed as dist


class Exit:
    """The side store; :meth:`leave` takes the process group down and ends the process with ``code``."""

    def __init__(self, rank: int, world: int, timeout: datetime.timedelta) -> None:
        self.rank, self.world, self.timeout = rank, world, timeout
        self.store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["SIDE_PORT"]), world, rank == 0,
                                   timeout)

    def leave(self, code: int = 0) -> None:
        deadline = time.monotonic() + 2 * self.timeout.total_seconds()
        if dist.is_initialized():
            dist.destroy_process_group()
        wait(self.store, "left the group", self.world, deadline)
        if self.rank == 0:
            wait(self.store, "done", self.world, deadline)
        else:
            self.store.add("done", 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # everything is printed and every group is down; the interpreter's teardown is torch's


def wait(store: dist.Store, key: str, world: int, deadline: float) -> None:
    """Count this rank in under ``key``, then wait until every rank has or the deadline has passed."""
    store.add(key, 1)
    while store.add(key, 0) < world and time.monotonic() < deadline:
        time.sleep(0.05)
