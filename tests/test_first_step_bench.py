"""The figures behind update-scale's calibration (benchmarks/bench_first_step.py): the first-step ratio
and the definition of a troubled run."""
import math
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

from bench_first_step import first_step_ratios, mark_trouble, pick_limit, scores  # noqa: E402


def _batch():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(32, 16, generator=gen), torch.randint(0, 4, (32,), generator=gen)


def test_adam_first_step_moves_each_weight_by_lr_over_its_rms():
    """Adam's first step is lr * g / (|g| + eps), lr per element where the gradient is not tiny."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    with torch.no_grad():
        model[0].weight.normal_(0.0, 0.05)
        model[2].weight.normal_(0.0, 0.01)
    ratios = first_step_ratios(model, lambda m: torch.optim.Adam(m.parameters(), lr=1e-3), _batch(), F.cross_entropy)
    assert set(ratios) == {"0.weight", "2.weight"}  # weights only, no biases
    assert math.isclose(ratios["0.weight"], 1e-3 / 0.05, rel_tol=0.1)
    assert math.isclose(ratios["2.weight"], 1e-3 / 0.01, rel_tol=0.1)


def test_zero_weight_is_judged_against_one_over_sqrt_fan_in_and_the_model_is_untouched():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    nn.init.zeros_(model[2].weight)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ratios = first_step_ratios(model, lambda m: torch.optim.Adam(m.parameters(), lr=1e-2), _batch(), F.cross_entropy)
    assert math.isclose(ratios["2.weight"], 1e-2 * math.sqrt(64), rel_tol=0.1)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def _run(lr, seed, first, final, diverged=False, ratio=0.0):
    return {"case": "c", "opt": "Adam", "lr": lr, "seed": seed, "first": first, "final": final,
            "diverged": diverged, "ratio": ratio}


def test_trouble_is_divergence_ending_above_start_or_a_too_large_lr_ending_worse():
    runs = [_run(1e-4, 0, 3.0, 2.9), _run(1e-4, 1, 3.0, 2.9),  # slow, not trouble
            _run(1e-3, 0, 3.0, 1.0), _run(1e-3, 1, 3.0, 1.2),  # best lr (mean 1.1)
            _run(1e-2, 0, 3.0, 1.6), _run(1e-2, 1, 3.0, 1.7),  # 1.6 < 1.65: fine; 1.7 >= 1.65: trouble
            _run(1e-1, 0, 3.0, 3.2), _run(1e-1, 1, 3.0, math.inf, diverged=True)]
    best = mark_trouble(runs)
    assert best == {("c", "Adam"): 1e-3}
    assert [r["trouble"] for r in runs] == ["", "", "", "", "", ">=1.5x best", "above start", "diverged"]


def test_scores_and_the_picked_limit():
    runs = [_run(1e-3, s, 3.0, 1.0, ratio=0.05) for s in range(8)] + \
           [_run(1e-1, s, 3.0, math.inf, diverged=True, ratio=0.6) for s in range(2)]
    mark_trouble(runs)
    assert scores(runs, 0.5) == (2, 2, 2, 0)
    assert scores(runs, 0.7) == (0, 0, 2, 2)
    limit, why = pick_limit(runs)
    assert limit == 0.5 and why.startswith("reaches")


def test_above_the_floor_a_small_excess_loss_counts():
    """Best lr ends at 1.2 over a floor of 1.0 (excess 0.2); 1.4 is 1.17x the best in total loss but 2x in excess."""
    runs = [_run(1e-3, 0, 3.5, 1.2), _run(1e-2, 0, 3.5, 1.4)]
    mark_trouble(runs)
    assert [r["trouble"] for r in runs] == ["", ""]
    mark_trouble(runs, {"c": 1.0})
    assert [r["trouble"] for r in runs] == ["", ">=1.5x best"]


@pytest.mark.slow  # trains the benchmark's MLP twice for 200 steps
def test_mlp_at_adam_0_1_moves_its_weights_past_the_limit_and_ends_in_trouble():
    from bench_first_step import train_run
    from first_step_cases import CASES

    task = CASES["mlp"].task()
    runs = [train_run("mlp", "Adam", lr, 0, 200, task) for lr in (3e-3, 1e-1)]
    assert runs[0]["ratio"] < 0.5 < runs[1]["ratio"]
    mark_trouble(runs)
    assert [bool(r["trouble"]) for r in runs] == [False, True]
