"""Calibration of IL017's lost-update check: does a first step lost to half-precision storage come before a run
that learns less than it would with float32 weights?

    nice -n 10 python benchmarks/bench_lost_updates.py --seeds 0,1,2   # mlp and gpt, Adam, AdamW and SGD
    nice -n 10 python benchmarks/bench_lost_updates.py --cases gpt --seeds 0,1 --steps 100
    python benchmarks/bench_lost_updates.py --report-only              # the tables from the cached runs

A weight stored in bfloat16 (pure bf16 training: no float32 master weights) keeps 8 significant bits, so an
update below half a unit in the last place of the weight leaves it unchanged. The figure at init is IL017's:
``initlint.audit(model_in_bf16, batch, optimizer=..., loss=...)`` takes the optimizer's first step on a private
float32 copy of the parameters and measures, per weight, the share of the elements whose float32 update is
nonzero and whose bfloat16 value it leaves unchanged (``report.step.params[...].lost``); a run's figure is the
largest share over its weight tensors (two or more dimensions), the weights IL017 names.

Then the run itself, twice from the same init and batches: with every parameter and the optimizer's state
stored in bfloat16 (``model.to(torch.bfloat16)``; the loss in float32 from the bfloat16 logits), and in float32.
The cases are ``first_step_cases.py``'s MLP on a teacher task and nanoGPT (0.02 init, width 64, 4 layers) on
a Markov-chain token task; Adam and AdamW (weight decay 0.1) at 9 lrs from 1e-5 to 3e-3 and SGD with momentum
0.9 at 6 lrs from 1e-3 to 0.3; 200 steps at a constant lr, no clipping.

A bf16 run is in trouble when its loss went non-finite, or when it made less than half the float32 run's
progress (progress: the first step's loss minus the mean of the last 10). Runs whose float32 twin made
almost no progress (less than 2% of its first loss: an lr too small for 200 steps) are left out of the scores,
since neither precision learns there. The report scores candidate limits on the lost share: precision
(troubled runs among flagged ones), recall (flagged runs among troubled ones) and trouble after a clean audit,
over the optimizers IL017 judges (Adam's family, whose first step is the size of every later one), then per
optimizer (SGD's too, which it does not judge).

Runs are cached in ``results/lost_updates_runs.json``; the report is written to ``results/lost_updates.md``.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import initlint  # noqa: E402
from initlint.rules.il017_precision_headroom import SCALE_FREE_STEPS  # noqa: E402
from bench_first_step import OPTIMIZERS, RESULTS, TAIL, load_cache, save_cache  # noqa: E402
from first_step_cases import CASES  # noqa: E402

CACHE = os.path.join(RESULTS, "lost_updates_runs.json")
REPORT = os.path.join(RESULTS, "lost_updates.md")
ADAM_LRS = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 3e-3)
LRS: Dict[str, Tuple[float, ...]] = {"Adam": ADAM_LRS, "AdamW": ADAM_LRS, "SGD": (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)}
LIMITS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
STALLED = 0.02
"""A float32 run whose progress is below this share of its first loss learnt nothing in the run's steps."""


def lost_share(model: nn.Module, factory: Callable[[nn.Module], torch.optim.Optimizer],
               batch: Tuple[torch.Tensor, torch.Tensor], loss: Callable) -> Tuple[float, str, List[str]]:
    """IL017's figure for ``model`` (stored in bfloat16): the largest lost share over its weight tensors, where,
    and the codes of the audit's warnings."""
    x, y = batch
    x = x.to(torch.bfloat16) if x.is_floating_point() else x
    report = initlint.audit(model, x, optimizer=factory, loss=lambda out, inputs: loss(out.float(), y))
    shares = {n: s.lost for n, s in report.step.params.items() if len(s.shape) >= 2}
    top = max(shares, key=shares.get)
    return shares[top], top, sorted({f.code for f in report.findings if f.severity != "info"})


def train(model: nn.Module, factory, batches, loss, dtype: torch.dtype) -> List[float]:
    model = model.to(dtype)
    opt = factory(model)
    losses: List[float] = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        value = loss(model(x.to(dtype) if x.is_floating_point() else x).float(), y)
        losses.append(float(value.detach()))
        if not math.isfinite(losses[-1]):
            break
        value.backward()
        opt.step()
    return losses


def run(case_key: str, opt: str, lr: float, seed: int, steps: int) -> dict:
    case = CASES[case_key]
    task = case.task()
    gen = torch.Generator().manual_seed(10_000 + seed)
    batches = [task.sample(gen) for _ in range(steps)]
    factory = OPTIMIZERS[opt](lr)
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    init = case.build()
    state = {k: v.clone() for k, v in init.state_dict().items()}
    share, at, codes = lost_share(init.to(torch.bfloat16), factory, batches[0], task.loss)
    runs = {}
    for label, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        torch.manual_seed(seed)
        model = case.build()
        model.load_state_dict(state)
        if label == "bf16":  # the audited weights: the float32 init rounded to bfloat16
            model = model.to(torch.bfloat16)
        losses = train(model, factory, batches, task.loss, dtype)
        finite = math.isfinite(losses[-1])
        runs[label] = {"first": losses[0], "final": statistics.fmean(losses[-TAIL:]) if finite else math.inf,
                       "diverged": not finite}
    return {"case": case_key, "opt": opt, "lr": lr, "seed": seed, "steps": steps, "lost": share, "lost_at": at,
            "codes": codes, "bf16": runs["bf16"], "fp32": runs["fp32"], "seconds": time.perf_counter() - t0}


