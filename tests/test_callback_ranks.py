"""In a data-parallel run every rank's callback audits its own first batch, and a verdict near a limit may
differ between batches. The ranks stop together: before, the rank that stopped left the others waiting in
the first step's collective until the process group's timeout (tests/callback_ranks_worker.py, gloo on
localhost)."""
import os

import pytest

import launch_ranks

WORKER = os.path.join(os.path.dirname(__file__), "callback_ranks_worker.py")
PG_TIMEOUT = 60
pytestmark = pytest.mark.slow  # two processes


def run_ranks(how: str, world: int = 2, failing: int = 1) -> list:
    lines = launch_ranks.run_ranks(WORKER, [str(failing), how], world, PG_TIMEOUT, PG_TIMEOUT - 15)
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
