"""A Lightning callback that audits the model on the first training batch.

::

    import lightning as L
    from initlint.integrations.lightning import InitlintCallback

    trainer = L.Trainer(callbacks=[InitlintCallback(fail_on="warning")])
    trainer.fit(model, datamodule)

On the first training batch (after the batch reached the model's device, before the first
``training_step`` and so before any optimizer step) the callback runs
``initlint.audit(module, inputs)``, where ``inputs`` is ``inputs(batch)`` when given, else the
first element of an ``(x, y)`` batch, a dict batch without its labels, or the batch itself.
``module`` is the LightningModule, or its attribute named by ``module="net"`` when the
network lives there. The findings are logged through Lightning's logger and, as counts, to
every logger of the trainer (``initlint/findings``, ``initlint/failing``). A finding at or
above ``fail_on`` stops the run with :class:`~initlint.integrations.InitlintFailure`;
``fail_on=None`` only logs. A model that cannot be audited on that batch is logged as a
warning and training goes on; a run resumed from a checkpoint (global step above 0) is not
audited, since the model is no longer at its initialisation, nor is a model loaded from a checkpoint
(parameters marked by transformers' ``from_pretrained``). A trainer with mixed precision
(``precision="bf16-mixed"`` or ``"16-mixed"``) gets the audit's ``precision=`` for it (``"16-mixed"``
with ``grad_scaler=True``) unless the settings give one: the probe runs once more under autocast. The
optimizer that holds the audited module's parameters (when one does) gets its first step audited
(``optimizer=``) with every param group at the highest rate its schedulers reach within the run
(``estimated_stepping_batches``, or ``max_epochs`` for a per-epoch schedule) and the gradients clipped as
``gradient_clip_val`` and ``gradient_clip_algorithm`` say, unless the settings give an ``optimizer`` (``None``: no
first step). Whichever optimizer is audited, its first step gets ``batches_per_step`` of
``accumulate_grad_batches`` x ``world_size`` unless the settings give a number for it: the batch audited is one
of those the run's step averages.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

try:
    from lightning.pytorch import Callback
    _LOGGER = "lightning.pytorch.callbacks.initlint"
except ImportError:  # the older package name
    from pytorch_lightning import Callback  # type: ignore[no-redef]
    _LOGGER = "pytorch_lightning.callbacks.initlint"

from ._core import BatchAuditor, InitlintFailure, RunOptimizer, mixed_precision, unwrapped_optimizer

__all__ = ["InitlintCallback", "InitlintFailure"]

log = logging.getLogger(_LOGGER)


class InitlintCallback(Callback):
    """Audit the model once, on the first training batch; stop on findings at or above ``fail_on``.

    ``inputs(batch)`` picks the model inputs out of a batch; ``module`` names an attribute of
    the LightningModule to audit instead of it (``"net"``, ``"model.backbone"``); other
    keywords are :func:`initlint.audit` settings (``select``, ``ignore``, ``logits``, ...).
    """

    def __init__(self, fail_on: Optional[str] = "warning", *, inputs: Optional[Callable[[Any], Any]] = None,
                 module: Optional[str] = None, **settings: Any) -> None:
        super().__init__()
        self.auditor = BatchAuditor("InitlintCallback", fail_on, inputs, settings)
        self.module = module

    @property
    def report(self) -> Any:
        """The :class:`~initlint.Report` of the audit, once it ran."""
        return self.auditor.report

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.auditor.done:
            return
        if trainer.global_step > 0:  # resumed from a checkpoint: the model is no longer at its initialisation
            self.auditor.done = True
            return
        model = pl_module
        for name in (self.module.split(".") if self.module else []):
            model = getattr(model, name)
        logger = log if trainer.is_global_zero else logging.getLogger(f"{_LOGGER}.rank")
        try:
            self.auditor.audit(model, self.auditor.example(batch), logger,
                               precision=mixed_precision(getattr(trainer, "precision", None)),
                               optimizer=lambda: self._run_optimizer(trainer, model, pl_module, logger),
                               batches=(getattr(trainer, "accumulate_grad_batches", 1),
                                        getattr(trainer, "world_size", 1)))
        finally:
            self._log_counts(trainer)

    def _run_optimizer(self, trainer: Any, model: Any, pl_module: Any, logger: logging.Logger) -> RunOptimizer:
        """The trainer's optimizer over the audited model, at its schedule's peak; none where there is none, or
        more than one holds the model's parameters (said in the log: pass ``optimizer=`` to audit one of them).
        Lightning clips over all of the optimizer's parameters: with ``module=`` the audit's norm is over the
        module's gradients only."""
        own = {id(p) for p in model.parameters()}
        holding = [o for o in (unwrapped_optimizer(o) for o in getattr(trainer, "optimizers", None) or [])
                   if o is not None and any(id(p) in own for g in o.param_groups for p in g["params"])]
        if len(holding) != 1:
            if holding:
                logger.info("initlint: %d optimizers hold the model's parameters; the first step is not audited (pass "
                            "optimizer= to audit one of them)", len(holding))
            return RunOptimizer(None)
        configs = getattr(trainer, "lr_scheduler_configs", None) or []
        per_epoch = any(getattr(c, "interval", "step") == "epoch" for c in configs)
        try:
            horizon = trainer.max_epochs if per_epoch else trainer.estimated_stepping_batches
        except Exception:  # the run's length cannot be told (an iterable without a length): read the default span
            horizon = None
        clip = getattr(trainer, "gradient_clip_val", None)
        by_value = str(getattr(trainer, "gradient_clip_algorithm", None) or "norm").lower().endswith("value")
        return RunOptimizer(holding[0], [c.scheduler for c in configs], horizon,
                            model=model if model is not pl_module else None,
                            clip_norm=None if by_value else clip, clip_value=clip if by_value else None)

    def _log_counts(self, trainer: Any) -> None:
        report = self.auditor.report
        if report is None or not trainer.is_global_zero:
            return
        counts = {"initlint/findings": float(len(report.findings)),
                  "initlint/failing": float(len(self.auditor.failing(report)))}
        for logger in trainer.loggers:
            logger.log_metrics(counts, step=trainer.global_step)
