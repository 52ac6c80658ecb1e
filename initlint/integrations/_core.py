"""What both training callbacks share: settings, the audit of one batch, the log text and the stop."""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ..report.findings import SEVERITIES, Finding, Report

LABEL_KEYS = ("labels", "label", "label_ids", "num_items_in_batch")
"""Keys of a batch dict that feed the loss, not the model's forward: left out of the audit."""


class InitlintFailure(RuntimeError):
    """The training run was stopped: the model has findings at or above ``fail_on`` at initialisation."""

    def __init__(self, message: str, report: Report) -> None:
        super().__init__(message)
        self.report = report


class BatchAuditor:
    """Audits a model once on a batch and decides what to log and whether to stop."""

    def __init__(self, callback: str, fail_on: Optional[str] = "warning",
                 inputs: Optional[Callable[..., Any]] = None, settings: Optional[Dict[str, Any]] = None) -> None:
        if fail_on is not None and fail_on not in SEVERITIES:
            raise ValueError(f"fail_on takes one of {', '.join(SEVERITIES)} or None, not {fail_on!r}")
        self.callback = callback
        self.fail_on = fail_on
        self.inputs = inputs
        self.settings = dict(settings or {})
        self.report: Optional[Report] = None
        self.done = False

    def audit(self, model: Any, example: Any, log: logging.Logger,
              precision: Optional[Tuple[str, bool]] = None) -> Optional[Report]:
        """Audit ``model`` on ``example`` (once); log the outcome; raise :class:`InitlintFailure` to stop.
        ``precision``: the mixed precision the run trains at, ``(dtype, grad_scaler)``, audited as ``precision=``
        and ``grad_scaler=`` unless the settings say otherwise (and where the model's device can autocast to it)."""
        from ..api import UsageError, audit
        from ..inputs.load import LoadError

        self.done = True
        settings = dict(self.settings)
        if precision is not None and "precision" not in settings:
            settings.update(_training_precision(model, precision, log))
        try:
            report = audit(model, example, **settings)
        except UsageError:
            raise  # the callback's own settings are wrong: say so, do not train on silently
        except LoadError as exc:
            log.warning("initlint could not audit %s on the first training batch: %s", type(model).__name__, exc)
            return None
        self.report = report
        failing = self.failing(report)
        self._log(report, failing, log)
        if failing:
            raise InitlintFailure(self.stop_message(report, failing), report)
        return report

    def failing(self, report: Report) -> List[Finding]:
        """Findings at or above ``fail_on`` (none when it is None)."""
        if self.fail_on is None:
            return []
        level = SEVERITIES.index(self.fail_on)
        return [f for f in report.findings if SEVERITIES.index(f.severity) >= level]

    def _log(self, report: Report, failing: List[Finding], log: logging.Logger) -> None:
        from ..output.formats import findings_table

        serious = [f for f in report.findings if f.severity != "info"]
        if not report.findings:
            log.info("initlint: %s has no findings at initialisation (first training batch)", report.model)
            return
        level = logging.WARNING if serious else logging.INFO
        log.log(level, "initlint: %d finding(s) in %s at initialisation (first training batch):\n%s",
                len(report.findings), report.model, findings_table(report.findings))
        for note in report.notes:
            log.info("initlint: note: %s", note)

    def stop_message(self, report: Report, failing: List[Finding]) -> str:
        from ..output.formats import findings_table

        codes = sorted({f.code for f in failing})
        return (f"initlint stopped training before the first optimizer step: {len(failing)} finding(s) at or above "
                f"'{self.fail_on}' in {report.model} at initialisation.\n\n{findings_table(failing)}\n\n"
                f"fix the initialisation (`initlint explain {codes[0]}`), or pass fail_on=None to {self.callback} "
                f"to log the findings and train on")

    def example(self, batch: Any) -> Any:
        """The model inputs in ``batch``: ``inputs(batch)`` when given, else the batch itself, the first
        element of a tuple or list (``(x, y)``), or a dict without its label keys."""
        if self.inputs is not None:
            return self.inputs(batch)
        if isinstance(batch, (tuple, list)) and batch:
            return batch[0]
        if isinstance(batch, dict):
            return without_labels(batch, LABEL_KEYS)
        return batch


def _training_precision(model: Any, precision: Tuple[str, bool], log: logging.Logger) -> Dict[str, Any]:
    """``precision=`` and ``grad_scaler=`` for the run's mixed precision, or nothing where the model's device
    cannot autocast to it (said in the log: the audit then runs without the precision probe)."""
    from ..api import UsageError, check_precision
    from ..attempts import model_device

    dtype, scaler = precision
    try:
        check_precision(dtype, scaler, model_device(model))
    except UsageError as exc:
        log.info("initlint: the run's mixed precision is not audited: %s", exc)
        return {}
    return {"precision": dtype, "grad_scaler": scaler}


def mixed_precision(name: Any) -> Optional[Tuple[str, bool]]:
    """A training framework's mixed-precision setting as ``(precision, grad_scaler)``: Lightning's ``"bf16-mixed"``
    and ``"16-mixed"`` (fp16 with a gradient scaler), None for full or true half precision (a model cast to
    half is audited as it is)."""
    text = str(name).strip().lower()
    if text in ("bf16-mixed", "bf16"):
        return ("bf16", False)
    if text in ("16-mixed", "16", "fp16"):
        return ("fp16", True)
    return None


def without_labels(batch: Dict[str, Any], labels: Iterable[str]) -> Dict[str, Any]:
    """``batch`` without the keys that feed the loss."""
    drop = set(labels) | set(LABEL_KEYS)
    return {k: v for k, v in batch.items() if k not in drop}
