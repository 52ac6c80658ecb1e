"""Do the inits initlint flags train worse, and does ``initlint.fix`` repair that?

    python benchmarks/bench_trainability.py                # 2 processes x 1 torch thread
    python benchmarks/bench_trainability.py --steps 400 --seeds 3 --rows naive,hot
    python benchmarks/bench_trainability.py --rows randn --orthogonal --no-cost
    python benchmarks/bench_trainability.py --rows postnorm,gpt_mlp --zero-ends --no-cost

Every seed model is trained on one fixed synthetic task, five ways: as it is, after
``initlint.fix``, after ``lsuv`` (Mishkin & Matas's LSUV, the ``lsuv`` package), after
``anyinit`` (analytic mode) and with the textbook init (He for layers feeding a ReLU,
LeCun for tanh and for the output layer, zero biases, in the seed's own distribution
family: uniform for seed 004 and PyTorch's default init, normal for the ``randn`` seeds).
Same optimiser (Adam, lr 1e-3), batch (32), number of steps (200) and data order for every
column; the model's own draw, the data order and the fix's seed change with the seed.
Reported: the loss on a fixed held-out batch of 1024 after the last step, median over
seeds 0-19 (min-max in brackets).

The task: inputs N(0, 1) of the model's input shape; targets from a fixed random teacher
(Linear(d_in, 64), tanh, Linear(64, d_out), outputs standardised), regressed with MSE, or,
for classifiers, the teacher's argmax as the class (cross-entropy; ``nll_loss`` of the log
of the probabilities, clamped at 1e-12, for a model that returns probabilities).

The transformer rows (``gpt_qk``, ``gpt_mlp``, ``gpt_attn``: IL011, IL012, IL013) train a 4-block
GPT at GPT-2's init with one kind of weight drawn N(0, 1); their task gives every token of a
sequence a target from its own vector and the sequence's mean (MSE), and their textbook column
is GPT-2's init.

Benchmark-only dependencies, not in any extra of initlint: ``pip install lsuv anyinit``.
A missing one skips its column with the reason printed.

Sizes were cut so that the whole run takes minutes on 2 cores: seed 004's pyramids start at
320 units instead of 1000 (``examples/seed_models.py:narrow_pyramid``); the others are as in
``examples/``. It also measures what ``fix`` costs: the audits it ran and its time over one
audit's (median of 5, interleaved).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import io
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import initlint  # noqa: E402
from linear_stack import RandnStack  # noqa: E402
from naive_mlp import NaiveMLP  # noqa: E402
from seed_models import DeadConvNet, DefaultReluMLP, HotSoftmaxHead, PostNormResidualMLP, narrow_pyramid  # noqa: E402

COLUMNS = ("as is", "initlint.fix", "lsuv", "anyinit", "textbook")


@dataclass
class Row:
    key: str
    label: str
    build: Callable[[], nn.Module]
    input_shape: Tuple[int, ...]
    task: str  # "regression", "logits", "probs" or "tokens" (a regression target per token of a sequence)
    activation: str  # of the hidden layers, for the textbook init: relu, tanh or linear; gpt2 for a transformer
    family: str  # of the seed's own draws, kept by the textbook init: normal or uniform


# ------------------------------------------------------------------------------ transformer rows
SEQ, WIDTH, HEADS, DEPTH = 16, 64, 4, 4


class Block(nn.Module):
    """A pre-norm GPT block: fused q/k/v projection, SDPA, output projection; a GELU MLP."""

    def __init__(self, dim: int = WIDTH, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    """An input projection (the embedding's place: the residual stream starts at GPT-2's small scale),
    ``DEPTH`` blocks on a sequence of ``SEQ`` vectors of width ``WIDTH``, a linear head per token."""

    def __init__(self, d_out: int = 8) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.ln_f, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def gpt2_init(model: nn.Module) -> None:
    """GPT-2's init, the transformer's textbook one: N(0, 0.02) weights, the residual branches' last
    projections N(0, 0.02 / sqrt(2 * n_layer)), zero biases, LayerNorm at (1, 0)."""
    n_layer = sum(isinstance(m, Block) for m in model.modules())
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, nn.Linear):
                last = name.endswith(("proj", "fc2"))
                nn.init.normal_(m.weight, std=0.02 / math.sqrt(2 * n_layer) if last else 0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)


def tiny_gpt(corrupt: str) -> nn.Module:
    """TinyGPT at GPT-2's init with one corruption, each drawn N(0, 1) as a forgotten init would be: ``qk``
    the q/k/v projections (attention saturates, IL011); ``mlp_out`` block 2's MLP output projection (its
    branch dwarfs the stream, IL012); ``attn_out`` every attention output projection (the tokens collapse,
    IL013)."""
    model = TinyGPT()
    gpt2_init(model)
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            if corrupt == "qk":
                nn.init.normal_(block.qkv.weight, std=1.0)
            elif corrupt == "mlp_out" and i == 2:
                nn.init.normal_(block.fc2.weight, std=1.0)
            elif corrupt == "attn_out":
                nn.init.normal_(block.proj.weight, std=1.0)
    return model


ROWS = [
    Row("naive", "seed 000: 3-layer ReLU MLP, randn weights", NaiveMLP, (200,), "logits", "relu", "normal"),
    Row("pyr_lecun", "seed 004: 100-layer ReLU pyramid, LeCun", lambda: narrow_pyramid(100, "relu", "lecun"),
        (320,), "regression", "relu", "uniform"),
    Row("pyr_glorot", "seed 004: 100-layer ReLU pyramid, Glorot", lambda: narrow_pyramid(100, "relu", "glorot"),
        (320,), "regression", "relu", "uniform"),
    Row("pyr_tanh", "seed 004: 10-layer tanh pyramid, U(-1, 1)", lambda: narrow_pyramid(10, "tanh", "naive"),
        (320,), "regression", "tanh", "uniform"),
    Row("randn", "seed 002: 50-layer Linear stack, randn", RandnStack, (100,), "regression", "linear", "normal"),
    Row("default20", "20-layer ReLU MLP, PyTorch default init", DefaultReluMLP, (256,), "regression", "relu",
        "uniform"),
    Row("deadconv", "conv net, bias -4 (dead units)", DeadConvNet, (3, 16, 16), "regression", "relu", "uniform"),
    Row("hot", "softmax head x30", HotSoftmaxHead, (64,), "probs", "relu", "uniform"),
    Row("postnorm", "4 post-norm residual MLP blocks (width 128), branch ends 2.5x", PostNormResidualMLP, (16,),
        "regression", "relu", "normal"),
    Row("gpt_qk", "4-block GPT (width 64), q/k/v projections N(0, 1)", lambda: tiny_gpt("qk"), (SEQ, WIDTH),
        "tokens", "gpt2", "normal"),
    Row("gpt_mlp", "4-block GPT (width 64), block 2's MLP output N(0, 1)", lambda: tiny_gpt("mlp_out"), (SEQ, WIDTH),
        "tokens", "gpt2", "normal"),
    Row("gpt_attn", "4-block GPT (width 64), attention outputs N(0, 1)", lambda: tiny_gpt("attn_out"), (SEQ, WIDTH),
        "tokens", "gpt2", "normal"),
]


# ------------------------------------------------------------------------------ the task
class Task:
    """Fixed teacher and held-out batch for one row."""

    def __init__(self, row: Row, d_out: int) -> None:
        self.row = row
        gen = torch.Generator().manual_seed(12345)
        d_in = row.input_shape[-1] if row.task == "tokens" else math.prod(row.input_shape)
        self.w1 = torch.randn(d_in, 64, generator=gen) / math.sqrt(d_in)
        self.w2 = torch.randn(64, d_out, generator=gen) / math.sqrt(64)
        self.w_mix = torch.randn(d_in, 64, generator=gen) / math.sqrt(d_in)
        ref = self._raw(torch.randn(4096, *row.input_shape, generator=gen))
        self.mean, self.std = ref.mean(0), ref.std(0).clamp_min(1e-6)
        self.x_eval = torch.randn(1024, *row.input_shape, generator=torch.Generator().manual_seed(999))
        self.y_eval = self.target(self.x_eval)

    def _raw(self, x: torch.Tensor) -> torch.Tensor:
        if self.row.task == "tokens":  # each token's own vector and the sequence's mean: residual path and attention
            return torch.tanh(x @ self.w1 + x.mean(1, keepdim=True) @ self.w_mix) @ self.w2
        return torch.tanh(x.flatten(1) @ self.w1) @ self.w2

    def target(self, x: torch.Tensor) -> torch.Tensor:
        y = (self._raw(x) - self.mean) / self.std
        return y.argmax(-1) if self.row.task in ("logits", "probs") else y

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.row.task == "logits":
            return F.cross_entropy(out, y)
        if self.row.task == "probs":
            return F.nll_loss(out.clamp_min(1e-12).log(), y)
        return F.mse_loss(out, y)


def train(model: nn.Module, task: Task, seed: int, steps: int, batch: int) -> float:
    """Held-out loss after ``steps`` Adam steps (NaN when training diverged)."""
    gen = torch.Generator().manual_seed(1000 + seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(steps):
        x = torch.randn(batch, *task.row.input_shape, generator=gen)
        loss = task.loss(model(x), task.target(x))
        if not torch.isfinite(loss):
            return float("nan")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float(task.loss(model(task.x_eval), task.y_eval))


# ------------------------------------------------------------------------------ the inits
def orthogonal(model: nn.Module, activation: str) -> None:
    """The textbook gains with orthogonal matrices (``nn.init.orthogonal_``), zero biases."""
    layers = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    with torch.no_grad():
        for i, m in enumerate(layers):
            hidden = i < len(layers) - 1 and activation == "relu"
            nn.init.orthogonal_(m.weight, gain=math.sqrt(2.0) if hidden else 1.0)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def textbook(model: nn.Module, activation: str, family: str) -> None:
    """He for hidden layers feeding a ReLU, LeCun for tanh and for the output layer, zero biases; drawn in
    the seed's own family (seed 004's inits are uniform, PyTorch's default is uniform, randn is normal).
    A transformer row gets GPT-2's init."""
    if activation == "gpt2":
        gpt2_init(model)
        return
    layers = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    draw = nn.init.kaiming_uniform_ if family == "uniform" else nn.init.kaiming_normal_
    with torch.no_grad():
        for i, m in enumerate(layers):
            hidden = i < len(layers) - 1 and activation == "relu"
            draw(m.weight, nonlinearity="relu" if hidden else "linear")
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def peers() -> Dict[str, Optional[str]]:
    """Column -> reason it cannot run (None when it can)."""
    out: Dict[str, Optional[str]] = {}
    for name in ("lsuv", "anyinit"):
        try:
            __import__(name)
            out[name] = None
        except ImportError:
            out[name] = f"'{name}' is not installed (benchmark-only dependency: pip install lsuv anyinit)"
    return out


