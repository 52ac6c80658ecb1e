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


TRAINER_RECIPES = ["gpt2", "vit", "resnet50"]


@pytest.mark.parametrize("name", TRAINER_RECIPES)
def test_a_published_recipe_trains_on_under_the_trainer_callback(name):
    """The user's own conditions end to end: a ``transformers.Trainer`` with the published optimizer under a
    warm-up and cosine schedule over 10,000 steps, the recipe's gradient clipping, and the first training batch
    (512 tokens; 8 images at 224 x 224). The callback audits the run's optimizer at the schedule's peak (its
    base lr; the optimizer holds 0 at that batch), and the run is not stopped."""
    pytest.importorskip("transformers")
    import tempfile

    from transformers import Trainer, TrainerCallback, TrainingArguments, get_scheduler
    from initlint.integrations.huggingface import InitlintTrainerCallback

    class OneStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = True

    model, _ = build(name)
    batch = training_batch(name, model)
    if "input_ids" in batch:
        rows = [{"input_ids": batch["input_ids"][0], "labels": batch["input_ids"][0]}]
    else:
        g = torch.Generator().manual_seed(0)
        rows = [{"pixel_values": image, "labels": torch.randint(0, 1000, (), generator=g)}
                for image in batch["pixel_values"]]
    label, make = RECIPES[name]
    optimizer = make(model)
    peak = optimizer.param_groups[0]["lr"]
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=2000, num_training_steps=10000)
    callback = InitlintTrainerCallback()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=10000, report_to=[], save_strategy="no",
                                 logging_strategy="no", use_cpu=True, per_device_train_batch_size=len(rows),
                                 disable_tqdm=True, dataloader_num_workers=0, seed=0,
                                 max_grad_norm=CLIPPING.get(name, 0.0))
        trainer = Trainer(model=model, args=args, train_dataset=rows, optimizers=(optimizer, scheduler),
                          callbacks=[callback, OneStep()])
        try:
            trainer.train()
            report = callback.report
            assert trainer.state.global_step == 1, label
            assert [(f.code, f.module, f.message) for f in report.findings if f.severity != "info"] == [], label
            assert report.step.stepped and [g.lr for g in report.step.groups] == [pytest.approx(peak)], label
            assert any("within its 10,000 steps" in n for n in report.notes)
            assert report.step.clipping.startswith("clipped to norm") == (name in CLIPPING)
        finally:
            del model, trainer
            gc.collect()
