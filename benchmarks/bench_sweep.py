"""Calibration of the width and depth limits: coordinate-check exponents against best-lr transfer in training.

    python benchmarks/bench_sweep.py [--part coord,train,initlint,table] [--factories gpt_sp,...]
                                     [--seeds 0,1] [--lrs 1e-4,3e-4,1e-3,3e-3,1e-2,3e-2]
                                     [--coord-lrs 1e-3,3e-3,1e-2] [--large-lrs 6]

The factories are in ``benchmarks/sweep_factories.py`` (three GPTs over ``d_model``, two MLPs over
``width``, four pre-LN residual stacks over ``n_layer``).

* ``coord``: for every factory and size (GPT and MLP widths 64, 128, 256, 512; stack depths 2, 4,
  8, 16), the rms of every module's output (forward hooks on the leaf modules and on the
  blocks ``h.N``, whose output is the residual stream; blocks of a stack pooled by role,
  ``h.{i}.mlp.c_fc``, as the mean of their rms) at init and after each of 3 steps of the
  factory's optimizer at each lr of ``--coord-lrs`` (a fresh batch of the task per step), and
  the rms of the gradient of the input layer's weight. The exponent ``alpha`` of
  ``rms ~ size^alpha`` is the least-squares slope in log-log over the sizes, per role and step,
  averaged over the seeds. A role whose rms is exactly 0 at some size (muP's zero readout and
  zero-query logits at init) has no exponent.
* ``train``: for every factory, the small and the large size (width 64 and 512, i.e. 8x; depth
  2 and 16) over the lr grid, each seed: Adam (``MuAdam`` for muP) on a synthetic learnable
  task, fresh batches from a fixed stream (the same for every run of a seed). GPTs learn a
  fixed random Markov chain (vocab 64, sequences of 64, batch 8, 150 steps); MLPs
  and stacks learn labels sampled from a fixed random teacher (batch 128, 300 steps). The loss
  is the cross-entropy on a held-out set from the same source after the last step; a
  non-finite loss is a divergence. The large size trains only the ``--large-lrs`` lrs of the
  grid nearest the small size's best (that one first).
* ``initlint``: ``initlint.sweep`` on the same factories, at lr 1e-3 and at each model's lr*.
* ``table``: writes ``benchmarks/results/sweep.md`` from whatever is cached: the verdicts of the
  coordinate check at each model's lr* (the lr it would be trained with), then at each lr of
  ``--coord-lrs`` for every model, then initlint.sweep's.

Every run's result is cached as JSON in ``benchmarks/results/sweep/``; a re-run skips finished runs.
The cached results were made with ``--part coord --coord-lrs 1e-3,3e-3,1e-2``, ``--part train`` for the
MLPs and stacks (and again with ``--lrs 3e-5``), ``--part train --large-lrs 2`` to ``4`` for the GPTs, whose
width-512 runs (1 to 6 minutes each on one core) were then chosen one by one around ``lr*`` and each
side of the large size's best (the training tables list every run), and ``--part initlint``.

"Loses its best lr": let ``lr*`` be the lr with the lowest seed-mean loss at the small size. At
the large size, ``own`` is the lowest seed-mean loss over the grid and ``transfer`` the
seed-mean loss at ``lr*``. The model loses its best lr when ``transfer - own`` exceeds
``max(2% of own, seed spread)``, the seed spread being the largest half-range over seeds of the
two points compared.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import sweep_factories as S  # noqa: E402

CACHE = os.path.join(HERE, "results", "sweep")
TABLE = os.path.join(HERE, "results", "sweep.md")
COORD_SIZES = {"width": [64, 128, 256, 512], "depth": [2, 4, 8, 16]}
TRAIN_SIZES = {"width": [64, 512], "depth": [2, 16]}
TRAIN = {"markov": dict(batch=8, steps=150, eval=64), "teacher": dict(batch=128, steps=300, eval=4096)}
COORD_STEPS, COORD_LR, COORD_BATCH = 3, 1e-3, {"markov": 8, "teacher": 128}
LIMITS = [0.2, 0.3, 0.4, 0.5]
INPUT_LAYER = {"gpt": "wte.weight", "mlp": "fc.0.weight", "stack": "inp.weight"}


def _cached(key: str, compute) -> dict:
    path = os.path.join(CACHE, key + ".json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    result = compute()
    os.makedirs(CACHE, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)
    return result


def build(fac: S.Factory, size: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return fac.build(**{fac.keyword: size})


# ------------------------------------------------------------------ coordinate check
def role(path: str) -> str:
    """``h.3.mlp.c_fc`` -> ``h.{i}.mlp.c_fc``: the blocks of a stack pooled, other numbered layers kept apart."""
    return re.sub(r"^h\.\d+(?=\.|$)", "h.{i}", path)


def coord_run(fac: S.Factory, size: int, seed: int, lr: float = COORD_LR) -> dict:
    """Per-role output rms at init and after each step, and the input layer's gradient rms."""
    task = S.TASKS[fac.task](0)
    model = build(fac, size, seed)
    opt = fac.optimizer(model, lr)
    blocks = re.compile(r"^h\.\d+$")
    record: Dict[str, List[float]] = {}

    def hook(name):
        def fn(_module, _inputs, out):
            out = out[0] if isinstance(out, tuple) else out
            record.setdefault(name, []).append(float(out.detach().float().pow(2).mean().sqrt()))
        return fn

    last_block = f"h.{len(model.h) - 1}" if hasattr(model, "h") else None
    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()
               if n and (not list(m.children()) or blocks.match(n))]
    params = dict(model.named_parameters())
    gen = torch.Generator().manual_seed(1000 + seed)
    steps = []
    try:
        for step in range(COORD_STEPS + 1):
            record.clear()
            x, y = task.batch(gen, COORD_BATCH[fac.task])
            loss = task.loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad = params[INPUT_LAYER[fac.pair]].grad
            pooled = {r: statistics.mean(v for n, vs in record.items() if role(n) == r for v in vs)
                      for r in {role(n) for n in record}}
            if last_block is not None:
                pooled["stream"] = record[last_block][0]
            pooled["input-grad"] = float(grad.pow(2).mean().sqrt())
            pooled["loss"] = float(loss.detach())
            steps.append(pooled)
            if step < COORD_STEPS:
                opt.step()
    finally:
        for h in handles:
            h.remove()
    return {"factory": fac.name, "size": size, "seed": seed, "lr": lr, "steps": steps}