def initialise(column: str, model: nn.Module, row: Row, seed: int) -> Dict[str, Any]:
    """Apply ``column``'s init in place; return what it reports."""
    info: Dict[str, Any] = {}
    if column in ("initlint.fix", "fix, zero ends"):
        options = {"rule_options": {"IL012": {"zero-branch-ends": True}}} if column == "fix, zero ends" else {}
        rep = initlint.fix(model, seed=seed, **fix_options(row), **options)
        info.update(after=_codes(rep.after), audits=rep.audits, changes=len(rep.changes))
    elif column == "lsuv":
        import lsuv

        batch = torch.randn(64, *row.input_shape, generator=torch.Generator().manual_seed(2000 + seed))
        with contextlib.redirect_stdout(io.StringIO()):
            lsuv.lsuv_with_singlebatch(model, batch, verbose=False)
    elif column == "anyinit":
        import anyinit

        with contextlib.redirect_stdout(io.StringIO()):
            anyinit.initialize(model, "analytic", (8, *row.input_shape), seed=seed)
    elif column == "textbook":
        textbook(model, row.activation, row.family)
    elif column == "orthogonal":
        orthogonal(model, row.activation)
    return info


def fix_options(row: Row) -> Dict[str, Any]:
    """What ``audit`` and ``fix`` are told about the row's model: logits, and a sequence's probe shape."""
    options: Dict[str, Any] = {"logits": row.task == "logits"}
    if row.task == "tokens":
        options["input_shapes"] = [(8, *row.input_shape)]
    return options


