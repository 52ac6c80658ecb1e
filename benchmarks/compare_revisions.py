"""Audit a fixed corpus of models at two revisions and compare the findings and figures.

    python benchmarks/compare_revisions.py BASE [HEAD]      # HEAD: the working tree

Each revision is checked out in a temporary ``git worktree add --detach`` (the working tree
is used as it is) and audits the corpus below in a subprocess with ``PYTHONPATH`` set to that
tree and one torch thread, dumping JSON; the two dumps are then compared model by model.

The corpus: every model the CLI finds in ``examples/`` (audited as ``initlint check`` would),
seed 004's pyramid grid, every rule's bad and good examples, and published architectures at
their real width and vocabulary with their depth cut to two layers. Models that a tree
defines itself (the example files and the rules' examples) come from that tree, so a change
to them shows up as a difference.

Per model it records each finding as (code, module, severity, value, threshold, members), the
audit's error and capture backend, and figures from the probe: the rms of every op's output,
keyed by (module, kind, ordinal among that module's ops of that kind) so that renumbered op
ids do not matter, the rms of every weight and of every gradient the probe measured.

Exit code 0 when every model has the same findings and every figure agrees within ``--rtol``
(the audit is deterministic on CPU with fixed seeds, so the default asks for bit-identical
figures), 1 otherwise, 2 when a revision is not a commit or its corpus could not be run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
Record = Dict[str, Any]
Builder = Callable[[], Tuple[Any, Any, Dict[str, Any]]]
"""A zero-argument callable returning ``(model, example_inputs or None, audit options)``."""


# ------------------------------------------------------------------ the corpus (runs in the child)
def _ids(vocab: int, batch: int = 2, length: int = 16) -> Any:
    import torch

    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


def _image(*shape: int) -> Any:
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _transformers() -> Any:
    import transformers as tf

    tf.logging.set_verbosity_error()
    return tf


def gpt2() -> Tuple[Any, Any, Dict[str, Any]]:
    tf = _transformers()
    return tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2)), {"input_ids": _ids(50257)}, {}


def bert() -> Tuple[Any, Any, Dict[str, Any]]:
    tf = _transformers()
    return tf.BertModel(tf.BertConfig(num_hidden_layers=2)), {"input_ids": _ids(30522)}, {}


def llama() -> Tuple[Any, Any, Dict[str, Any]]:
    # TinyLlama's layout (hidden 2048, SwiGLU 5632, 32 heads over 4 KV heads, vocabulary 32000), 2 layers
    tf = _transformers()
    config = tf.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=2, num_attention_heads=32,
                            num_key_value_heads=4, vocab_size=32000)
    return tf.LlamaForCausalLM(config), {"input_ids": _ids(32000)}, {}


def t5() -> Tuple[Any, Any, Dict[str, Any]]:
    tf = _transformers()
    config = tf.T5Config(d_model=512, d_ff=2048, num_layers=2, num_heads=8, d_kv=64, vocab_size=32128)
    return tf.T5ForConditionalGeneration(config), {"input_ids": _ids(32128), "decoder_input_ids": _ids(32128)}, {}


def vit() -> Tuple[Any, Any, Dict[str, Any]]:
    tf = _transformers()
    return tf.ViTModel(tf.ViTConfig(num_hidden_layers=2)), _image(1, 3, 224, 224), {}


def unet() -> Tuple[Any, Any, Dict[str, Any]]:
    import torch
    from diffusers import UNet2DModel

    # google/ddpm-cifar10-32's layout at a quarter of its channels
    model = UNet2DModel(sample_size=32, in_channels=3, out_channels=3, layers_per_block=1,
                        block_out_channels=(32, 64, 64, 64),
                        down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
                        up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"))
    return model, {"sample": _image(2, 3, 32, 32), "timestep": torch.tensor([10, 500])}, {}


ARCHITECTURES: Dict[str, Builder] = {"gpt2": gpt2, "bert": bert, "llama": llama, "t5": t5, "vit": vit, "unet": unet}
LOGITS_EXAMPLES = ("NaiveMLP", "KaimingMLP")
"""Example models whose output the example tests also audit as logits."""


def example_models(tree: str) -> Iterator[Tuple[str, Builder]]:
    """The models ``initlint check`` finds in each file of ``examples/`` (none needing arguments)."""
    from initlint.inputs.load import resolve

    folder = os.path.join(tree, "examples")
    for filename in sorted(os.listdir(folder)):
        if not filename.endswith(".py"):
            continue
        try:
            candidates = resolve(os.path.join(folder, filename))
        except Exception:  # a file without models (pyramid.py: its grid is below)
            continue
        for cand in candidates:
            if cand.required_args():
                continue
            yield f"examples/{filename}:{cand.name}", lambda c=cand: (c.instantiate(), None, {})
            if cand.name in LOGITS_EXAMPLES:
                yield f"examples/{filename}:{cand.name} logits", lambda c=cand: (c.instantiate(), None, {"logits": True})


def pyramid_models(tree: str) -> Iterator[Tuple[str, Builder]]:
    """Seed 004's grid: 10 and 100 layers, tanh and ReLU, four inits."""
    sys.path.insert(0, os.path.join(tree, "examples"))
    from pyramid import INITS, pyramid

    for depth in (10, 100):
        for act in ("tanh", "relu"):
            for init in INITS:
                yield f"pyramid {depth} {act} {init}", lambda d=depth, a=act, i=init: (pyramid(d, a, i), None, {})


