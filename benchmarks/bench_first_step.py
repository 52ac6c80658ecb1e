"""Does a large first optimizer step predict a troubled run? The evidence behind update-scale's limit.

    nice -n 10 python benchmarks/bench_first_step.py                      # every case, 5 seeds, 200 steps
    nice -n 10 python benchmarks/bench_first_step.py --cases gpt --seeds 0,1
    python benchmarks/bench_first_step.py --report-only                   # the table from the cached runs

The figure measured at init (update-scale's): one step of the optimizer from the init, on the run's
first batch, on a copy of the model; per weight tensor (ndim >= 2) the ratio
rms(W_after - W_before) / rms(W_before), where a tensor initialised to zero is judged against
1 / sqrt(fan_in), the scale a sound init would give it. A run's figure is the maximum over its weight
tensors; a limit flags the run when that maximum exceeds it.

Then the run itself: 200 steps from the same init at a constant lr (no warmup, no gradient clipping,
one param group, batches drawn from the task with the run's seed; the model's init uses the same seed).
The cases, models and tasks are in ``first_step_cases.py``. Optimizers: Adam, AdamW (weight decay 0.1)
and SGD with momentum 0.9, each at its own lr grid (below).

A run is in trouble when
- it diverged: a non-finite loss at any step (the run stops there), or
- it ended above its start: the mean training loss of its last 10 steps exceeds its first step's loss, or
- it used an lr above the best one for its case and optimizer (best: lowest mean final loss over
  seeds, among lrs whose seeds all stayed finite) and its final loss (mean of the last 10 steps) is at
  least 1.5x the best lr's mean final loss.
A run that is only slow because its lr is too small is not trouble.

The report scores every candidate limit (precision: troubled runs among flagged ones; recall: flagged runs
among troubled ones; and how often a clean audit came before trouble), over all runs, per case and per
optimizer, then under two variations: the figure without the weights that feed a BatchNorm directly
(their scale does not matter to the loss), and trouble judged on the loss above the task's floor (the
token task's entropy rate), alone and together.

Each run is cached in ``results/first_step_runs.json`` (keyed by case, optimizer, lr, seed and steps),
so a re-run skips what is done; the report is written to ``results/first_step.md``.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import fcntl
import json
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from first_step_cases import CASES  # noqa: E402

RESULTS = os.path.join(HERE, "results")
CACHE = os.path.join(RESULTS, "first_step_runs.json")
REPORT = os.path.join(RESULTS, "first_step.md")

OPTIMIZERS: Dict[str, Callable[[float], Callable[[nn.Module], torch.optim.Optimizer]]] = {
    "Adam": lambda lr: (lambda m: torch.optim.Adam(m.parameters(), lr=lr)),
    "AdamW": lambda lr: (lambda m: torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.1)),
    "SGD": lambda lr: (lambda m: torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9)),
}
ADAM_LRS = (1e-4, 3e-4, 1e-3, 3e-3, 5e-3, 1e-2, 2e-2, 3e-2, 1e-1)
LRS: Dict[str, Tuple[float, ...]] = {"Adam": ADAM_LRS, "AdamW": ADAM_LRS,
                                     "SGD": (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0)}
LIMITS = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.7, 1.0)
WORSE = 1.5  # a run at an lr above the best ending this many times the best's loss is trouble
TAIL = 10  # final loss: mean of the last TAIL steps


# ------------------------------------------------------------------------------ the figure at init
def _fan_in(w: torch.Tensor) -> int:
    return w.shape[1] * math.prod(w.shape[2:])


def first_step_ratios(model: nn.Module, opt_factory: Callable[[nn.Module], torch.optim.Optimizer],
                      batch: Tuple[torch.Tensor, torch.Tensor],
                      loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Dict[str, float]:
    """Per weight tensor (ndim >= 2) of a copy of ``model``: rms of one optimizer step's change over the
    weight's rms (1 / sqrt(fan_in) for a tensor that is all zeros). Non-finite ratios are ``inf``."""
    model = copy.deepcopy(model)
    opt = opt_factory(model)
    weights = {name: p for name, p in model.named_parameters() if p.requires_grad and p.ndim >= 2}
    before = {name: p.detach().clone() for name, p in weights.items()}
    x, y = batch
    opt.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    opt.step()
    ratios = {}
    for name, p in weights.items():
        w0 = before[name].double()
        ref = float(w0.pow(2).mean().sqrt())
        if ref == 0.0:
            ref = 1.0 / math.sqrt(_fan_in(w0))
        r = float((p.detach().double() - w0).pow(2).mean().sqrt()) / ref
        ratios[name] = r if math.isfinite(r) else math.inf
    return ratios


