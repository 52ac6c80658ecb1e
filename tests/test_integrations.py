"""Training-loop callbacks, run inside a real ``lightning.Trainer.fit`` and a real ``transformers.Trainer.train``.

Each framework gets a bad model (a Linear bias cancelled by the BatchNorm after it: IL002)
and a good one. The bad one must stop the run before any optimizer step, or train on with
the findings logged when ``fail_on=None``; the good one trains its two steps to exactly the
weights it reaches without the callback.
"""
from __future__ import annotations

import contextlib
import csv
import logging
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from initlint.integrations import InitlintFailure


def snapshot(model: nn.Module) -> Dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@contextlib.contextmanager
def records(name: str) -> Iterator[List[logging.LogRecord]]:
    """Log records of logger ``name`` (the frameworks' loggers do not propagate to pytest's caplog)."""
    got: List[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = got.append  # type: ignore[method-assign]
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.INFO)  # other tests may have quietened the framework's logging
    logger.addHandler(handler)
    try:
        yield got
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def mlp(bias: bool) -> nn.Sequential:
    """Linear -> BatchNorm1d -> ReLU -> Linear: with ``bias`` the first bias is cancelled exactly (IL002)."""
    return nn.Sequential(nn.Linear(16, 32, bias=bias), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))


def vectors(n: int = 64):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


# ----------------------------------------------------------------------------- Lightning
def lightning_run(tmp_path: Path, bias: bool, callback=None):
    pytest.importorskip("lightning")
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    class Lit(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(bias)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    model = Lit()
    before = snapshot(model)
    x, y = vectors()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, enable_checkpointing=False,
                        logger=CSVLogger(str(tmp_path)), enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[callback] if callback else [])
    error = None
    try:
        trainer.fit(model, loader)
    except InitlintFailure as exc:
        error = exc
    return model, before, trainer, error


def logged_metrics(tmp_path: Path) -> Dict[str, str]:
    (path,) = tmp_path.rglob("metrics.csv")
    rows = list(csv.DictReader(path.open()))
    return {k: v for row in rows for k, v in row.items() if k.startswith("initlint/") and v}


def test_lightning_callback_stops_a_bad_model_before_the_first_optimizer_step(tmp_path):
    pytest.importorskip("lightning")
    from initlint.integrations.lightning import InitlintCallback

    callback = InitlintCallback()
    with records("lightning.pytorch.callbacks.initlint") as logged:
        model, before, trainer, error = lightning_run(tmp_path, bias=True, callback=callback)
    assert error is not None and error.report.codes() == [("IL002", "net.0")]
    assert "stopped training before the first optimizer step" in str(error)
    assert trainer.global_step == 0 and same(snapshot(model), before)  # no optimizer step, model untouched
    assert [r.levelno for r in logged if r.levelno >= logging.WARNING] == [logging.WARNING]
    assert "IL002" in next(r for r in logged if r.levelno == logging.WARNING).getMessage()
    assert logged_metrics(tmp_path) == {"initlint/findings": "1.0", "initlint/failing": "1.0"}


def test_lightning_callback_warns_only_with_fail_on_none(tmp_path):
    pytest.importorskip("lightning")
    from initlint.integrations.lightning import InitlintCallback

    callback = InitlintCallback(fail_on=None)
    with records("lightning.pytorch.callbacks.initlint") as logged:
        model, before, trainer, error = lightning_run(tmp_path, bias=True, callback=callback)
    assert error is None and trainer.global_step == 2
    assert callback.report.codes() == [("IL002", "net.0")]
    assert [r.levelno for r in logged if r.levelno >= logging.WARNING] == [logging.WARNING]
    assert logged_metrics(tmp_path) == {"initlint/findings": "1.0", "initlint/failing": "0.0"}


def test_lightning_callback_passes_a_good_model_and_changes_nothing(tmp_path):
    pytest.importorskip("lightning")
    from initlint.integrations.lightning import InitlintCallback

    callback = InitlintCallback()
    model, _, trainer, error = lightning_run(tmp_path / "with", bias=False, callback=callback)
    assert error is None and trainer.global_step == 2
    assert callback.report is not None and callback.report.codes() == []
    plain, _, _, _ = lightning_run(tmp_path / "without", bias=False)
    assert same(snapshot(model), snapshot(plain))  # the audit left weights, buffers and the RNG as they were