def fit(sizes: List[int], values: List[float]) -> Optional[tuple]:
    """Slope and residual rms of log(value) against log(size); None if a value is 0 or not finite."""
    if any(not (v > 0 and math.isfinite(v)) for v in values):
        return None
    xs, ys = [math.log(s) for s in sizes], [math.log(v) for v in values]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    resid = [y - (my + slope * (x - mx)) for x, y in zip(xs, ys)]
    return slope, math.sqrt(statistics.mean(r * r for r in resid))


def exponents(fac: S.Factory, seeds: List[int], lr: float = COORD_LR) -> Dict[str, List[Optional[float]]]:
    """role -> exponent at each step (mean over seeds), None where some rms is 0."""
    sizes = COORD_SIZES[fac.kind]
    tag = "" if lr == COORD_LR else f"_lr{lr:g}"
    runs = {(s, seed): _cached(f"coord_{fac.name}_{s}_{seed}{tag}", lambda s=s, seed=seed: coord_run(fac, s, seed, lr))
            for s in sizes for seed in seeds}
    roles = set.intersection(*(set(r["steps"][0]) for r in runs.values())) - {"loss"}
    out = {}
    for r in sorted(roles):
        per_step = []
        for step in range(COORD_STEPS + 1):
            fits = [fit(sizes, [runs[s, seed]["steps"][step][r] for s in sizes]) for seed in seeds]
            per_step.append(None if any(f is None for f in fits) else statistics.mean(f[0] for f in fits))
        out[r] = per_step
    return out


