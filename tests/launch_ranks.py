"""Starting the worker processes of the multi-process tests, one per rank, on localhost (gloo)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import List


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(worker: str, args: List[str], world: int, pg_timeout: int, wait: int) -> List[dict]:
    """Every rank's JSON line of ``worker args...``, after asserting that each process ended by itself, not by a
    signal, within ``wait`` seconds (a rank still waiting in a collective fails this, before the process group's
    timeout of ``pg_timeout`` seconds ends it)."""
    env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               SIDE_PORT=str(free_port()), OMP_NUM_THREADS="1", INITLINT_NO_PROGRESS="1", PG_TIMEOUT=str(pg_timeout))
    procs = [subprocess.Popen([sys.executable, worker, *args], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=wait))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    lines = []
    for rank, (proc, (out, err)) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"rank {rank} ended with {proc.returncode} (negative: a signal):\n{err[-3000:]}"
        lines.append(json.loads(next(line for line in out.splitlines() if line.startswith("{"))))
    assert [line["rank"] for line in lines] == list(range(world))
    return lines