# ----------------------------------------------------------------------------- Hugging Face
class VectorNet(nn.Module):
    """A model as ``Trainer`` expects one: keyword inputs, optional labels, a dict with the loss."""

    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.net = mlp(bias)

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": None if labels is None else F.cross_entropy(logits, labels), "logits": logits}


def hf_run(tmp_path: Path, model: nn.Module, rows: List[dict], callback=None, **arguments):
    """Train ``model`` two steps (``arguments``: other ``TrainingArguments``) with ``callback``: the weights before,
    the trainer and the ``InitlintFailure`` that stopped it, if one did."""
    pytest.importorskip("transformers")
    from transformers import Trainer, TrainingArguments

    settings = dict(output_dir=str(tmp_path), max_steps=2, report_to=[], save_strategy="no", logging_strategy="no",
                    use_cpu=True, per_device_train_batch_size=8, disable_tqdm=True, dataloader_num_workers=0, seed=0)
    args = TrainingArguments(**{**settings, **arguments})
    trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=[callback] if callback else [])
    before = snapshot(model)
    error = None
    try:
        trainer.train()
    except InitlintFailure as exc:
        error = exc
    return before, trainer, error


def vector_rows() -> List[dict]:
    x, y = vectors(32)
    return [{"x": x[i], "labels": y[i]} for i in range(len(x))]


def token_rows() -> List[dict]:
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, 100, (12,), generator=g), "attention_mask": torch.ones(12, dtype=torch.long),
             "labels": torch.randint(0, 2, (), generator=g)} for _ in range(32)]


def tiny_bert():
    pytest.importorskip("transformers")
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2)
    return BertForSequenceClassification(config)


def test_trainer_callback_stops_a_bad_model_before_the_first_optimizer_step(tmp_path):
    pytest.importorskip("transformers")
    from initlint.integrations.huggingface import InitlintTrainerCallback

    torch.manual_seed(0)
    model = VectorNet(bias=True)
    callback = InitlintTrainerCallback()
    with records("transformers.integrations.initlint") as logged:
        before, trainer, error = hf_run(tmp_path, model, vector_rows(), callback)
    assert error is not None and error.report.codes() == [("IL002", "net.0")]
    assert "stopped training before the first optimizer step" in str(error)
    assert trainer.state.global_step == 0 and same(snapshot(model), before)
    assert [r.levelno for r in logged if r.levelno >= logging.WARNING] == [logging.WARNING]
    assert "IL002" in next(r for r in logged if r.levelno == logging.WARNING).getMessage()
    assert not model._forward_pre_hooks  # the hook removed itself


def test_trainer_callback_warns_only_with_fail_on_none(tmp_path):
    pytest.importorskip("transformers")
    from initlint.integrations.huggingface import InitlintTrainerCallback

    torch.manual_seed(0)
    callback = InitlintTrainerCallback(fail_on=None)
    with records("transformers.integrations.initlint") as logged:
        _, trainer, error = hf_run(tmp_path, VectorNet(bias=True), vector_rows(), callback)
    assert error is None and trainer.state.global_step == 2
    assert callback.report.codes() == [("IL002", "net.0")]
    assert [r.levelno for r in logged if r.levelno >= logging.WARNING] == [logging.WARNING]


def test_trainer_callback_passes_a_good_transformers_model_and_changes_nothing(tmp_path):
    pytest.importorskip("transformers")
    from initlint.integrations.huggingface import InitlintTrainerCallback

    callback = InitlintTrainerCallback()
    model = tiny_bert()
    _, trainer, error = hf_run(tmp_path / "with", model, token_rows(), callback)
    assert error is None and trainer.state.global_step == 2
    assert callback.report is not None and callback.report.codes() == []
    plain = tiny_bert()
    hf_run(tmp_path / "without", plain, token_rows())
    assert same(snapshot(model), snapshot(plain))


def test_callbacks_reject_an_unknown_fail_on():
    pytest.importorskip("transformers")
    pytest.importorskip("lightning")
    from initlint.integrations.huggingface import InitlintTrainerCallback
    from initlint.integrations.lightning import InitlintCallback

    for cls in (InitlintCallback, InitlintTrainerCallback):
        with pytest.raises(ValueError, match="fail_on takes one of info, warning, error or None"):
            cls(fail_on="warn")


