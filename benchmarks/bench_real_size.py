"""Audit time against a plain forward+backward on published models at full width and vocabulary.

    python benchmarks/bench_real_size.py [--set zoo|published] [--repeats 3] [--threads 1] [--models gpt2,t5]
                                         [--breakdown] [--batch N|training] [--image-size S|zoo] [--processes N]
                                         [--device cpu|cuda] [--tokens BxT] [--images N] [--clock wall|process]

``--set zoo`` (the default): every model of the real-size zoo (``tests/zoo_real.py``: GPT-2
124M at its 12 layers, a 32-layer Llama, T5-small, Swin-T, ... at their real widths and
vocabularies) on its own probe batch (2 x 16 tokens, ...), the batch initlint's tests audit them
with, and the six image models that take ``pixel_values`` (ResNet-50, ConvNeXt-T, DINOv2, Swin-T,
ViT, CLIP) on images of :data:`PUBLISHED_IMAGE_SIZE` (224 x 224, the side all six were published and
evaluated at on ImageNet). ``--image-size zoo`` gives them the zoo tests' own images instead
(ResNet-50 and ConvNeXt-T 64 x 64, DINOv2 112 x 112, cut for the tests' speed; the others 224);
``--image-size S`` squares of side S. ``--batch 16`` gives each zoo model 16 examples instead of 2
(the batch ``initlint check`` infers by default). ``--set published``: GPT-2 124M, BERT-base and a
Llama-style LM (``_common.REAL_SIZE``) at their full depth on 8 x 64 tokens.

``--batch training`` gives the models a batch of the size they train on instead (:data:`TRAINING_TOKENS`:
GPT-2 8 x 1024 tokens, the 32-layer Llama 4 x 512, BERT-base 16 x 512, Qwen3 4 x 512; every model that
takes ``pixel_values`` 32 images of 224 x 224); without ``--models`` it measures GPT-2, the Llama, BERT,
Qwen3, ViT, ResNet-50 and Swin-T. With it, ``--tokens 4x512`` gives every language model that many
sequences and tokens instead, and ``--images 8`` that many images (a machine without the memory for the
training batches: GPT-2's fwd+bwd at 8 x 1024 holds some 20 GiB on CPU). ``--device cuda`` moves each model and its batch to that device before
measuring (the fwd+bwd's cotangent is drawn there too, as the audit's is; each timed call waits for the
device's queued work before and after).

Each model is measured in a fresh process of its own, with glibc malloc's thresholds fixed
(:data:`ALLOCATOR`), so that its timings do not depend on the models measured before it. That
process measures, after one warm-up round and with the two taking turns in every repeat, the
median wall time of the following, each timed right after an untimed call of its own (``--settle``),
as a call in a loop runs: timed right after the audit, a forward+backward re-faulted gradient memory
that the audit never allocated, and the largest models' figures moved by up to 3x from run to run

* ``fwd+bwd``: a training-mode forward and ``torch.autograd.grad`` of a random cotangent at
  the main output with respect to every parameter (``_common.forward_backward``);
* ``audit``: ``initlint.audit(model, batch)`` with every rule.

``--processes N`` measures each model in N such processes, taken in turns over the set (the first
process of every model, then the second, ...), and gives the median of the N processes' ratios: on
this shared machine one process's ratio moves by 0.1-0.3 from the next one's (ResNet-50 at 224 x 224:
1.02, 1.28 and 1.31 in three processes of one run), so a single process cannot tell 1.25 from 1.35.

The table also gives ``audit - fwd+bwd`` in milliseconds: what the audit costs beyond the training
step it stands for; and ``first audit``, the model's first audit in its process (once, before the
rounds; see :func:`_first_audit`), against the median audit: what ``initlint check``, which audits
once, pays on top for what initlint does only once per process (imports aside).

``--breakdown`` adds, per model, the median over the repeats of each stage of the audit
as a fraction of fwd+bwd (see :class:`Stages`).

Goal: audit at most 1.1x fwd+bwd (median over the set), no model above 1.3x.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's initlint
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # the real-size zoo

import _common as C  # noqa: E402

GOAL_MEDIAN = 1.1
GOAL_MAX = 1.3

TRAINING_TOKENS = {"gpt2": (8, 1024), "llama32": (4, 512), "bert": (16, 512), "qwen3": (4, 512)}
"""``--batch training``: (sequences, tokens) of a training batch of each language model."""
TRAINING_IMAGES = 32
"""``--batch training``: images per batch of a model that takes ``pixel_values`` (224 x 224 unless
``--image-size`` says otherwise)."""
TRAINING_SET = ("gpt2", "llama32", "bert", "qwen3", "vit", "resnet50", "swin")

PUBLISHED_IMAGE_SIZE = 224
"""Side of the square images the zoo's ``pixel_values`` models get by default: ResNet-50, ConvNeXt-T, DINOv2,
Swin-T, ViT and CLIP were all published with ImageNet results at 224 x 224."""

STAGES = ("guard", "forward", "op stats", "backward", "grad stats", "weight stats", "duplicates", "rules", "other")


class Stages:
    """Wall time of the audit's stages, by wrapping the functions that run them:

    * ``guard``: the state guard's snapshot and restore (``guard._Saved``);
    * ``forward``: the capture's forward pass, less the statistics its observer takes;
    * ``op stats``: the per-op statistics (``StatsObserver``: rms, extremes, dead units,
      softmax, attention rows, token cosine; keeping the weight products' inputs);
    * ``backward``: ``torch.autograd.grad`` of the backward probe;
    * ``grad stats``: the gradients' norm and mean, of the formed gradients or from the weight products;
    * ``weight stats``: the weights' rms and extremes, and the biases' means;
    * ``duplicates``: the exact duplicate-unit check (keys on the device, candidates on the host);
    * ``rules``: the rules;
    * ``other``: the rest of the audit (capture set-up, input handling, the one transfer to the host, ...).
    """

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {s: 0.0 for s in STAGES}
        self._inner = 0.0  # time of nested stages, subtracted from the enclosing one

    def _timed(self, stage: str, fn: Callable[..., Any], subtract_nested: bool = False) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            nested_before = self._inner
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                own = spent - (self._inner - nested_before) if subtract_nested else spent
                self.seconds[stage] += own
                self._inner = nested_before + spent
        return wrapper

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        from initlint import api
        from initlint.probe import guard as guard
        from initlint.probe import run as probe
        from initlint.capture import fx, runtime

        patches: List[Tuple[Any, str, str, bool]] = [
            (guard._Saved, "__init__", "guard", False), (guard._Saved, "enter", "guard", False),
            (guard._Saved, "restore", "guard", False),
            (probe.StatsObserver, "__call__", "op stats", False), (probe.StatsObserver, "attention", "op stats", False),
            (probe.StatsObserver, "weight_product", "op stats", False), (probe, "_product_grads", "grad stats", False),
            (runtime.RuntimeCapture, "run", "forward", True), (fx.FxCapture, "run", "forward", True),
            (probe, "_duplicate_rows", "duplicates", False), (probe, "confirm_duplicates", "duplicates", False),
            (probe, "_param_stats", "weight stats", True), (api, "_run_rules", "rules", False),
        ]
        saved = [(owner, name, getattr(owner, name)) for owner, name, _, _ in patches]
        try:
            for owner, name, stage, nested in patches:
                setattr(owner, name, self._timed(stage, getattr(owner, name), nested))
            original_summarise, original_grad = probe.summarise, probe.torch.autograd.grad

            def summarise(c: Any, scope: str, *args: Any, **kwargs: Any) -> Any:
                stage = "grad stats" if scope == "grads" else "weight stats"
                return self._timed(stage, original_summarise, True)(c, scope, *args, **kwargs)

            probe.summarise = summarise
            probe.torch.autograd.grad = self._timed("backward", original_grad)
            yield
        finally:
            probe.summarise, probe.torch.autograd.grad = original_summarise, original_grad
            for owner, name, fn in saved:
                setattr(owner, name, fn)

    def measure(self, audit: Callable[[], Any]) -> Dict[str, float]:
        """Seconds per stage of one call of ``audit``."""
        self.seconds = {s: 0.0 for s in STAGES}
        self._inner = 0.0
        with self.installed():
            start = time.perf_counter()
            audit()
            total = time.perf_counter() - start
        self.seconds["other"] = total - sum(v for k, v in self.seconds.items() if k != "other")
        return dict(self.seconds)


def zoo_models(names: List[str], batch: Any, image_size: Optional[int] = None,
               tokens: Optional[Tuple[int, int]] = None,
               images_per_batch: Optional[int] = None) -> List[Tuple[str, Callable[[], Tuple[Any, C.Inputs]]]]:
    """Builders of the zoo's models and their probe batches: ``batch`` examples each, or ``"training"``
    (:data:`TRAINING_TOKENS`, :data:`TRAINING_IMAGES`, or ``tokens`` and ``images_per_batch`` given)."""
    import torch
    import zoo_real

    training = batch == "training"
    zoo_real.BATCH = zoo_real.BATCH if training else batch
    from initlint.inputs.load import infer_inputs, normalise_inputs

    def builder(name: str) -> Callable[[], Tuple[Any, C.Inputs]]:
        def build() -> Tuple[Any, C.Inputs]:
            torch.manual_seed(0)
            model, inputs = zoo_real.ZOO[name].build()
            gen = torch.Generator().manual_seed(0)
            if training and isinstance(inputs, dict) and "input_ids" in inputs and name in TRAINING_TOKENS:
                shape = tokens or TRAINING_TOKENS[name]
                inputs = {**inputs, "input_ids": torch.randint(0, model.config.vocab_size, shape, generator=gen)}
            if isinstance(inputs, dict) and "pixel_values" in inputs and (training or image_size is not None):
                images = inputs["pixel_values"]
                side = image_size or PUBLISHED_IMAGE_SIZE
                count = (images_per_batch or TRAINING_IMAGES) if training else images.shape[0]
                inputs = {**inputs, "pixel_values": torch.randn(count, images.shape[1], side, side, generator=gen)}
            # the batch the audit would infer (as the zoo tests do, batch_size=zoo_real.BATCH)
            pair = infer_inputs(model, zoo_real.BATCH, 0) if inputs is None else normalise_inputs(inputs)
            return model, pair
        return build

    return [(n, builder(n)) for n in (names or list(zoo_real.ZOO))]


def published_models(names: List[str]) -> List[Tuple[str, Callable[[], Tuple[Any, C.Inputs]]]]:
    return [(n, (lambda n=n: C.build(n))) for n in (names or list(C.REAL_SIZE))]


ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)}
"""glibc malloc as a long-running process settles: its dynamic mmap threshold rises, as large tensors
are freed, to at most 32 MiB, and the heap is trimmed past twice that. Fixed in each model's process:
left dynamic, where it stands depends on the tensors freed before, and the forward+backward's fresh
gradients cost page faults or not with it (T5-small: 64-85 thousand page faults per call, 350-430 ms
in a process of its own; 190 ms measured after the zoo's larger models in one process)."""


def _measure_here(name: str, opts: argparse.Namespace) -> Dict[str, Any]:
    """Build ``name``, audit it once, then time fwd+bwd and the audit in turns (and the stages)."""
    import torch

    import initlint

    import zoo_real

    build = dict(zoo_models([name], opts.batch or zoo_real.BATCH, opts.image_size, opts.tokens, opts.images)
                 if opts.model_set == "zoo"
                 else published_models([name]))[name]
    model, inputs = build()
    if opts.device != "cpu":
        from initlint.inputs.load import move_inputs

        model = model.to(opts.device)
        inputs = (move_inputs(inputs[0], torch.device(opts.device)), move_inputs(inputs[1], torch.device(opts.device)))
    first = _first_audit(model, inputs)
    report = initlint.audit(model, C.example(inputs))
    audit = (lambda: initlint.audit(model, C.example(inputs)))
    fns = {"fwd_bwd": (lambda: C.forward_backward(model, inputs)), "audit": audit}
    samples: List[Dict[str, float]] = []
    if opts.breakdown:
        stages = Stages()
        fns["breakdown"] = lambda: samples.append(stages.measure(audit))
    t = C.interleaved_medians(fns, opts.repeats, settle=opts.settle)
    samples = samples[-opts.repeats:]  # the warm-up round's sample is dropped
    return {"capture": report.capture, "warnings": sum(1 for f in report.findings if f.severity != "info"),
            "fwd_bwd": t["fwd_bwd"], "audit": t["audit"], "first": first,
            "stages": {k: statistics.median(s[k] for s in samples) for k in STAGES} if samples else {}}


def _first_audit(model: Any, inputs: C.Inputs) -> float:
    """Seconds of the model's first audit in its process, as ``initlint check`` runs one: after an audit of a
    two-layer MLP (so that initlint's modules are imported) and one forward+backward of the model (so
    that torch's own first-call costs are not counted)."""
    import torch

    import initlint

    initlint.audit(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()), torch.randn(4, 8))
    C.forward_backward(model, inputs)
    audit, example = initlint.audit, C.example(inputs)
    return C.timed(lambda: audit(model, example))


def _in_own_process(name: str, opts: argparse.Namespace) -> Dict[str, Any]:
    """:func:`_measure_here` in a fresh Python process with :data:`ALLOCATOR`, so that no model's timings
    depend on the models measured before it (the heap they left, the allocator's thresholds)."""
    argv = [sys.executable, os.path.abspath(__file__), "--worker", name, "--set", opts.model_set,
            "--repeats", str(opts.repeats), "--threads", str(opts.threads), "--settle", str(opts.settle),
            "--device", opts.device, "--clock", opts.clock]
    argv += ["--tokens", f"{opts.tokens[0]}x{opts.tokens[1]}"] if opts.tokens else []
    argv += ["--images", str(opts.images)] if opts.images else []
    argv += ["--breakdown"] if opts.breakdown else []
    argv += ["--batch", str(opts.batch)] if opts.batch is not None else []
    if opts.model_set == "zoo":
        argv += ["--image-size", str(opts.image_size) if opts.image_size is not None else "zoo"]
    env = dict(os.environ, **ALLOCATOR, INITLINT_NO_PROGRESS="1")
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"measuring {name} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _image_size(given: Optional[str], model_set: str) -> Optional[int]:
    """The side of the zoo's images from ``--image-size``: None for the zoo tests' own; raises ValueError."""
    if model_set != "zoo" or given == "zoo":
        return None
    if given is None:
        return PUBLISHED_IMAGE_SIZE
    side = int(given)
    if side < 1:
        raise ValueError(given)
    return side


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="model_set", choices=("zoo", "published"), default="zoo")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="", help="comma-separated names of the set (default: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--breakdown", action="store_true", help="also time the audit's stages")
    parser.add_argument("--batch", default=None,
                        help="examples per zoo model's probe batch (default: the zoo's own, 2), or 'training' "
                             "for training-size batches (see TRAINING_TOKENS)")
    parser.add_argument("--device", default="cpu", help="where the models and batches are (default cpu)")
    parser.add_argument("--tokens", default=None, help="with --batch training: BxT sequences x tokens for every "
                                                       "language model instead of its training batch")
    parser.add_argument("--images", type=int, default=None, help="with --batch training: images per batch")
    parser.add_argument("--clock", choices=sorted(C.CLOCKS), default="wall",
                        help="wall time, or this process's CPU time (steady on a shared machine; CPU only)")
    parser.add_argument("--image-size", default=None,
                        help="side of the square images of every zoo model that takes pixel_values, or 'zoo' "
                             f"for the zoo tests' own (default: {PUBLISHED_IMAGE_SIZE}, the published size)")
    parser.add_argument("--processes", type=int, default=1,
                        help="processes per model, taken in turns over the set; the ratio is their median "
                             "(default 1)")
    parser.add_argument("--settle", type=int, default=1,
                        help="untimed calls of each workload right before each timed one (default 1; see "
                             "_common.interleaved_medians)")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)  # one model, in this process; prints JSON
    opts = parser.parse_args()
    C.set_threads(opts.threads)
    C.set_clock(opts.clock)
    given_image_size = opts.image_size is not None
    if opts.tokens is not None:
        parts = opts.tokens.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            parser.error(f"--tokens takes BxT, e.g. 4x512, not {opts.tokens!r}")
        opts.tokens = (int(parts[0]), int(parts[1]))
    if (opts.tokens or opts.images) and opts.batch != "training":
        parser.error("--tokens and --images apply only with --batch training")
    if opts.batch is not None and opts.batch != "training":
        opts.batch = int(opts.batch) if opts.batch.isdigit() else 0
    try:
        opts.image_size = _image_size(opts.image_size, opts.model_set)
    except ValueError:
        parser.error(f"--image-size takes a positive number of pixels or 'zoo', not {opts.image_size!r}")
    import transformers

    transformers.logging.set_verbosity_error()
    if opts.worker:
        print(json.dumps(_measure_here(opts.worker, opts)))
        return
    import initlint

    names = [n for n in opts.models.split(",") if n]
    if opts.batch is not None and (opts.model_set != "zoo" or (opts.batch != "training" and opts.batch < 1)):
        parser.error("--batch takes a positive number of examples or 'training', and only with --set zoo")
    if opts.batch == "training" and not names:
        names = list(TRAINING_SET)
    if opts.settle < 0:
        parser.error("--settle takes a number of calls, 0 or more")
    if given_image_size and opts.model_set != "zoo":
        parser.error("--image-size applies only with --set zoo")
    if opts.processes < 1:
        parser.error("--processes takes a positive number of processes per model")
    import zoo_real

    known = list(zoo_real.ZOO) if opts.model_set == "zoo" else list(C.REAL_SIZE)
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"no model {', '.join(unknown)} in the {opts.model_set} set; it has {', '.join(known)}")
    print(f"machine: {C.machine()}")
    print(f"initlint from: {os.path.dirname(initlint.__file__)}")
    print(f"code: {C.revision()}")
    if opts.model_set == "zoo":
        if opts.batch == "training":
            sizes = {n: opts.tokens or bt for n, bt in TRAINING_TOKENS.items()}
            print("probe batch: training size, " + ", ".join(f"{n} {b} x {t} tokens" for n, (b, t) in sizes.items())
                  + f", {opts.images or TRAINING_IMAGES} images of {opts.image_size or PUBLISHED_IMAGE_SIZE} x "
                    f"{opts.image_size or PUBLISHED_IMAGE_SIZE}")
        else:
            print(f"probe batch: {opts.batch or zoo_real.BATCH} examples per model, "
                  + (f"images {opts.image_size}x{opts.image_size}" if opts.image_size else "the zoo tests' own images"))
    print(f"device: {opts.device}, {opts.clock} clock")
    print(f"each model in {opts.processes} process(es) of its own"
          + (", taken in turns over the set" if opts.processes > 1 else "")
          + ", glibc malloc: " + ", ".join(f"{k}={v}" for k, v in ALLOCATOR.items()))
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in (names or known)}
    for turn in range(opts.processes):
        for name, got in runs.items():
            one = _in_own_process(name, opts)
            got.append(one)
            print(f"  {name}{f' (process {turn + 1})' if opts.processes > 1 else ''}: fwd+bwd {C.ms(one['fwd_bwd'])} ms, "
                  f"audit {C.ms(one['audit'])} ms, {one['audit'] / one['fwd_bwd']:.2f}", flush=True)
    rows, ratios, parts = [], [], []
    for name, got in runs.items():
        each = [g["audit"] / g["fwd_bwd"] for g in got]
        ratio = statistics.median(each)
        ratios.append(ratio)
        mid = {k: statistics.median(g[k] for g in got) for k in ("fwd_bwd", "audit", "first")}
        first = statistics.median(g["first"] / g["audit"] for g in got)
        row = [name, got[0]["capture"], got[0]["warnings"], C.ms(mid["fwd_bwd"]), C.ms(mid["audit"]),
               C.ms(mid["audit"] - mid["fwd_bwd"]), f"{ratio:.2f}", C.ms(mid["first"]), f"{first:.2f}"]
        rows.append(row + ([" ".join(f"{r:.2f}" for r in each)] if opts.processes > 1 else []))
        if opts.breakdown:
            parts.append([name] + [f"{statistics.median(g['stages'][k] / g['fwd_bwd'] for g in got):.3f}"
                                   for k in STAGES])
    rows.append(["**median**", "", "", "", "", "", f"**{statistics.median(ratios):.2f}**", "", ""]
                + ([""] if opts.processes > 1 else []))
    print()
    print(f"Median of {opts.repeats} runs after a warm-up, milliseconds"
          + (f"; each figure the median over {opts.processes} processes, and the audit / fwd+bwd the median of "
             "the processes' own ratios (listed last)." if opts.processes > 1 else "."))
    print()
    print(C.table(["model", "capture", "warnings", "fwd+bwd", "audit", "audit - fwd+bwd", "audit / fwd+bwd",
                   "first audit", "first / audit"] + (["per process"] if opts.processes > 1 else []), rows))
    if parts:
        print()
        print("Stages of the audit, each as a fraction of fwd+bwd (median over the repeats"
              + (" and the processes):" if opts.processes > 1 else "):"))
        print()
        print(C.table(["model"] + list(STAGES), parts))
    print()
    median_met = statistics.median(ratios) <= GOAL_MEDIAN
    max_met = max(ratios) <= GOAL_MAX
    print(f"goal audit <= {GOAL_MEDIAN}x fwd+bwd (median): {'met' if median_met else 'MISSED'} "
          f"({statistics.median(ratios):.2f}); no model above {GOAL_MAX}x: {'met' if max_met else 'MISSED'} "
          f"(largest {max(ratios):.2f})")
    print(f"machine at the end: {C.machine()}")


if __name__ == "__main__":
    main()