def key(case: str, opt: str, lr: float, seed: int, steps: int) -> str:
    return f"{case}|{opt}|{lr:g}|{seed}|{steps}"


def progress(r: dict) -> float:
    return r["first"] - r["final"]


def judged(r: dict) -> bool:
    """The float32 twin learnt something in the run's steps (else neither precision tells anything)."""
    return not r["fp32"]["diverged"] and progress(r["fp32"]) >= STALLED * r["fp32"]["first"]


def trouble(r: dict) -> bool:
    return r["bf16"]["diverged"] or progress(r["bf16"]) < 0.5 * progress(r["fp32"])


def scores(runs: List[dict], limit: float) -> Tuple[int, int, int, int]:
    """(flagged and troubled, flagged, troubled, clean and troubled)."""
    flagged = [r for r in runs if r["lost"] > limit]
    bad = [r for r in runs if trouble(r)]
    return (sum(trouble(r) for r in flagged), len(flagged), len(bad),
            sum(trouble(r) for r in runs if r["lost"] <= limit))


def pct(a: int, b: int) -> str:
    return f"{100 * a / b:.0f}% ({a}/{b})" if b else "n/a"


def report(runs: List[dict], steps: int) -> str:
    used = [r for r in runs if judged(r)]
    judging = [r for r in used if r["opt"] in SCALE_FREE_STEPS]
    out = [f"# IL017 lost updates: calibration ({len(runs)} runs of {steps} steps; {len(used)} scored, "
           f"{len(runs) - len(used)} left out because the float32 twin made less than {STALLED:.0%} progress)", "",
           "`python benchmarks/bench_lost_updates.py` (see its docstring). Trouble: the bfloat16 run made less than "
           "half the float32 run's progress, or went non-finite.", "",
           f"The optimizers IL017 judges ({', '.join(sorted(SCALE_FREE_STEPS))}; here "
           f"{', '.join(sorted({r['opt'] for r in judging}))}, {len(judging)} runs, "
           f"{sum(trouble(r) for r in judging)} in trouble):", "",
           "| limit | precision | recall | trouble after a clean audit |", "|---|---|---|---|"]
    for limit in LIMITS:
        hit, flagged, bad, missed = scores(judging, limit)
        clean = len(judging) - flagged
        out.append(f"| {limit:g} | {pct(hit, flagged)} | {pct(hit, bad)} | {pct(missed, clean)} |")
    for opt in sorted({r["opt"] for r in used}):
        mine = [r for r in used if r["opt"] == opt]
        out += ["", f"{opt} alone ({len(mine)} runs, {sum(trouble(r) for r in mine)} in trouble):", "",
                "| limit | precision | recall | trouble after a clean audit |", "|---|---|---|---|"]
        for limit in LIMITS:
            hit, flagged, bad, missed = scores(mine, limit)
            out.append(f"| {limit:g} | {pct(hit, flagged)} | {pct(hit, bad)} | {pct(missed, len(mine) - flagged)} |")
    out += ["", "Per case and optimizer, each lr (median over seeds): the lost share at init, the bf16 and float32 "
            "runs' progress, troubled seeds.", "",
            "| case | optimizer | lr | lost share | bf16 progress | fp32 progress | trouble | left out |",
            "|---|---|---|---|---|---|---|---|"]
    groups: Dict[Tuple[str, str, float], List[dict]] = {}
    for r in runs:
        groups.setdefault((r["case"], r["opt"], r["lr"]), []).append(r)
    for (case, opt, lr), rs in sorted(groups.items()):
        med = lambda f: statistics.median(f(r) for r in rs)  # noqa: E731
        kept = [r for r in rs if judged(r)]
        out.append(f"| {case} | {opt} | {lr:g} | {med(lambda r: r['lost']):.3f} | "
                   f"{med(lambda r: progress(r['bf16']) if not r['bf16']['diverged'] else -math.inf):.3f} | "
                   f"{med(lambda r: progress(r['fp32']) if not r['fp32']['diverged'] else -math.inf):.3f} | "
                   f"{sum(trouble(r) for r in kept)}/{len(kept)} | {len(rs) - len(kept)} |")
    return "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="mlp,gpt")
    parser.add_argument("--optimizers", default="Adam,AdamW,SGD")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.makedirs(RESULTS, exist_ok=True)
    cache = load_cache(CACHE)
    cases, opts = args.cases.split(","), args.optimizers.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    if not args.report_only:
        for case in cases:
            for opt in opts:
                for lr in LRS[opt]:
                    for seed in seeds:
                        k = key(case, opt, lr, seed, args.steps)
                        if k in cache:
                            continue
                        cache[k] = run(case, opt, lr, seed, args.steps)
                        r = cache[k]
                        print(f"{k}: lost {r['lost']:.3f} at {r['lost_at']} {r['codes']}; progress bf16 "
                              f"{progress(r['bf16']):.3f} fp32 {progress(r['fp32']):.3f}; {r['seconds']:.1f} s",
                              flush=True)
                        save_cache(CACHE, cache)
    runs = [r for k, r in cache.items() if r["steps"] == args.steps and r["case"] in cases and r["opt"] in opts]
    with open(REPORT, "w") as out:
        out.write(report(runs, args.steps))
    print(open(REPORT).read())


if __name__ == "__main__":
    main()