# ----------------------------------------------------------------------------- mixed precision, checkpointing
def recorded_precision_probes(monkeypatch) -> List[tuple]:
    """The ``(precision, grad_scaler)`` of every precision probe the audits run."""
    import initlint.api as api

    calls: List[tuple] = []
    probe = api._precision_probe

    def recording(cap, args, kwargs, precision, grad_scaler, *rest, **more):
        calls.append((precision, grad_scaler))
        return probe(cap, args, kwargs, precision, grad_scaler, *rest, **more)

    monkeypatch.setattr(api, "_precision_probe", recording)
    return calls


def test_trainer_callback_audits_a_bf16_run_through_its_own_forward_and_then_at_bf16(tmp_path, monkeypatch):
    """Accelerate wraps a bf16 run's forward in autocast: the audit measures the model's own forward (the
    statistics of an audit without the Trainer), and the run's precision with ``precision="bf16"``."""
    pytest.importorskip("transformers")
    import initlint
    from transformers import Trainer, TrainingArguments
    from initlint.integrations.huggingface import InitlintTrainerCallback

    model = tiny_bert()
    rows = token_rows()[:8]  # one batch: the Trainer's is these rows, in its own order
    batch = {k: torch.stack([row[k] for row in rows]) for k in ("input_ids", "attention_mask")}
    plain = initlint.audit(model, batch)
    calls = recorded_precision_probes(monkeypatch)
    callback = InitlintTrainerCallback()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to=[], save_strategy="no",
                             logging_strategy="no", use_cpu=True, bf16=True, per_device_train_batch_size=8,
                             disable_tqdm=True, dataloader_num_workers=0, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=[callback])
    trainer.train()
    assert "_original_forward" in vars(model) and vars(model)["forward"] is not vars(model)["_original_forward"]
    assert calls == [("bf16", False)]
    report = callback.report
    assert report.codes() == []
    # float32, as without the Trainer (under autocast they differ by 1.5e-5 and more)
    for name in ("maxprob", "entropy", "xent"):
        assert report.probe.logits[name] == pytest.approx(plain.probe.logits[name], rel=1e-6)
    assert report.probe.grads.keys() == plain.probe.grads.keys()


def test_trainer_callback_audits_a_run_with_gradient_checkpointing(tmp_path):
    pytest.importorskip("transformers")
    from initlint.integrations.huggingface import InitlintTrainerCallback

    callback = InitlintTrainerCallback()
    model = tiny_bert()
    model.config.hidden_dropout_prob = model.config.attention_probs_dropout_prob = 0.1
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with records("transformers.integrations.initlint") as logged:
        _, trainer, error = hf_run(tmp_path, model, token_rows(), callback)
    assert error is None and trainer.state.global_step == 2
    assert callback.report is not None and callback.report.codes() == []  # audited, not "could not audit"
    assert not [r for r in logged if r.levelno >= logging.WARNING]