# ------------------------------------------------------------------------------ one run
def train_run(case_key: str, opt_name: str, lr: float, seed: int, steps: int, task) -> dict:
    case = CASES[case_key]
    torch.manual_seed(seed)
    model = case.build()
    gen = torch.Generator().manual_seed(10_000 + seed)
    batches = [task.sample(gen) for _ in range(steps)]
    factory = OPTIMIZERS[opt_name](lr)
    t0 = time.perf_counter()
    ratios = first_step_ratios(model, factory, batches[0], task.loss)
    top = max(ratios, key=ratios.get)
    opt = factory(model)
    losses: List[float] = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = task.loss(model(x), y)
        value = float(loss.detach())
        losses.append(value)
        if not math.isfinite(value):
            break
        loss.backward()
        opt.step()
    diverged = not math.isfinite(losses[-1])
    return {"case": case_key, "opt": opt_name, "lr": lr, "seed": seed, "steps": steps,
            "ratio": ratios[top], "ratio_at": top, "ratios": ratios, "first": losses[0],
            "final": math.inf if diverged else statistics.fmean(losses[-TAIL:]),
            "diverged": diverged, "diverged_at": len(losses) if diverged else None,
            "seconds": time.perf_counter() - t0}


def run_key(case: str, opt: str, lr: float, seed: int, steps: int) -> str:
    return f"{case}|{opt}|{lr:g}|{seed}|{steps}"