def rule_examples(tree: str) -> Iterator[Tuple[str, Builder]]:
    """Every registered rule's bad and good examples, with the options they are shown with."""
    from initlint.rules import all_rules

    for code, rule in all_rules().items():
        for kind in ("bad", "good"):
            for i, example in enumerate(getattr(rule, kind, ())):
                def build(ex: Any = example) -> Tuple[Any, Any, Dict[str, Any]]:
                    model, inputs = ex.model()
                    return model, inputs, dict(ex.options)

                yield f"{code} {kind}{i} {example.build.__name__}", build


def architectures(tree: str) -> Iterator[Tuple[str, Builder]]:
    yield from ARCHITECTURES.items()


def corpus(tree: str) -> Iterator[Tuple[str, Builder]]:
    """Every model to audit; a part of the corpus that cannot be listed at this tree is one crashed entry."""
    for part in (example_models, pyramid_models, rule_examples, architectures):
        try:
            yield from part(tree)
        except Exception as exc:
            def crash(exc: Exception = exc) -> Any:
                raise exc

            yield f"{part.__name__} (listing)", crash


# ------------------------------------------------------------------ what is recorded per model
def _num(x: Any) -> Optional[float]:
    if x is None:
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _rms(stats: Any) -> Optional[float]:
    """The ``rms`` of a typed record, or of a plain dict of statistics."""
    if stats is None:
        return None
    if isinstance(stats, dict):
        return _num(stats.get("rms"))
    return _num(getattr(stats, "rms", None))


def _findings(report: Any) -> List[List[Any]]:
    out = []
    for f in getattr(report, "findings", None) or []:
        members = sorted(str(m) for m in getattr(f, "members", None) or [])
        out.append([f.code, f.module, f.severity, _num(f.value), _num(f.threshold), members])
    return sorted(out, key=lambda row: (row[0], row[1], row[2], repr(row[3:])))


def _figures(report: Any) -> Dict[str, Optional[float]]:
    probe, graph = getattr(report, "probe", None), getattr(report, "graph", None)
    figures: Dict[str, Optional[float]] = {}
    if probe is None:
        return figures
    ops = getattr(probe, "ops", None) or {}
    seen: Dict[Tuple[str, str], int] = {}
    for op in (graph if graph is not None else []):
        where = (op.module, op.kind)
        n = seen[where] = seen.get(where, -1) + 1
        figures[f"op {op.module or '<root>'} {op.kind}#{n} rms"] = _rms(ops.get(op.id))
    for table, label in (("params", "weight"), ("grads", "grad")):
        for name, stats in (getattr(probe, table, None) or {}).items():
            figures[f"{label} {name} rms"] = _rms(stats)
    return figures