def test_lightning_callback_audits_a_bf16_mixed_run_at_bf16(tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    import lightning as L
    from initlint.integrations.lightning import InitlintCallback

    calls = recorded_precision_probes(monkeypatch)

    class Lit(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(False)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    callback = InitlintCallback(module="net")
    x, y = vectors()
    trainer = L.Trainer(max_steps=1, accelerator="cpu", devices=1, precision="bf16-mixed", enable_checkpointing=False,
                        logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    trainer.fit(Lit(), torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16))
    assert calls == [("bf16", False)] and callback.report.codes() == []


def test_mixed_precision_settings_of_the_frameworks():
    from initlint.integrations._core import mixed_precision

    assert mixed_precision("bf16-mixed") == ("bf16", False)
    assert mixed_precision("16-mixed") == ("fp16", True)
    assert mixed_precision(16) == ("fp16", True)
    for full in ("32-true", "bf16-true", "16-true", "64-true", None):
        assert mixed_precision(full) is None


def test_trainer_callback_audits_a_compiled_run_outside_the_compiler(tmp_path, monkeypatch):
    """With ``torch_compile=True`` the model's hooks run in the frame dynamo traces: the audit must not be traced
    (it was, at the cost of a minute of recompilations for a tiny model)."""
    pytest.importorskip("transformers")
    import initlint.api as api
    from transformers import Trainer, TrainingArguments
    from initlint.integrations.huggingface import InitlintTrainerCallback

    compiling: List[bool] = []
    audit = api.audit

    def recording(*args, **kwargs):
        compiling.append(torch.compiler.is_compiling())
        return audit(*args, **kwargs)

    monkeypatch.setattr(api, "audit", recording)
    callback = InitlintTrainerCallback()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to=[], save_strategy="no",
                             logging_strategy="no", use_cpu=True, per_device_train_batch_size=8, disable_tqdm=True,
                             dataloader_num_workers=0, seed=0, torch_compile=True, torch_compile_backend="eager")
    trainer = Trainer(model=tiny_bert(), args=args, train_dataset=token_rows(), callbacks=[callback])
    trainer.train()
    assert compiling == [False] and callback.report.codes() == []


# ----------------------------------------------------------------------------- the run's optimizer
def hf_warmup_run(tmp_path: Path, lr: float, callback, warmup_steps: int = 4, max_steps: int = 6):
    model = tiny_bert()
    _, trainer, error = hf_run(tmp_path, model, token_rows(), callback, max_steps=max_steps, learning_rate=lr,
                               warmup_steps=warmup_steps)
    return model, trainer, error


def test_trainer_callback_judges_the_first_step_at_the_peak_of_the_runs_warm_up(tmp_path):
    """A Trainer's optimizer holds lr 0 at the first batch of a warm-up: the callback audits its first step at the
    rate the schedule reaches (lr 0.5 after 4 of 6 steps), stops the run on it, and changes nothing of the run."""
    pytest.importorskip("transformers")
    from initlint.integrations.huggingface import InitlintTrainerCallback

    callback = InitlintTrainerCallback()
    model, trainer, error = hf_warmup_run(tmp_path / "bad", 0.5, callback)
    assert error is not None and trainer.state.global_step == 0
    assert {code for code, _ in error.report.codes()} == {"IL015"}
    assert ("IL015", "classifier") in error.report.codes()
    assert [g.lr for g in error.report.step.groups] == [pytest.approx(0.5)] * 2
    assert any("highest learning rate the run's schedule reaches within its 6 steps (lr 0.5 for every param group, "
               "which holds 0 at this batch)" in n for n in error.report.notes)
    # the run's own optimizer is as the Trainer left it: lr 0 and no state
    assert [g["lr"] for g in trainer.optimizer.param_groups] == [0.0, 0.0] and not trainer.optimizer.state

    # the Trainer's default rate under the same warm-up: judged at its peak (5e-5), clean, and the run's weights
    # are those of the run without the callback
    callback = InitlintTrainerCallback()
    model, trainer, error = hf_warmup_run(tmp_path / "good", 5e-5, callback)
    assert error is None and trainer.state.global_step == 6
    assert callback.report.codes() == [] and callback.report.step.stepped
    assert [g.lr for g in callback.report.step.groups] == [pytest.approx(5e-5)] * 2
    assert callback.report.step.clipping.startswith("clipped to norm 1 ")  # the Trainer's max_grad_norm
    plain, _, _ = hf_warmup_run(tmp_path / "plain", 5e-5, None)
    assert same(snapshot(model), snapshot(plain))


def test_trainer_callback_says_the_first_step_averages_the_runs_accumulated_batches(tmp_path):
    """The batch audited is one of the ``gradient_accumulation_steps`` the Trainer's step averages: the audit gets
    ``batches_per_step`` of accumulation x ranks, whoever gives the optimizer, unless the settings give a number."""
    pytest.importorskip("transformers")
    from initlint.integrations.huggingface import InitlintTrainerCallback

    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=1e-3)
    for accumulation, settings, expected in ((4, {}, 4), (1, {}, 1), (4, {"batches_per_step": 2}, 2),
                                             (4, {"batches_per_step": None}, 4), (4, {"optimizer": sgd}, 4)):
        callback = InitlintTrainerCallback(**settings)
        _, trainer, error = hf_run(tmp_path / f"{accumulation}-{expected}", tiny_bert(), token_rows(), callback,
                                   gradient_accumulation_steps=accumulation, optim="sgd", learning_rate=1e-3)
        assert error is None and trainer.state.global_step == 2
        step = callback.report.step
        assert step.optimizer == "SGD" and step.linear and step.batches_per_step == expected
        assert (f"the run steps on the mean of {expected} such batches" in step.lines()[0]) == (expected > 1)