def load_cache(path: str) -> Dict[str, dict]:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def save_cache(path: str, cache: Dict[str, dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:  # a run a line
        f.write("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(cache[k], sort_keys=True)}"
                                     for k in sorted(cache)) + "\n}\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def locked(path: str):
    """Several processes (one per case) may share the cache file."""
    name = "initlint-first-step-" + os.path.abspath(path).replace(os.sep, "_") + ".lock"
    with open(os.path.join(tempfile.gettempdir(), name), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_all(cases: Sequence[str], seeds: Sequence[int], steps: int, cache_path: str) -> None:
    tasks = {key: CASES[key].task() for key in cases}
    for seed in seeds:  # seeds outermost: after the first pass every cell has a run
        for case in cases:
            for opt_name, lrs in LRS.items():
                for lr in lrs:
                    key = run_key(case, opt_name, lr, seed, steps)
                    cache = load_cache(cache_path)  # another process may write other cases
                    if key in cache:
                        continue
                    rec = train_run(case, opt_name, lr, seed, steps, tasks[case])
                    with locked(cache_path):
                        cache = load_cache(cache_path)
                        cache[key] = rec
                        save_cache(cache_path, cache)
                    print(f"{key}: ratio {rec['ratio']:.3g} ({rec['ratio_at']}) loss {rec['first']:.3f} -> "
                          f"{rec['final']:.3f} {'DIVERGED ' if rec['diverged'] else ''}{rec['seconds']:.1f}s",
                          flush=True)


# ------------------------------------------------------------------------------ trouble and the table
def mark_trouble(runs: List[dict], floors: Optional[Dict[str, float]] = None) -> Dict[Tuple[str, str], float]:
    """Sets ``run['trouble']`` (a reason or ``""``) on every run; returns the best lr per (case, optimizer).

    With ``floors`` (a loss floor per case), "worse than the best lr" compares the losses above the floor."""
    floors = floors or {}
    cells: Dict[Tuple[str, str, float], List[dict]] = {}
    for r in runs:
        cells.setdefault((r["case"], r["opt"], r["lr"]), []).append(r)
    best: Dict[Tuple[str, str], Tuple[float, float]] = {}
    for (case, opt, lr), rs in cells.items():
        finals = [r["final"] for r in rs]
        if all(math.isfinite(f) for f in finals):
            mean = statistics.fmean(finals)
            if (case, opt) not in best or mean < best[(case, opt)][1]:
                best[(case, opt)] = (lr, mean)
    for r in runs:
        best_lr, best_loss = best.get((r["case"], r["opt"]), (math.inf, math.inf))
        floor = floors.get(r["case"], 0.0)
        if r["diverged"]:
            r["trouble"] = "diverged"
        elif r["final"] > r["first"]:
            r["trouble"] = "above start"
        elif r["lr"] > best_lr and r["final"] - floor >= WORSE * (best_loss - floor):
            r["trouble"] = f">={WORSE:g}x best"
        else:
            r["trouble"] = ""
    return {k: v[0] for k, v in best.items()}


def scores(runs: List[dict], limit: float) -> Tuple[int, int, int, int]:
    """(flagged, flagged and troubled, troubled, clean and troubled) at ``limit``."""
    flagged = [r for r in runs if r["ratio"] > limit]
    troubled = [r for r in runs if r["trouble"]]
    return (len(flagged), sum(1 for r in flagged if r["trouble"]), len(troubled),
            sum(1 for r in troubled if r["ratio"] <= limit))


def _pct(num: int, den: int) -> str:
    return f"{100 * num / den:.0f}% ({num}/{den})" if den else "n/a (0/0)"


def pick_limit(runs: List[dict]) -> Tuple[Optional[float], str]:
    """The limit that reaches >= 90% precision and >= 80% recall with the best recall (ties: the higher
    limit, fewer findings); if none does, the one with the best F1, said so."""
    table = []
    for limit in LIMITS:
        flagged, hit, troubled, _ = scores(runs, limit)
        p = hit / flagged if flagged else 0.0
        rc = hit / troubled if troubled else 0.0
        table.append((limit, p, rc))
    ok = [t for t in table if t[1] >= 0.9 and t[2] >= 0.8]
    if ok:
        limit = max(ok, key=lambda t: (round(t[2], 6), t[0]))[0]
        return limit, "reaches >= 90% precision and >= 80% recall"
    f1 = [(2 * p * rc / (p + rc) if p + rc else 0.0, limit) for limit, p, rc in table]
    return max(f1)[1], "no limit reaches both targets; best F1 shown"


def _fmt_loss(rs: List[dict]) -> str:
    finals = [r["final"] for r in rs if math.isfinite(r["final"])]
    div = len(rs) - len(finals)
    text = f"{statistics.fmean(finals):.3f}" if finals else "-"
    return text + (f" ({div} div)" if div else "")


def without_norm_fed(runs: List[dict]) -> List[dict]:
    """Copies of ``runs`` whose figure leaves out the weights that feed a BatchNorm directly."""
    out = []
    for r in runs:
        skip = set(CASES[r["case"]].feeds_norm)
        out.append(dict(r, ratio=max(v for k, v in r["ratios"].items() if k not in skip)))
    return out


def _limit_tables(runs: List[dict], cases: List[str], picked: Optional[float], families: bool = True) -> List[str]:
    lines: List[str] = []
    groups = [("all", runs)] + [(c, [r for r in runs if r["case"] == c]) for c in cases]
    if families:
        groups += [(f"{o} (all cases)", [r for r in runs if r["opt"] == o]) for o in OPTIMIZERS]
    for fam, rs in groups:
        if not rs:
            continue
        lines += [f"### {fam}", "", "| limit | precision | recall | trouble after a clean audit |", "|---|---|---|---|"]
        for lim in LIMITS:
            flagged, hit, troubled, missed = scores(rs, lim)
            mark = " (picked)" if lim == picked and fam == "all" else ""
            lines.append(f"| {lim:g}{mark} | {_pct(hit, flagged)} | {_pct(hit, troubled)} | "
                         f"{_pct(missed, len(rs) - flagged)} |")
        lines.append("")
    return lines


def report(every: List[dict], steps: int) -> str:
    """The table; a run's figure is update-scale's: the weights that feed a BatchNorm are left out, as the
    rule leaves them out (``every`` has the figure over every weight tensor, kept as a variant)."""
    runs = without_norm_fed(every)
    best = mark_trouble(runs)
    mark_trouble(every)
    limit, why = pick_limit(runs)
    seeds = sorted({r["seed"] for r in runs})
    cases = [c for c in CASES if any(r["case"] == c for r in runs)]
    lines = [
        "# First-step calibration (update-scale)",
        "",
        "Generated by `python benchmarks/bench_first_step.py` (torch "
        f"{torch.__version__}, 1 thread, CPU); {len(runs)} runs of {steps} steps, seeds "
        f"{', '.join(map(str, seeds))}; {sum(r['seconds'] for r in runs) / 60:.0f} min of wall-clock training in all "
        "(nice'd processes on a shared 2-core machine).",
        "",
        "Figure at init: one optimizer step from the init on a copy of the model, max over weight tensors "
        "(ndim >= 2) of rms(step) / rms(weight) (a zero tensor: 1/sqrt(fan_in)), leaving out the weights whose "
        "output goes straight into a BatchNorm, as update-scale does (the conv weights of `cnn`). Trouble: diverged (non-finite "
        f"loss), ended above its start (mean of the last {TAIL} steps above the first step's loss), or an lr above "
        f"the best one (marked *) ending >= {WORSE:g}x the best lr's final loss. Final loss: mean of the last {TAIL} "
        "training steps, over seeds that stayed finite.",
        "",
        "## Cases",
        "",
    ]
    lines += [f"- `{c}`: {CASES[c].label}" for c in cases]
    lines += [""] + summary(every, cases)
    lines += ["", "## Runs", "",
              "| case | optimizer | lr | first-step max ratio (mean) | largest at | trouble | final loss |",
              "|---|---|---|---|---|---|---|"]
    for case in cases:
        for opt in OPTIMIZERS:
            for lr in LRS[opt]:
                rs = [r for r in runs if (r["case"], r["opt"], r["lr"]) == (case, opt, lr)]
                if not rs:
                    continue
                ratio = statistics.fmean(r["ratio"] for r in rs)
                at = statistics.mode(r["ratio_at"] for r in rs)
                star = " *" if best.get((case, opt)) == lr else ""
                lines.append(f"| {case} | {opt} | {lr:g}{star} | {ratio:.3g} | `{at}` | "
                             f"{sum(bool(r['trouble']) for r in rs)}/{len(rs)} | {_fmt_loss(rs)} |")
    lines += ["", "## Limits", "",
              "Precision: troubled runs among flagged ones (a finding came before trouble). Recall: flagged runs "
              "among troubled ones. Clean: troubled runs among unflagged ones (a clean audit came before trouble).",
              ""]
    lines += _limit_tables(runs, cases, limit)
    gpt = [r for r in runs if (r["case"], r["opt"], r["lr"]) == ("gpt", "Adam", 1e-3)]
    lines += ["## Verdict", "", f"Limit {limit:g}: {why}."]
    if gpt:
        top = max(r["ratio"] for r in gpt)
        lines.append(f"nanoGPT's usual Adam 1e-3: max ratio {top:.3g} over its seeds "
                     f"({'flagged' if top > limit else 'not flagged'} at {limit:g}), "
                     f"trouble in {sum(bool(r['trouble']) for r in gpt)}/{len(gpt)} runs.")
    unreachable = [r for r in runs if r["trouble"] and r["ratio"] <= min(LIMITS)]
    lines += ["", f"Troubled runs below every candidate limit (ratio <= {min(LIMITS):g}; no limit here can catch "
              f"them) ({len(unreachable)}):", ""] + _grouped(unreachable, "max")
    missed = [r for r in runs if r["trouble"] and r["ratio"] <= limit]
    lines += ["", f"Troubled runs no finding at {limit:g} precedes ({len(missed)}):", ""] + _grouped(missed, "max")
    false = [r for r in runs if not r["trouble"] and r["ratio"] > limit]
    lines += ["", f"Flagged runs that trained well at {limit:g} ({len(false)}):", ""] + _grouped(false, "min")
    lines += [""] + sensitivity(every, cases)
    return "\n".join(lines) + "\n"


def _grouped(runs: List[dict], which: str) -> List[str]:
    """A line per (case, optimizer, lr): its runs, their max (or min) ratio and kinds of trouble."""
    groups: Dict[Tuple[str, str, float], List[dict]] = {}
    for r in runs:
        groups.setdefault((r["case"], r["opt"], r["lr"]), []).append(r)
    pick = max if which == "max" else min
    lines = []
    for (case, opt, lr), rs in sorted(groups.items()):
        kinds = sorted({r["trouble"] for r in rs if r["trouble"]})
        lines.append(f"- {case} {opt} lr {lr:g}: {len(rs)} run(s), {which} ratio {pick(r['ratio'] for r in rs):.3g}"
                     + (f", trouble: {', '.join(kinds)}" if kinds else ""))
    return lines


def task_floors(cases: List[str]) -> Dict[str, float]:
    return {c: float(getattr(CASES[c].task(), "floor", 0.0)) for c in cases}


def variants(runs: List[dict], cases: List[str]) -> List[Tuple[str, List[dict]]]:
    """The runs as defined, and copies under the sensitivity variations (trouble re-marked on the copies)."""
    floors = task_floors(cases)
    no_bn = without_norm_fed(runs)
    mark_trouble(no_bn)
    above = [dict(r) for r in runs]
    mark_trouble(above, floors)
    both = without_norm_fed(runs)
    mark_trouble(both, floors)
    adam = [r for r in both if r["opt"] != "SGD"]
    no_bn_case = [r for r in adam if not CASES[r["case"]].feeds_norm]
    return [("as the rule judges (BN-fed weights left out)", no_bn), ("every weight, BN-fed included", runs),
            ("BN-fed left out, trouble above the floor", both), ("every weight, trouble above the floor", above),
            ("BN-fed left out, trouble above the floor, Adam and AdamW only", adam),
            ("the same, models without BatchNorm", no_bn_case)]


def summary(runs: List[dict], cases: List[str]) -> List[str]:
    """One line per limit: precision / recall under each variant."""
    vs = variants(runs, cases)
    lines = ["## Summary", "", "Precision / recall per limit, over all cases (sections below: per case and optimizer).",
             "", "| limit | " + " | ".join(name for name, _ in vs) + " |", "|---" * (len(vs) + 1) + "|"]
    for lim in LIMITS:
        cells = []
        for _, rs in vs:
            flagged, hit, troubled, _ = scores(rs, lim)
            cells.append(f"{100 * hit / flagged:.0f}% / " if flagged else "n/a / ")
            cells[-1] += f"{100 * hit / troubled:.0f}%" if troubled else "n/a"
        lines.append(f"| {lim:g} | " + " | ".join(cells) + " |")
    counts = ", ".join(f"{name}: {sum(bool(r['trouble']) for r in rs)}/{len(rs)}" for name, rs in vs)
    lines += ["", f"Troubled runs: {counts}.", "", "Limit picked per column (>= 90% precision and >= 80% recall "
              "with the best recall, the higher limit on a tie; else the best F1):", ""]
    for name, rs in vs:
        lim, why = pick_limit(rs)
        flagged, hit, troubled, _ = scores(rs, lim)
        below = max((r["ratio"] for r in rs if r["ratio"] <= lim), default=0.0)
        above = min((r["ratio"] for r in rs if r["ratio"] > lim), default=math.inf)
        lines.append(f"- {name}: {lim:g}, precision {_pct(hit, flagged)}, recall {_pct(hit, troubled)} ({why}; "
                     f"no run's ratio lies between {below:.3g} and {above:.3g}, so any limit in that gap scores the same)")
    return lines + [""]


def sensitivity(runs: List[dict], cases: List[str]) -> List[str]:
    """The same limits under two variations: the figure over every weight, BatchNorm-fed ones included (as
    update-scale judged before it left them out), and trouble judged on the loss above the task's floor."""
    lines = ["## Including weights that feed a BatchNorm", "",
             "The figure over every weight tensor, the conv weights of `cnn` that go straight into a BatchNorm "
             "included (the loss does not depend on their scale; update-scale judged them before it left them "
             "out). The other cases have no such weight.", ""]
    lines += _limit_tables(runs, cases, None)
    floors = task_floors(cases)
    above = [dict(r) for r in runs]
    mark_trouble(above, floors)
    lines += ["## Trouble judged above the loss floor", "",
              "The token task cannot go below the chain's entropy rate ("
              + ", ".join(f"`{c}` {f:.3f}" for c, f in floors.items() if f) + " nats), so a run 1.5x worse than "
              "the best lr in total loss is far worse in what it learned. Here the third kind of trouble compares "
              "the losses above that floor: (final - floor) >= 1.5 (best - floor). The teacher tasks' floor is 0.",
              ""]
    lines += _limit_tables(above, cases, None)
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache", default=CACHE)
    parser.add_argument("--report-only", action="store_true", help="write the table from the cached runs")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.makedirs(RESULTS, exist_ok=True)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; cases: {', '.join(CASES)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    if not args.report_only:
        run_all(cases, seeds, args.steps, args.cache)
    runs = [r for r in load_cache(args.cache).values() if r["steps"] == args.steps and r["seed"] in seeds]
    if not runs:
        sys.exit("no cached runs for these settings")
    text = report(runs, args.steps)
    with open(REPORT, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