# ------------------------------------------------------------------ initlint.sweep on the same factories
def initlint_run(fac: S.Factory, seed: int = 0, lr: float = COORD_LR) -> dict:
    """initlint.sweep on the factory (its optimizer at the coordinate check's lr, the task's batch and loss),
    with the rule's limit at 0.01 so that every growing curve is a finding; the verdict at a limit L
    is then read from the findings' exponents."""
    import initlint

    task = S.TASKS[fac.task](0)
    x, y = task.batch(torch.Generator().manual_seed(1000 + seed), COORD_BATCH[fac.task])
    code = {"width": "width-unstable", "depth": "depth-unstable"}[fac.kind]
    start = time.time()
    report = initlint.sweep(fac.build, **{fac.kind: {fac.keyword: COORD_SIZES[fac.kind]}}, example_inputs=x,
                            optimizer=lambda m: fac.optimizer(m, lr), steps=COORD_STEPS,
                            loss=lambda out, _inputs: task.loss(out, y), seed=seed,
                            rule_options={code: {"limit": 0.01}})
    return {"factory": fac.name, "lr": lr, "seconds": round(time.time() - start, 1),
            "findings": [[f.code, f.module, f.value] for f in report.findings if f.value is not None]}


def initlint_key(fac: S.Factory, at_best: bool) -> Optional[str]:
    """The cache key of initlint.sweep's run on ``fac`` at lr 1e-3, or at lr* (None if lr* is not known)."""
    if not at_best:
        return f"initlint_{fac.name}"
    tr = transfer(fac, train_results(fac))
    return None if tr is None else f"initlint_{fac.name}_lr{tr['lr_small']:g}"