def test_the_runs_batches_per_step_counts_accumulation_and_data_parallel_ranks_only():
    """Ranks that split one batch (tensor, context, sequence parallel) are not batches of their own; values of a
    kind not foreseen count as 1 and never stop the run."""
    from types import SimpleNamespace
    from unittest.mock import Mock

    from initlint.integrations._core import run_batches

    pytest.importorskip("transformers")
    from initlint.integrations.huggingface import data_parallel_size

    parallel = SimpleNamespace(world_size=16, parallelism_config=SimpleNamespace(tp_size=2, cp_size=1, sp_size=2))
    assert data_parallel_size(parallel) == 4
    assert data_parallel_size(SimpleNamespace(world_size=4)) == 4
    assert data_parallel_size(object()) is None and data_parallel_size(Mock()) is None
    assert run_batches((4, data_parallel_size(parallel))) == 16
    assert run_batches((None, 0, -1, 2.5, float("nan"), float("inf"), "3", True, Mock(), 10 ** 400)) == 1
    assert run_batches((2 ** 19, 2 ** 19, 8)) == 2 ** 20


def test_trainer_callback_takes_no_first_step_with_optimizer_none(tmp_path):
    pytest.importorskip("transformers")
    from initlint.integrations.huggingface import InitlintTrainerCallback

    callback = InitlintTrainerCallback(optimizer=None)
    _, trainer, error = hf_warmup_run(tmp_path, 0.5, callback)
    assert error is None and trainer.state.global_step == 6
    assert callback.report.step is None and callback.report.codes() == []


def test_lightning_callback_judges_a_lambda_schedule_at_its_peak_over_the_audited_module(tmp_path):
    """A schedule whose rate lives in the factor (Adam at lr 1 under the Transformer paper's warm-up): judged at the
    factor's peak over the run, not at 1. With ``module="net"`` the first step covers the net's parameters only (the
    optimizer's other parameter is not the audited model's: no finding for it)."""
    pytest.importorskip("lightning")
    import lightning as L
    from initlint.integrations.lightning import InitlintCallback
    from initlint.rules.base import fmt

    def noam(step: int) -> float:
        return 2e-3 * min((step + 1) ** -0.5, (step + 1) * 3 ** -1.5)

    class Lit(L.LightningModule):
        def __init__(self, schedule: bool) -> None:
            super().__init__()
            self.net = mlp(False)
            self.temperature = nn.Parameter(torch.ones(()))
            self.schedule = schedule

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x) * self.temperature, y)

        def configure_optimizers(self):
            opt = torch.optim.Adam(self.parameters(), lr=1.0)
            if not self.schedule:
                return opt
            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, noam),
                                                       "interval": "step"}}

    reports = []
    for schedule in (True, False):
        torch.manual_seed(0)
        callback = InitlintCallback(fail_on=None, module="net")
        x, y = vectors()
        clip = {"gradient_clip_val": 0.5, "gradient_clip_algorithm": "value"} if schedule else {}
        trainer = L.Trainer(max_steps=5, accelerator="cpu", devices=1, enable_checkpointing=False, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
                            accumulate_grad_batches=3 if schedule else 1, **clip)
        trainer.fit(Lit(schedule), torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16))
        reports.append(callback.report)
    scheduled, constant = reports
    peak = max(noam(s) for s in range(5))  # step 2, the end of the warm-up
    assert [g.lr for g in scheduled.step.groups] == [pytest.approx(peak)] and scheduled.codes() == []
    assert scheduled.step.groups[0].tensors == len(list(Lit(True).net.parameters())) == 5  # not the temperature
    assert any(f"lr {fmt(peak)} for every param group, which holds {fmt(noam(0))} at this batch" in n
               for n in scheduled.notes)
    # the same init at the factor's base, lr 1: the last layer moves by far more than its size
    assert [g.lr for g in constant.step.groups] == [1.0] and ("IL015", "3") in constant.codes()
    assert scheduled.step.clipping == "clamped to +-0.5 (clip_grad_value_)" and constant.step.clipping == ""
    assert (scheduled.step.batches_per_step, constant.step.batches_per_step) == (3, 1)  # accumulate_grad_batches


