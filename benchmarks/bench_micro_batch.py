"""The first SGD step judged on one micro-batch of a run that steps on several: the evidence behind
update-scale's ``batches_per_step``.

    python benchmarks/bench_micro_batch.py [--splits 4,8] [--seeds 0,1,2,3,4]

A run with gradient accumulation, or data-parallel over several ranks, steps on the mean gradient of
``k`` batches, and the training callbacks audit one of them. Adam's first step moves each element by about
lr whatever the gradient's size, so one batch shows the run's first step. SGD's step is the gradient
itself. A gradient is signal plus noise, and the noise of one batch is ``sqrt(k)`` times that of the mean
of ``k``. So one batch's first SGD step is larger than the run's, up to ``sqrt(k)`` times when the noise
dominates. Dividing it by ``sqrt(k)`` gives a figure no larger than the run's, whatever the split
between signal and noise.

For every SGD run of ``bench_first_step.py`` (``results/first_step_runs.json``: 4 cases, 8 lrs, 5
seeds, each trained 200 steps at its case's batch, with its trouble marked as that benchmark marks it),
this takes the first step again on the first ``1/k`` of the run's first batch, on a copy of the model
with the run's init, and scores update-scale's figure (the largest ratio over the weights, leaving out
those that feed a BatchNorm) at the limit 0.5 three ways:

* ``run's batch``: on the whole first batch, as the calibration took it;
* ``one micro-batch``: on ``1/k`` of it, as the callbacks saw it before ``batches_per_step``;
* ``/ sqrt(k)``: the same divided by ``sqrt(k)``: update-scale's warning with ``batches_per_step=k``.

Flagged runs, the troubled ones among them, and the flagged runs whose figure on the run's batch was
clean (false alarms of the micro-batch against the calibration). The report is written to
``results/micro_batch.md``.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Dict, List, Optional, Sequence

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_first_step import (CACHE, OPTIMIZERS, RESULTS, first_step_ratios, load_cache,  # noqa: E402
                              mark_trouble, without_norm_fed)
from first_step_cases import CASES  # noqa: E402

REPORT = os.path.join(RESULTS, "micro_batch.md")
LIMIT = 0.5


def micro_ratios(run: dict, k: int, task) -> Dict[str, float]:
    """The run's first-step ratios on the first ``1/k`` of its first batch (its init and batch rebuilt as
    ``bench_first_step.train_run`` made them)."""
    torch.manual_seed(run["seed"])
    model = CASES[run["case"]].build()
    x, y = task.sample(torch.Generator().manual_seed(10_000 + run["seed"]))
    n = max(1, x.shape[0] // k)
    return first_step_ratios(model, OPTIMIZERS[run["opt"]](run["lr"]), (x[:n], y[:n]), task.loss)


def _pct(num: int, den: int) -> str:
    return f"{100 * num / den:.0f}% ({num}/{den})" if den else "n/a (0/0)"


def table(runs: List[dict], micro: Dict[int, List[dict]]) -> List[str]:
    troubled = sum(1 for r in runs if r["trouble"])
    lines = ["| figure | flagged | precision | recall | flagged, clean on the run's batch |", "|---|---|---|---|---|"]

    def row(label: str, figures: List[float]) -> None:
        flagged = [(r, f) for r, f in zip(runs, figures) if f > LIMIT]
        hit = sum(1 for r, _ in flagged if r["trouble"])
        false = sum(1 for r, _ in flagged if r["ratio"] <= LIMIT)
        lines.append(f"| {label} | {len(flagged)} | {_pct(hit, len(flagged))} | {_pct(hit, troubled)} | {false} |")

    row("run's batch", [r["ratio"] for r in runs])
    for k, rs in micro.items():
        row(f"one micro-batch of {k}", [m["ratio"] for m in rs])
        row(f"one micro-batch of {k}, / sqrt({k})", [m["ratio"] / math.sqrt(k) for m in rs])
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", default="4,8")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seeds = {int(s) for s in args.seeds.split(",")}
    every = [r for r in load_cache(CACHE).values() if r["steps"] == args.steps and r["seed"] in seeds]
    if not every:
        sys.exit("no cached runs of bench_first_step.py for these settings")
    mark_trouble(every)  # over every optimizer: a run's best lr is its case's and optimizer's
    runs = sorted(without_norm_fed([r for r in every if r["opt"] == "SGD"]),
                  key=lambda r: (r["case"], r["lr"], r["seed"]))
    tasks = {case: CASES[case].task() for case in {r["case"] for r in runs}}
    micro: Dict[int, List[dict]] = {}
    bound_over = 0
    for k in (int(s) for s in args.splits.split(",")):
        micro[k] = without_norm_fed([dict(r, ratios=micro_ratios(r, k, tasks[r["case"]])) for r in runs])
        bound_over += sum(1 for r, m in zip(runs, micro[k]) if m["ratio"] / math.sqrt(k) > r["ratio"] * 1.0001)
    cases = sorted(tasks)
    lines = ["# The first SGD step on one micro-batch", "",
             f"`python benchmarks/bench_micro_batch.py --splits {args.splits} --seeds {args.seeds}`: "
             f"{len(runs)} SGD runs (momentum 0.9) of `bench_first_step.py`, {args.steps} steps, cases "
             f"{', '.join(cases)}; update-scale's figure at the limit {LIMIT}, the weights that feed a BatchNorm "
             f"left out. A micro-batch of k is the first 1/k of the run's first batch.", "",
             "## All cases", ""] + table(runs, micro)
    for case in cases:
        keep = [i for i, r in enumerate(runs) if r["case"] == case]
        lines += ["", f"## {case}", ""] + table([runs[i] for i in keep],
                                                 {k: [rs[i] for i in keep] for k, rs in micro.items()})
    lines += ["", f"Runs whose micro-batch figure divided by sqrt(k) exceeds the run's batch figure: {bound_over} "
                  f"(of {len(runs) * len(micro)})."]
    text = "\n".join(lines) + "\n"
    with open(REPORT, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