def _codes(report: Any) -> str:
    codes = sorted({c for c, _ in report.codes() if c not in ("IL000", "IL010")})
    return ", ".join(codes) or "clean"


# ------------------------------------------------------------------------------ the cost of fix
def fix_cost(row: Row, repeats: int = 5) -> Tuple[int, float]:
    """(audits fix ran, median time of fix / median time of one audit), interleaved on fresh copies."""
    torch.manual_seed(0)
    base = row.build()
    options = fix_options(row)
    initlint.fix(copy.deepcopy(base), **options)  # warm-up: imports, first-call costs
    audit_t, fix_t, audits = [], [], 0
    for _ in range(repeats):
        model = copy.deepcopy(base)
        start = time.perf_counter()
        initlint.audit(model, **options)
        audit_t.append(time.perf_counter() - start)
        start = time.perf_counter()
        audits = initlint.fix(model, **options).audits
        fix_t.append(time.perf_counter() - start)
    return audits, statistics.median(fix_t) / statistics.median(audit_t)


# ------------------------------------------------------------------------------ the run
def cell(values: List[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "nan"
    med = statistics.median(values) if len(finite) == len(values) else float("nan")
    spread = f" ({min(finite):.3g}-{max(finite):.3g})" if len(finite) > 1 else ""
    nans = f", {len(values) - len(finite)} nan" if len(finite) < len(values) else ""
    return f"{med:.3g}{spread}{nans}" if math.isfinite(med) else f"nan ({len(finite)}/{len(values)} finite{spread})"


def run_seed(key: str, seed: int, steps: int, batch: int, columns: List[str], threads: int) -> Dict[str, Any]:
    """Train one row's model at one seed, every column; runs in a worker process."""
    torch.set_num_threads(threads)
    row = next(r for r in ROWS if r.key == key)
    torch.manual_seed(seed)
    base = row.build()
    out: Dict[str, Any] = {"losses": {}, "errors": {}}
    if seed == 0:
        out["findings"] = _codes(initlint.audit(base, **fix_options(row)))
    out["d_out"] = _output_dim(base, row)
    task = Task(row, out["d_out"])
    for column in columns:
        model = copy.deepcopy(base)
        torch.manual_seed(10_000 + seed)  # what a peer draws does not depend on the column order
        try:
            got = initialise(column, model, row, seed)
        except Exception as exc:  # a peer that cannot handle the model: its cell says so
            out["errors"][column] = f"{type(exc).__name__}: {exc}"
            out["losses"][column] = float("nan")
            continue
        if got:
            out.setdefault("fix", {})[seed] = got
        out["losses"][column] = train(model, task, seed, steps, batch)
    return out


def run_rows(rows: List[Row], seeds: int, steps: int, batch: int, columns: List[str], jobs: int,
             threads: int) -> Dict[str, Dict[str, Any]]:
    """Every (row, seed) on ``jobs`` worker processes; results gathered per row."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    work = [(row.key, seed) for row in rows for seed in range(seeds)]
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {item: pool.submit(run_seed, item[0], item[1], steps, batch, columns, threads) for item in work}
        done = {item: f.result() for item, f in futures.items()}
    out: Dict[str, Dict[str, Any]] = {}
    for row in rows:
        parts = [done[(row.key, seed)] for seed in range(seeds)]
        out[row.key] = {
            "results": {c: [p["losses"][c] for p in parts] for c in columns},
            "findings": parts[0].get("findings", "?"),
            "fix": [p["fix"][s] for s, p in enumerate(parts) if s in p.get("fix", {})],
            "errors": {c: e for p in parts for c, e in p["errors"].items()},
            "d_out": parts[0]["d_out"],
        }
    return out


def _output_dim(model: nn.Module, row: Row) -> int:
    with torch.no_grad():
        return int(copy.deepcopy(model)(torch.zeros(2, *row.input_shape)).shape[-1])


def baseline(row: Row, d_out: int) -> float:
    """The loss of a model that learned nothing: MSE 1 (standardised targets), ln(classes) for classifiers."""
    return math.log(d_out) if row.task in ("logits", "probs") else 1.0


def verdict(row: Row, res: Dict[str, List[float]], d_out: int) -> str:
    """The goal's ratios, and whether the unfixed model learned less than the textbook one.

    "Learned" is the drop below the loss of a constant prediction: with losses near that
    baseline, a 10% difference in loss can hide a model that learned nothing."""
    med = {c: statistics.median(v) if all(math.isfinite(x) for x in v) else float("inf") for c, v in res.items()}
    fix, book, asis, base = med["initlint.fix"], med["textbook"], med["as is"], baseline(row, d_out)
    parts = [f"fix/textbook {fix / book:.2f}" if math.isfinite(fix) and book > 0 else "fix/textbook n/a"]
    for peer in ("lsuv", "anyinit"):
        if peer in med and math.isfinite(fix):
            parts.append(f"fix/{peer} {fix / med[peer]:.2f}" if math.isfinite(med[peer]) and med[peer] > 0
                         else f"{peer} diverged on some seed")
    learned = {c: base - v for c, v in med.items()}
    if learned["textbook"] < 0.05 * base:
        parts.append(f"even the textbook init learns nothing in these steps (a constant prediction scores "
                     f"{base:.3g}): the row does not separate the inits")
    elif not math.isfinite(asis):
        parts.append("the unfixed model diverges")
    else:
        share = max(learned["as is"], 0.0) / learned["textbook"]
        parts.append(f"the unfixed model learns {100 * share:.0f}% of what the textbook one learns"
                     + (": the finding did not hurt training here" if share >= 0.9 else ""))
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--rows", default=",".join(r.key for r in ROWS), help="comma-separated row keys")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (one per core)")
    parser.add_argument("--no-cost", action="store_true", help="skip the measurement of fix's cost")
    parser.add_argument("--orthogonal", action="store_true",
                        help="add a column: the textbook gains with orthogonal matrices (what lsuv starts from)")
    parser.add_argument("--zero-ends", action="store_true",
                        help="add a column: initlint.fix with IL012's zero-branch-ends option")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    skip = peers()
    for column, reason in skip.items():
        if reason:
            print(f"skipping column {column}: {reason}")
    wanted = [r for r in ROWS if r.key in args.rows.split(",")]
    start = time.perf_counter()
    print(f"Adam lr 1e-3, batch {args.batch}, {args.steps} steps, seeds 0..{args.seeds - 1}, "
          f"torch {torch.__version__}, {args.jobs} process(es) x {args.threads} thread(s); "
          f"held-out loss, median (min-max)\n")
    cols = [c for c in COLUMNS if not skip.get(c)] + (["orthogonal"] if args.orthogonal else []) \
        + (["fix, zero ends"] if args.zero_ends else [])
    results = run_rows(wanted, args.seeds, args.steps, args.batch, cols, args.jobs, args.threads)
    print("| seed model | findings (unfixed) | " + " | ".join(cols) + " | after fix |")
    print("|---|---|" + "---|" * len(cols) + "---|")
    notes = []
    for row in wanted:
        out = results[row.key]
        after = sorted({f["after"] for f in out["fix"]}) or ["?"]
        print(f"| {row.label} | {out['findings']} | " + " | ".join(cell(out["results"][c]) for c in cols)
              + f" | {'; '.join(after)} |")
        notes.append(f"- {row.label}: {verdict(row, out['results'], out['d_out'])}")
        for column, error in out["errors"].items():
            notes.append(f"  - {column} failed: {error}")
    print("\n" + "\n".join(notes))
    if not args.no_cost:
        print("\n| seed model | audits run by fix | fix time / one audit |\n|---|---|---|")
        for row in wanted:
            audits, ratio = fix_cost(row)
            print(f"| {row.label} | {audits} | {ratio:.2f} |", flush=True)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
