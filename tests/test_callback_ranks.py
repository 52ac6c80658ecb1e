"""In a data-parallel run every rank's callback audits its own first batch, and a verdict near a limit may
differ between batches. The ranks stop together: before, the rank that stopped left the others waiting in
the first step's collective until the process group's timeout (tests/callback_ranks_worker.py, gloo on
localhost)."""
import json
import os
import socket
import subprocess
import sys

import pytest

WORKER = os.path.join(os.path.dirname(__file__), "callback_ranks_worker.py")
PG_TIMEOUT = 60
pytestmark = pytest.mark.slow  # two processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(how: str, world: int = 2, failing: int = 1) -> list:
    env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               SIDE_PORT=str(_free_port()), OMP_NUM_THREADS="1", INITLINT_NO_PROGRESS="1", PG_TIMEOUT=str(PG_TIMEOUT))
    procs = [subprocess.Popen([sys.executable, WORKER, str(failing), how], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=PG_TIMEOUT - 15))  # a rank left waiting fails this
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    lines = []
    for rank, (proc, (out, err)) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"rank {rank} ended with {proc.returncode}:\n{err[-3000:]}"
        lines.append(json.loads(next(line for line in out.splitlines() if line.startswith("{"))))
    assert all(line["seconds"] < 30 for line in lines)
    return [line["outcome"] for line in lines]


def test_every_rank_stops_when_one_ranks_batch_gives_a_finding():
    other, own = run_ranks("finding")
    assert own.startswith("InitlintFailure: initlint stopped training before the first optimizer step: 1 finding(s)")
    assert "IL003" in own
    assert other.startswith("InitlintFailure: initlint stopped training before the first optimizer step: rank 1 of 2 "
                            "found finding(s) at or above 'warning'") and "this rank's batch is clean" in other


def test_every_rank_stops_when_one_ranks_audit_fails():
    other, own = run_ranks("error")
    assert own.startswith("UsageError: ") and "seed" in own
    assert other.startswith("InitlintFailure: initlint stopped training before the first optimizer step: the audit "
                            "failed on rank 1: UsageError: ") and "this rank's batch is clean" in other
