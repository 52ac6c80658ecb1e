"""A sharded audit in which one rank fails ends on every rank within seconds, with one sentence
naming that rank and its error (tests/distributed_failure_worker.py, gloo on localhost).

The process group's timeout is 180 s. Before the ranks agreed on success before each collective,
the ranks that had not failed waited out that timeout in a collective (then reported "a bug in
initlint"), or paired one with a collective of different size, and gloo aborted every process.
"""
import os

import pytest

import launch_ranks

WORKER = os.path.join(os.path.dirname(__file__), "distributed_failure_worker.py")
PG_TIMEOUT = 180
BOUND = 30.0  # seconds one rank's audit may take here: far below the timeout, far above the ~1 s it takes
pytestmark = pytest.mark.slow  # two and four processes each


def run_ranks(case: str, world: int, failing: int) -> list:
    """Every rank's JSON line, after asserting that each process ended by itself, not by a signal."""
    pytest.importorskip("torch.distributed.fsdp")
    return launch_ranks.run_ranks(WORKER, [case, str(failing)], world, PG_TIMEOUT, PG_TIMEOUT - 30)


FAILURES = {
    "forward_raises": ("the forward probe", "the model's forward raised RuntimeError: CUDA out of memory. Tried to "
                                            "allocate 20.00 GiB (simulated on this rank)"),
    "trace_differs": ("the forward probe", "the model's forward raised RuntimeError: CUDA out of memory. Tried to "
                                           "allocate 20.00 GiB (simulated on this rank)"),
    "wrong_width": ("the forward probe", "the model's forward raised RuntimeError: mat1 and mat2 shapes cannot be "
                                         "multiplied (8x63 and 64x96)"),
    "nan_batch": ("preparing its probe batch", "the example inputs contain NaN or Inf"),
    "backward_raises": ("the backward probe", "RuntimeError: CUDA out of memory. Tried to allocate 20.00 GiB "
                                              "(simulated on this rank)"),
}
RUNS = [(case, world) for case in ("forward_raises", "wrong_width") for world in (2, 4)] + [
    (case, 2) for case in ("trace_differs", "nan_batch", "backward_raises")]


@pytest.mark.parametrize("case,world", RUNS)
def test_every_rank_names_the_failing_rank_within_seconds(case, world):
    failing = world - 1 if world == 2 else 2
    lines = run_ranks(case, world, failing)
    stage, error = FAILURES[case]
    for line in lines:
        assert line["seconds"] < BOUND, line
        kind, message = line["error"]
        assert kind == "LoadError", line
        assert message.startswith(f"rank {failing} of {world} failed in {stage}: {error}"), line
        assert "bug in initlint" not in message
    assert len({line["error"][1] for line in lines}) == 1  # the same sentence on every rank


@pytest.mark.parametrize("world", [2, 4])
def test_batches_that_differ_only_in_length_give_every_rank_the_same_report(world):
    lines = run_ranks("dynamic_padding", world, failing=world - 1)  # that rank's batch is 2 x 40, the others' 2 x 32
    for line in lines:
        assert line["error"] is None, line
        assert line["findings"] == lines[0]["findings"]
    assert [(code, module) for code, module, _ in lines[0]["findings"]] == [("IL003", "blocks.1.1")]
