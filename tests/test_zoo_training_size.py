"""The real-size zoo (``tests/zoo_real.py``) at the batch a user's first training step feeds it: one
sequence of 512 tokens (2048 for the shallow models whose positions allow it), 8 images at 224 x 224,
5 s of audio. At its default init each model must give no warning, as at the zoo's short probe, and its
corrupted twin must still give its finding: a verdict must not change with the size of the probe."""
import gc

import pytest
import torch

from zoo_real import CLIPPING, LONG_TOKENS, RECIPES, TRAINING_TOKENS, ZOO, audit, build, training_batch

pytestmark = pytest.mark.slow  # real widths at training-size batches: about ten minutes on 2 cores

LONG = ["tinyllama", "qwen3", "gemma3", "mixtral", "opt", "pythia", "x_decoder", "gpt2"]
"""Models also probed at ``LONG_TOKENS`` (capped at their positions): their positions allow it and their
depth keeps the probe within a few GiB (the 32-layer Llama at 2048 tokens would hold 8 GiB of scores;
Mamba's sequential scan takes minutes on a CPU at 2048). T5 trains on 512 input tokens; at 2048 its first
encoder block gets IL006, a gradient spread that grows with the length (see IL006's doc)."""

CASES = [(name, TRAINING_TOKENS) for name in ZOO] + [(name, LONG_TOKENS) for name in LONG]


@pytest.mark.parametrize("name, tokens", CASES, ids=[f"{n}-{t}" for n, t in CASES])
def test_default_init_is_clean_and_the_corruption_found_at_training_size(name, tokens):
    import initlint

    model, _ = build(name)
    inputs = training_batch(name, model, tokens)
    try:
        report = initlint.audit(model, inputs)
        assert report.error is None
        assert [(f.code, f.module, f.message) for f in report.findings if f.severity != "info"] == []
        entry = ZOO[name]
        entry.corrupt(model)
        corrupted = initlint.audit(model, inputs)
        assert entry.expect in corrupted.codes(), (str(entry.corrupt), corrupted.codes())
    finally:
        del model, inputs
        gc.collect()


RECIPE_CASES = [(name, precision) for name in RECIPES for precision in (None, "bf16")] + [("resnet50", "fp16")]


@pytest.mark.parametrize("name, precision", RECIPE_CASES, ids=[f"{n}-{p or 'fp32'}" for n, p in RECIPE_CASES])
def test_published_recipe_audits_clean(name, precision):
    """Each model with the optimizer it was published with, at its peak learning rate (``optimizer=``) and with
    its gradient clipping where it has one, in float32 and with bf16 autocast (ResNet-50 also with fp16 and a
    GradScaler), at the zoo's probe batch."""
    label, optimizer = RECIPES[name]
    model, inputs = build(name)
    try:
        report = audit(model, inputs, optimizer=optimizer, precision=precision, grad_scaler=precision == "fp16",
                       clip_grad_norm=CLIPPING.get(name))
        assert report.error is None
        assert report.step is not None and report.step.stepped, label
        assert [(f.code, f.module, f.message) for f in report.findings if f.severity != "info"] == [], label
    finally:
        del model, inputs
        gc.collect()


def test_the_training_callbacks_let_a_default_llama_train_on_512_tokens():
    """``BatchAuditor`` (both training callbacks use it) audits the first training batch and, with its
    default ``fail_on="warning"``, stops the run on a warning: a TinyLlama-shaped model at default init on
    one sequence of 512 tokens trains, and its corrupted twin is stopped."""
    import logging

    from initlint.integrations._core import BatchAuditor, InitlintFailure

    model, _ = build("tinyllama")
    batch = training_batch("tinyllama", model)
    log = logging.getLogger("test")
    try:
        assert BatchAuditor("test").audit(model, batch, log) is not None
        ZOO["tinyllama"].corrupt(model)
        with pytest.raises(InitlintFailure):
            BatchAuditor("test").audit(model, batch, log)
    finally:
        del model, batch
        gc.collect()
