"""Sharded audit under torch.distributed: two processes on localhost with gloo (tests/distributed_worker.py).

Each rank audits the sharded model with its local batch and, in-process, the unsharded copy
with the global batch; the two must give the same findings on every rank, and the sharded
model must be left as it was.
"""
import json
import os
import socket
import subprocess
import sys

import pytest

WORLD = 2
WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")
CASES = ("fsdp_mlp", "tp_mlp", "fsdp_llama")
pytestmark = pytest.mark.slow  # two processes, three sharded models


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks():
    pytest.importorskip("torch.distributed.fsdp")
    port = str(_free_port())
    env = dict(os.environ, WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
               SIDE_PORT=str(_free_port()), OMP_NUM_THREADS="1", INITLINT_NO_PROGRESS="1")
    procs = [subprocess.Popen([sys.executable, WORKER, *CASES], env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(WORLD)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=240))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    results = {}
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-4000:]
        line = next(line for line in out.splitlines() if line.startswith("{"))
        data = json.loads(line)
        results[data["rank"]] = data["results"]
    assert sorted(results) == list(range(WORLD))
    return results


@pytest.mark.parametrize("case", CASES)
def test_every_rank_gets_the_unsharded_models_findings(ranks, case):
    for rank in range(WORLD):
        got = ranks[rank][case]
        pairs = [(c, m) for c, m, _, _ in got["sharded"]]
        assert pairs == [(c, m) for c, m, _, _ in got["reference"]], (rank, got)
        assert got["sharded"] == got["reference"]  # messages and fixes too
        assert got["backward_ran"] == [True, True]
        difference, where = got["difference"]
        assert difference < 1e-4, where  # statistics equal up to the order of floating-point sums
    expected = {"fsdp_mlp": {("IL003", "5"), ("IL008", "2")}, "tp_mlp": {("IL003", "5"), ("IL008", "2")},
                "fsdp_llama": {("IL011", "model.layers.0.self_attn.q_proj"), ("IL008", "model.layers.1.mlp.up_proj")}}
    assert {(c, m) for c, m, _, _ in ranks[0][case]["sharded"]} == expected[case]


@pytest.mark.parametrize("case", CASES)
def test_the_sharded_model_is_left_as_it_was(ranks, case):
    for rank in range(WORLD):
        got = ranks[rank][case]
        assert got["unchanged"], "a shard changed"
        assert got["no_grad"], "a .grad was left behind"
        assert got["next_forward"], "the user's next forward failed"


def test_the_note_says_what_was_reduced(ranks):
    assert any("data-parallel batch of 2 x 8" in n for n in ranks[0]["fsdp_mlp"]["notes"])
    assert any("shared by every rank" in n for n in ranks[0]["tp_mlp"]["notes"])