def initlint_table(factories: List[S.Factory], at_best: bool) -> List[str]:
    """initlint.sweep's largest exponent per factory, its verdict at each limit, and the training outcome."""
    rows, agree = [], {(kind, L): True for kind in ("width", "depth") for L in LIMITS}
    for fac in factories:
        key = initlint_key(fac, at_best)
        if key is None:
            continue
        path = os.path.join(CACHE, key + ".json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            run = json.load(f)
        worst = max(((abs(v), v, m) for _, m, v in run["findings"]), default=(0.0, 0.0, "-"))
        tr = transfer(fac, train_results(fac))
        verdicts = []
        for L in LIMITS:
            flag = worst[0] > L
            verdicts.append("flag" if flag else "clean")
            if tr is not None and flag != tr["loses"]:
                agree[fac.kind, L] = False
                verdicts[-1] += " (disagrees)"
        loses = "not run" if tr is None else ("yes" if tr["loses"] else "no")
        rows.append([fac.name, f"{worst[1]:+.2f} ({worst[2]})", f"{run['seconds']:.0f}", loses] + verdicts)
    if not rows:
        return []
    head = ["factory", "largest exponent (layer)", "sweep s", "loses best lr"] + [f"L={L:g}" for L in LIMITS]
    return _verdict_table(head, rows, agree)


# ------------------------------------------------------------------ training
def train_run(fac: S.Factory, size: int, lr: float, seed: int) -> dict:
    task, cfg = S.TASKS[fac.task](0), TRAIN[fac.task]
    model = build(fac, size, seed)
    opt = fac.optimizer(model, lr)
    gen = torch.Generator().manual_seed(2000 + seed)
    start, losses = time.time(), []
    for _ in range(cfg["steps"]):
        x, y = task.batch(gen, cfg["batch"])
        loss = task.loss(model(x), y)
        if not torch.isfinite(loss):
            losses.append(float("nan"))
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        x, y = task.batch(torch.Generator().manual_seed(99), cfg["eval"])
        final = float(task.loss(model(x), y))
    return {"factory": fac.name, "size": size, "lr": lr, "seed": seed, "loss": final if math.isfinite(final) else None,
            "train_last20": statistics.mean(losses[-20:]) if all(map(math.isfinite, losses[-20:])) else None,
            "steps": len(losses), "seconds": round(time.time() - start, 1), **cfg}


def train_key(fac: S.Factory, size: int, lr: float, seed: int) -> str:
    return f"train_{fac.name}_{size}_{lr:g}_{seed}"


def train_results(fac: S.Factory) -> Dict[tuple, List[float]]:
    """(size, lr) -> losses over the cached seeds (inf for a divergence)."""
    out: Dict[tuple, List[float]] = {}
    if not os.path.isdir(CACHE):
        return out
    for name in sorted(os.listdir(CACHE)):
        if name.startswith(f"train_{fac.name}_") and name.endswith(".json"):
            with open(os.path.join(CACHE, name)) as f:
                r = json.load(f)
            out.setdefault((r["size"], r["lr"]), []).append(math.inf if r["loss"] is None else r["loss"])
    return out


def run_train(fac: S.Factory, size: int, lr: float, seed: int) -> None:
    key = train_key(fac, size, lr, seed)
    r = _cached(key, lambda: train_run(fac, size, lr, seed))
    print(f"  {key}: loss {r['loss']} ({r['seconds']} s)", flush=True)


def large_lrs(fac: S.Factory, lrs: List[float], seed: int, count: int) -> List[float]:
    """The ``count`` lrs of the grid nearest the small size's best lr for this seed, that one first."""
    small = TRAIN_SIZES[fac.kind][0]
    losses = {}
    for lr in lrs:
        with open(os.path.join(CACHE, train_key(fac, small, lr, seed) + ".json")) as f:
            loss = json.load(f)["loss"]
        losses[lr] = math.inf if loss is None else loss
    grid = sorted(lrs)
    best = grid.index(min(losses, key=losses.get))
    # nearest by place in the grid; of two equally near, the lower lr (wider models in SP want less)
    return sorted(grid, key=lambda lr: (abs(grid.index(lr) - best), lr))[:count]


def transfer(fac: S.Factory, results: Dict[tuple, List[float]]) -> Optional[dict]:
    small, large = TRAIN_SIZES[fac.kind]
    mean = {k: statistics.mean(v) for k, v in results.items()}
    at = {size: {lr: m for (s, lr), m in mean.items() if s == size} for size in (small, large)}
    if not at[small] or not at[large]:
        return None
    lr_small = min(at[small], key=at[small].get)
    lr_large = min(at[large], key=at[large].get)
    if lr_small not in at[large]:
        return None
    own, moved = at[large][lr_large], at[large][lr_small]

    def half_range(k):
        v = results[k]
        return (max(v) - min(v)) / 2 if all(map(math.isfinite, v)) else 0.0

    spread = max(half_range((large, lr_small)), half_range((large, lr_large)))
    margin = max(0.02 * own, spread)
    return {"lr_small": lr_small, "lr_large": lr_large, "own": own, "moved": moved, "margin": margin,
            "loses": moved - own > margin, "small_best": at[small][lr_small],
            "seeds": f"{len(results[(large, lr_small)])}/{len(results[(large, lr_large)])}"}


# ------------------------------------------------------------------ table
def fmt(x: Optional[float], digits: int = 2) -> str:
    return "zero" if x is None else f"{x:+.{digits}f}"


def width_summary(exps: Dict[str, List[Optional[float]]]) -> dict:
    """The largest growth exponent at init and after the steps, and where."""
    roles = [r for r in exps if r not in ("input-grad", "stream")]

    def top(steps):
        cands = [(exps[r][s], r, s) for r in roles for s in steps if exps[r][s] is not None]
        return max(cands) if cands else (None, "-", 0)
    return {"init": top([0]), "after": top(range(1, COORD_STEPS + 1))}


def depth_summary(exps: Dict[str, List[Optional[float]]]) -> dict:
    """The largest |exponent| of the stream and of the input layer's gradient, at init and after."""
    def top(steps):
        cands = [(abs(exps[r][s]), exps[r][s], r, s) for r in ("stream", "input-grad") for s in steps
                 if exps[r][s] is not None]
        return max(cands)[1:] if cands else (None, "-", 0)
    return {"init": top([0]), "after": top(range(1, COORD_STEPS + 1))}


def verdict_table(factories: List[S.Factory], seeds: List[int], coord_lr: Optional[float]) -> List[str]:
    """One row per factory: its largest exponents, the training outcome, and each limit's verdict.

    ``coord_lr`` None: each factory's coordinate check at its own lr* (the small size's best lr)."""
    rows, agree = [], {(kind, L): True for kind in ("width", "depth") for L in LIMITS}
    for fac in factories:
        tr = transfer(fac, train_results(fac))
        if coord_lr is None and tr is None:
            continue
        exps = exponents(fac, seeds, tr["lr_small"] if coord_lr is None else coord_lr)
        summ = (width_summary if fac.kind == "width" else depth_summary)(exps)
        (a0, r0, _), (a1, r1, s1) = summ["init"], summ["after"]
        judged = [a for a in (a0, a1) if a is not None]
        worst = max(judged) if fac.kind == "width" else max(abs(a) for a in judged)
        verdicts = []
        for L in LIMITS:
            flag = worst > L
            verdicts.append("flag" if flag else "clean")
            if tr is not None and flag != tr["loses"]:
                agree[fac.kind, L] = False
                verdicts[-1] += " (disagrees)"
        if tr is None:
            loses = "not run"
        else:
            loses = (f"{'yes' if tr['loses'] else 'no'}: {tr['moved']:.3f} at lr* {tr['lr_small']:g} vs "
                     f"{tr['own']:.3f} at {tr['lr_large']:g} (margin {tr['margin']:.3f}; small size "
                     f"{tr['small_best']:.3f}; seeds at lr*/own {tr['seeds']})")
        rows.append([fac.name, f"{fac.kind} ({fac.keyword})", f"{fmt(a0)} ({r0})", f"{fmt(a1)} ({r1}, step {s1})",
                     loses] + verdicts)
    head = ["factory", "swept", "max alpha at init (where)", "max alpha after steps (where)", "loses best lr"]
    head += [f"L={L:g}" for L in LIMITS]
    return _verdict_table(head, rows, agree)


def write_table(factories: List[S.Factory], lrs: List[float], seeds: List[int], coord_lrs: List[float]) -> str:
    lines = [
        "# Sweep calibration (generated by `python benchmarks/bench_sweep.py`)", "",
        f"Exponents: rms ~ size^alpha, least squares in log-log over {COORD_SIZES['width']} (width) or "
        f"{COORD_SIZES['depth']} (depth), mean over seeds {seeds}; after = the largest over steps 1-{COORD_STEPS} of "
        f"the factory's optimizer (Adam; MuAdam for muP). Training: size {TRAIN_SIZES['width']} (width) or "
        f"{TRAIN_SIZES['depth']} (depth), lr grid as in the training tables below (the large size: the "
        f"lrs nearest lr*), held-out loss after the last step, mean over seeds; `lr*` = the small size's best lr. "
        f"A model loses its best lr when its loss at lr* exceeds its own best by more than max(2%, seed half-range). "
        f"Loss floors (the source's entropy): Markov chain {S.MarkovTask(0).floor:.3f}, teacher "
        f"{S.TeacherTask(0).floor:.3f}; ln 64 = 4.159 and ln 10 = 2.303 for a guess. "
        f"A verdict is `flag` when the exponent exceeds the limit (width: growth only, every module; "
        f"depth: |alpha| of the residual stream or of the input layer's gradient).", ""]
    lines += ["## Verdicts, coordinate check at each model's lr*", ""]
    lines += verdict_table(factories, seeds, None) + [""]
    for coord_lr in coord_lrs:
        lines += [f"## Verdicts, coordinate check at lr {coord_lr:g} for every model", ""]
        lines += verdict_table(factories, seeds, coord_lr) + [""]
    for at_best in (True, False):
        checked = initlint_table(factories, at_best)
        if checked:
            lr = "each model's lr*" if at_best else f"lr {COORD_LR:g}"
            lines += [f"## Verdicts of initlint.sweep (width-unstable, depth-unstable), {lr}", "",
                      f"Sizes as above, {COORD_STEPS} steps of the factory's optimizer at {lr} on one fixed "
                      f"batch of the task, seed 0; the largest exponent over every judged curve (outputs and "
                      f"attention logits for width, growth only; the stream and the input layer's gradient for "
                      f"depth, either sign).", ""] + checked + [""]
    lines += [f"## Exponents per role, coordinate check at lr {coord_lrs[0]:g}", ""]
    for fac in factories:
        exps = exponents(fac, seeds, coord_lrs[0])
        lines += [f"### {fac.name} (over {fac.keyword})", "", "| role | " +
                  " | ".join(f"step {s}" for s in range(COORD_STEPS + 1)) + " |",
                  "|---|" + "---|" * (COORD_STEPS + 1)]
        lines += [f"| {r} | " + " | ".join(fmt(a) for a in exps[r]) + " |" for r in exps]
        lines.append("")
    lines += ["## Training losses (held-out, per seed)", ""]
    for fac in factories:
        res = train_results(fac)
        if not res:
            continue
        lrs = sorted({lr for _, lr in res})
        lines += [f"### {fac.name}", "", "| size | " + " | ".join(f"{lr:g}" for lr in lrs) + " |",
                  "|---|" + "---|" * len(lrs)]
        for size in TRAIN_SIZES[fac.kind]:
            cells = [", ".join("div" if math.isinf(v) else f"{v:.3f}" for v in res.get((size, lr), [])) or "-"
                     for lr in lrs]
            lines.append(f"| {size} | " + " | ".join(cells) + " |")
        lines.append("")
    text = "\n".join(lines) + "\n"
    with open(TABLE, "w") as f:
        f.write(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="coord,train,table")
    parser.add_argument("--factories", default=",".join(S.FACTORIES))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--lrs", default="1e-4,3e-4,1e-3,3e-3,1e-2,3e-2")
    parser.add_argument("--coord-lrs", default="1e-3,3e-3,1e-2",
                        help="the coordinate check's lrs (the table's verdicts read the first)")
    parser.add_argument("--large-lrs", type=int, default=6,
                        help="at the large size, only this many lrs of the grid, nearest the small size's best")
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    facs = [S.FACTORIES[n] for n in opts.factories.split(",")]
    seeds = [int(s) for s in opts.seeds.split(",")]
    lrs = [float(x) for x in opts.lrs.split(",")]
    parts = opts.part.split(",")
    if any(f.name in S.NEEDS_MUP for f in facs) and set(parts) & {"coord", "train", "initlint"}:
        S.check_mup_twin()  # the muP twin is what the tables say it is
    if "coord" in parts:
        for lr in [float(x) for x in opts.coord_lrs.split(",")]:
            for fac in facs:
                start = time.time()
                exponents(fac, seeds, lr)
                print(f"coord {fac.name} at lr {lr:g}: {time.time() - start:.0f} s", flush=True)
    if "train" in parts:
        # every factory's first seed before any second seed; the small size's grid before the large size
        for seed in seeds:
            for fac in facs:
                for lr in lrs:
                    run_train(fac, TRAIN_SIZES[fac.kind][0], lr, seed)
            for fac in facs:
                for lr in large_lrs(fac, lrs, seed, opts.large_lrs):
                    run_train(fac, TRAIN_SIZES[fac.kind][1], lr, seed)
    if "initlint" in parts:
        for fac in facs:
            r = _cached(initlint_key(fac, False), lambda: initlint_run(fac))
            print(f"initlint.sweep {fac.name}: {r['findings']} ({r['seconds']} s)", flush=True)
            key = initlint_key(fac, True)
            if key is not None:
                lr = transfer(fac, train_results(fac))["lr_small"]
                r = _cached(key, lambda: initlint_run(fac, lr=lr))
                print(f"initlint.sweep {fac.name} at lr* {lr:g}: {r['findings']} ({r['seconds']} s)", flush=True)
    if "table" in parts:
        print(write_table(facs, lrs, seeds, [float(x) for x in opts.coord_lrs.split(",")]))


if __name__ == "__main__":
    main()


def _verdict_table(head: List[str], rows: List[List[str]], agree: Dict[Any, bool]) -> List[str]:
    """A markdown table of verdicts, then the limits that agree with training on every factory."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", "Limits whose verdicts agree with training on every factory trained:", ""]
    for kind in ("width", "depth"):
        ok = [f"{L:g}" for L in LIMITS if agree[kind, L]]
        lines.append(f"- {kind}: {', '.join(ok) if ok else 'none'}")
    return lines