SCHEDULES = {
    "warm-up": lambda o: S_().LinearLR(o, start_factor=0.01, total_iters=10),
    "warm-up longer than the run": lambda o: S_().LinearLR(o, start_factor=0.01, total_iters=1000),
    "constant factor longer than the run": lambda o: S_().ConstantLR(o, factor=0.25, total_iters=1000),
    "one cycle": lambda o: S_().OneCycleLR(o, max_lr=[0.4, 0.8], total_steps=50),
    "cyclic": lambda o: S_().CyclicLR(o, base_lr=0.01, max_lr=[0.3, 0.5], step_size_up=5),
    "cyclic, a rise longer than the run": lambda o: S_().CyclicLR(o, base_lr=0.01, max_lr=0.3, step_size_up=500),
    "warm-up then cosine": lambda o: S_().SequentialLR(
        o, [S_().LinearLR(o, 1e-3, total_iters=5), S_().CosineAnnealingLR(o, T_max=45)], milestones=[5]),
    "chained": lambda o: S_().ChainedScheduler([S_().LinearLR(o, 0.1, total_iters=5), S_().ExponentialLR(o, 0.9)]),
    "growing": lambda o: S_().ExponentialLR(o, 1.05),
    "doubling steps": lambda o: S_().StepLR(o, 10, gamma=2.0),
    "a factor on the base of 1": lambda o: S_().LambdaLR(o, lambda s: min(1.0, s / 1000) * 3e-4),
    "two factors": lambda o: S_().LambdaLR(o, [lambda s: min(1.0, s / 10), lambda s: 0.5 ** s]),
}


def S_():
    from torch.optim import lr_scheduler

    return lr_scheduler


@pytest.mark.parametrize("kind", list(SCHEDULES))
def test_schedule_peaks_equal_the_largest_rate_of_the_run_itself(kind):
    """Each scheduler's peak over a 50-step run is the largest lr the run's own optimizer holds when the schedule
    is stepped 49 times (warm-ups, cycles and factors longer than the run included), and reading it changes
    nothing of the run's optimizer or scheduler."""
    from initlint.integrations._core import schedule_peaks

    def optimizer():
        return torch.optim.SGD([{"params": [nn.Parameter(torch.zeros(2, 2))], "lr": lr} for lr in (1.0, 0.2)],
                               lr=1.0, momentum=0.9)

    o = optimizer()
    scheduler = SCHEDULES[kind](o)
    before = ([dict((k, v) for k, v in g.items() if k != "params") for g in o.param_groups], getattr(scheduler, "last_epoch", None))
    peaks, read = schedule_peaks(scheduler, 2, 50)
    assert ([dict((k, v) for k, v in g.items() if k != "params") for g in o.param_groups], getattr(scheduler, "last_epoch", None)) \
        == before and read == 50
    run = optimizer()
    stepped = SCHEDULES[kind](run)
    best = [g["lr"] for g in run.param_groups]
    for _ in range(49):
        run.step()
        stepped.step()
        best = [max(b, g["lr"]) for b, g in zip(best, run.param_groups)]
    assert peaks == [pytest.approx(b, rel=1e-9) for b in best]


def test_schedule_peaks_of_the_torch_schedulers():
    from torch.optim import lr_scheduler as S
    from initlint.integrations._core import RunOptimizer, schedule_peaks

    def opt(lr=0.1):
        return torch.optim.SGD([nn.Parameter(torch.zeros(2, 2))], lr=lr, momentum=0.9)

    o = opt()
    assert schedule_peaks(S.ReduceLROnPlateau(o), 1, 100)[0] == [None]  # wants a metric: the held rate stands
    # the view is the run's optimizer at the peak; the run's own is untouched
    o = opt(0.1)
    scheduler = S.LambdaLR(o, lambda s: s / 10)
    run = RunOptimizer(o, [scheduler], 20)
    assert run.optimizer.param_groups[0]["lr"] == pytest.approx(0.19) and o.param_groups[0]["lr"] == 0.0
    assert run.optimizer.param_groups[0]["params"][0] is o.param_groups[0]["params"][0]
    assert run.notes and "within its 20 steps" in run.notes[0]
    assert RunOptimizer(opt(), [], None).notes == []  # no schedule: the rate it holds, nothing to say