def record(build: Builder) -> Record:
    import torch

    import initlint

    torch.manual_seed(0)
    try:
        model, inputs, options = build()
        report = initlint.audit(model, inputs, **options)
    except Exception as exc:  # recorded, so that the other revision's outcome is compared with it
        return {"outcome": {"crash": f"{type(exc).__name__}: {exc}"}, "findings": [], "figures": {}}
    outcome = {"error": getattr(report, "error", None), "capture": getattr(report, "capture", None)}
    return {"outcome": outcome, "findings": _findings(report), "figures": _figures(report)}


def dump(tree: str, path: str, verbose: bool) -> None:
    """Audit the corpus with the initlint of ``tree`` (on PYTHONPATH) and write the JSON to ``path``."""
    import warnings

    import torch

    import initlint

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    loaded = os.path.realpath(initlint.__file__)
    if not loaded.startswith(os.path.realpath(tree) + os.sep):
        raise SystemExit(f"initlint was imported from {loaded}, not from {tree}")
    models: Dict[str, Record] = {}
    for name, build in corpus(tree):
        start = time.perf_counter()
        models[name] = record(build)
        if verbose:
            print(f"  {name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    with open(path, "w") as fh:
        json.dump({"initlint": loaded, "models": models}, fh)


# ------------------------------------------------------------------ revisions (the parent)
def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout.strip()


def commit_of(repo: str, rev: str) -> Optional[str]:
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        return None


def run_corpus(repo: str, rev: Optional[str], label: str, out: str, verbose: bool) -> float:
    """Audit the corpus at ``rev`` (None: the working tree) into ``out``; seconds taken."""
    scratch = tempfile.mkdtemp(prefix="initlint-rev-") if rev else None
    tree = os.path.join(scratch, "tree") if scratch else repo
    try:
        if scratch:
            git(repo, "worktree", "add", "--detach", tree, rev)
        env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1"}
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--dump", out, "--tree", tree]
                              + (["--verbose"] if verbose else []), cwd=tree, env=env,
                              stderr=None if verbose else subprocess.PIPE, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or "").strip().splitlines()[-15:])
            raise SystemExit(f"the corpus could not be run at {label} (exit {proc.returncode}):\n{tail}")
        return time.perf_counter() - start
    finally:
        if scratch:
            subprocess.run(["git", "-C", repo, "worktree", "remove", "--force", tree], capture_output=True)
            subprocess.run(["git", "-C", repo, "worktree", "prune"], capture_output=True)
            if os.path.isdir(scratch):
                os.rmdir(scratch)


# ------------------------------------------------------------------ the comparison
def rel_diff(a: Optional[float], b: Optional[float]) -> float:
    """|a - b| / max(|a|, |b|); 0 when equal (NaN equals NaN), inf when only one is measured or finite."""
    if a is None or b is None:
        return 0.0 if a is b else math.inf
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _show(row: List[Any]) -> str:
    code, module, severity, value, threshold, members = row
    extra = f" members={','.join(members)}" if members else ""
    return f"{code} {module or '<root>'} {severity} value={value!r} threshold={threshold!r}{extra}"


def compare_findings(base: List[List[Any]], head: List[List[Any]], rtol: float) -> List[str]:
    """Lines naming each finding that differs: only on one side, or with another value or threshold."""
    lines: List[str] = []
    rest = list(head)
    for row in base:
        match = next((h for h in rest if h[:3] == row[:3] and h[5] == row[5]
                      and rel_diff(h[3], row[3]) <= rtol and rel_diff(h[4], row[4]) <= rtol), None)
        if match is None:
            lines.append(f"    - {_show(row)}")
        else:
            rest.remove(match)
    lines += [f"    + {_show(row)}" for row in rest]
    return lines