class ZeroLike:
    """DeepSpeed's ZeRO optimizer in shape: not a torch optimizer; it steps a torch optimizer over flat copies."""

    def __init__(self, model: nn.Module) -> None:
        self.flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
        self.optimizer = torch.optim.AdamW([self.flat], lr=1e-3)
        self.param_groups = self.optimizer.param_groups


def test_a_run_optimizer_unfit_for_the_audit_never_stops_the_run():
    """The run's own optimizer is left out, with a line in the log, when it holds none of the model's parameters
    (DeepSpeed's flat copies, a layer-wise stand-in), or when reading it fails; clipping given in the settings is
    then left out too. The audit itself goes on, and the run's optimizer is as it was."""
    from initlint.integrations._core import BatchAuditor, RunOptimizer, unwrapped_optimizer

    model, (x, _) = mlp(False), vectors(16)
    zero = ZeroLike(model)
    assert unwrapped_optimizer(zero) is zero.optimizer  # followed through the object that is not an optimizer
    log = logging.getLogger("initlint-test")
    for make, words in ((lambda: RunOptimizer(zero), "holds none of the model's parameters"),
                        (lambda: RunOptimizer(torch.optim.SGD([nn.Parameter(torch.zeros(3))], lr=0.1)),
                         "holds none of the model's parameters"),
                        (lambda: 1 / 0, "ZeroDivisionError"),
                        (lambda: RunOptimizer(object()), "holds no torch.optim.Optimizer")):
        with records("initlint-test") as logged:
            report = BatchAuditor("test", settings={"clip_grad_norm": 1.0}).audit(model, x, log, optimizer=make)
        assert report is not None and report.step is None and report.codes() == []
        text = [r.getMessage() for r in logged]
        assert any(words in t for t in text), text
        assert any("clip_grad_norm is not audited" in t for t in text), text
    assert zero.optimizer.param_groups[0]["lr"] == 1e-3 and not zero.optimizer.state


def test_the_callbacks_do_not_audit_a_model_loaded_from_a_checkpoint(tmp_path):
    """A fine-tuning run starts from pretrained weights, not an initialisation: judged as one, a trained model
    gets findings about its training (a confident head, weights off their declared init) that would stop the run.
    The callback logs that it does not audit it, and the run trains on (a model built from its config carries no
    checkpoint's mark, and is audited: the tests above)."""
    pytest.importorskip("transformers")
    from transformers import BertForSequenceClassification

    import initlint
    from initlint.integrations._core import checkpoint_share
    from initlint.integrations.huggingface import InitlintTrainerCallback

    trained = tiny_bert()  # a checkpoint: 150 steps of AdamW at 1e-3 on the rows
    rows = token_rows()
    ids, labels = torch.stack([r["input_ids"] for r in rows]), torch.stack([r["labels"] for r in rows])
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-3)
    for _ in range(150):
        opt.zero_grad()
        trained(input_ids=ids, labels=labels).loss.backward()
        opt.step()
    trained.save_pretrained(str(tmp_path / "checkpoint"))
    model = BertForSequenceClassification.from_pretrained(str(tmp_path / "checkpoint"))
    assert checkpoint_share(model) == (len(list(model.parameters())),) * 2
    assert checkpoint_share(tiny_bert())[0] == 0
    # judged as an initialisation, the trained model is loud (a confident head, a head "still at PyTorch's default")
    assert {code for code, _ in initlint.audit(model, {"input_ids": ids[:8]}).codes()} >= {"IL004", "IL014"}
    callback = InitlintTrainerCallback()
    with records("transformers.integrations.initlint") as logged:
        _, trainer, error = hf_run(tmp_path / "run", model, token_rows(), callback)
    assert error is None and trainer.state.global_step == 2 and callback.report is None
    assert any("was loaded from a checkpoint" in r.getMessage() for r in logged)


def test_the_callbacks_own_wrong_settings_stop_the_run_with_their_sentence():
    """A setting the audit refuses is the callback's own mistake: it is raised (UsageError), not logged as a model
    that could not be audited while training goes on."""
    from initlint.errors import UsageError
    from initlint.integrations._core import BatchAuditor

    auditor = BatchAuditor("TestCallback", settings={"seed": "not a seed"})
    with pytest.raises(UsageError, match="seed must be an integer"):
        auditor.audit(mlp(False), vectors()[0], logging.getLogger("test"))