def compare_model(base: Record, head: Record, rtol: float) -> Tuple[bool, int, float, List[str]]:
    """(findings identical, figures compared, largest relative difference, lines to print)."""
    lines = [f"    outcome {k}: {base['outcome'].get(k)!r} -> {head['outcome'].get(k)!r}"
             for k in sorted(set(base["outcome"]) | set(head["outcome"]))
             if base["outcome"].get(k) != head["outcome"].get(k)]
    lines += compare_findings(base["findings"], head["findings"], rtol)
    same = not lines
    bf, hf = base["figures"], head["figures"]
    measured = [k for k in set(bf) & set(hf) if bf[k] is not None or hf[k] is not None]
    diffs = sorted(((rel_diff(bf[k], hf[k]), k) for k in measured), reverse=True)
    worst = diffs[0][0] if diffs else 0.0
    lines += [f"    figure {k}: {bf[k]!r} -> {hf[k]!r} (relative {d:.3g})" for d, k in diffs[:5] if d > rtol]
    for side, mine, other in (("BASE", bf, hf), ("HEAD", hf, bf)):
        missing = sorted(set(other) - set(mine))
        if missing:
            lines.append(f"    {_count(len(missing), 'figure')} missing at {side}: {', '.join(missing[:3])}"
                         + (" ..." if len(missing) > 3 else ""))
            worst = math.inf
    return same, len(diffs), worst, lines


def compare(base: Dict[str, Record], head: Dict[str, Record], rtol: float) -> bool:
    """Print one summary per model and the final line; True when nothing differs."""
    all_same, figures, worst, worst_at = True, 0, 0.0, ""
    names = list(base) + [n for n in head if n not in base]
    for name in names:
        if name not in base or name not in head:
            print(f"{name}: only audited at {'HEAD' if name in head else 'BASE'}")
            all_same = False
            continue
        same, n, diff, lines = compare_model(base[name], head[name], rtol)
        figures += n
        if diff > worst or not worst_at:
            worst, worst_at = diff, name
        if same:
            print(f"{name}: same findings; {_count(n, 'figure')}, max relative difference {diff:.3g}")
        else:
            print(f"{name}: findings differ; {_count(n, 'figure')}, max relative difference {diff:.3g}")
        for line in lines:
            print(line)
        all_same = all_same and same
    ok = all_same and worst <= rtol
    print(f"{len(names)} models compared; findings {'identical' if all_same else 'DIFFER'}; {figures} figures "
          f"compared, largest relative difference {worst:.3g}{f' ({worst_at})' if worst else ''} "
          f"(rtol {rtol:g}); exit {0 if ok else 1}")
    return ok


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", nargs="?", help="the revision to compare against (a commit, branch or tag)")
    ap.add_argument("head", nargs="?", help="the revision to compare (default: the working tree)")
    ap.add_argument("--rtol", type=float, default=1e-6, help="largest relative difference of a figure or a "
                    "finding's value that counts as equal (default 1e-6)")
    ap.add_argument("--keep", metavar="DIR", help="write the two JSON dumps to DIR")
    ap.add_argument("--verbose", action="store_true", help="show each model's audit time")
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.dump:
        dump(args.tree, args.dump, args.verbose)
        return 0
    if args.base is None:
        ap.print_usage(sys.stderr)
        print("compare_revisions.py: name the BASE revision to compare against", file=sys.stderr)
        return 2
    if not args.rtol >= 0:
        print(f"compare_revisions.py: --rtol must be a number >= 0, not {args.rtol}", file=sys.stderr)
        return 2
    repo = git(HERE, "rev-parse", "--show-toplevel")
    revs: List[Tuple[str, Optional[str]]] = []
    for rev in (args.base, args.head):
        commit = commit_of(repo, rev) if rev is not None else None
        if rev is not None and commit is None:
            print(f"compare_revisions.py: '{rev}' is not a commit of {repo}", file=sys.stderr)
            return 2
        revs.append((rev or "the working tree", commit))
    with tempfile.TemporaryDirectory(prefix="initlint-compare-") as tmp:
        out = args.keep or tmp
        os.makedirs(out, exist_ok=True)
        dumps = []
        for (label, commit), side in zip(revs, ("base", "head")):
            path = os.path.join(out, f"{side}.json")
            try:
                seconds = run_corpus(repo, commit, label, path, args.verbose)
            except SystemExit as exc:
                print(f"compare_revisions.py: {exc}", file=sys.stderr)
                return 2
            with open(path) as fh:
                dumps.append(json.load(fh)["models"])
            shown = f"{label} ({commit[:7]})" if commit and not commit.startswith(label) else label
            print(f"{side.upper()} = {shown}: {len(dumps[-1])} models audited in {seconds:.0f} s", flush=True)
        return 0 if compare(dumps[0], dumps[1], args.rtol) else 1


if __name__ == "__main__":
    sys.exit(main())
