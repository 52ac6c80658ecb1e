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
              precision: Optional[Tuple[str, bool]] = None, optimizer: Optional["RunOptimizer"] = None) -> Optional[Report]:
        """Audit ``model`` on ``example`` (once); log the outcome; raise :class:`InitlintFailure` to stop.
        ``precision``: the mixed precision the run trains at, ``(dtype, grad_scaler)``, audited as ``precision=``
        and ``grad_scaler=`` unless the settings say otherwise (and where the model's device can autocast to it).
        ``optimizer``: the run's optimizer at its schedule's peak, audited as ``optimizer=`` unless the settings
        give one (``optimizer=None`` among them: no first step)."""
        from ..api import UsageError, audit
        from ..inputs.load import LoadError

        self.done = True
        settings = dict(self.settings)
        if precision is not None and "precision" not in settings:
            settings.update(_training_precision(model, precision, log))
        notes: List[str] = []
        if optimizer is not None and "optimizer" not in settings:
            if optimizer.optimizer is not None:
                settings["optimizer"] = optimizer.optimizer
                if "clip_grad_norm" not in settings and "clip_grad_value" not in settings:
                    settings.update(optimizer.clipping)
            notes.extend(optimizer.notes)
        try:
            report = audit(model, example, **settings)
        except UsageError:
            raise  # the callback's own settings are wrong: say so, do not train on silently
        except LoadError as exc:
            log.warning("initlint could not audit %s on the first training batch: %s", type(model).__name__, exc)
            return None
        report.notes[:0] = notes
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


# ----------------------------------------------------------------------------- the run's optimizer
LAMBDA_STEPS = 20000
"""A ``LambdaLR``'s factor is read at every step up to this, and at this many steps spread evenly over a
longer run: its peak (the end of a warm-up) is found to within the spacing of those steps."""
DEFAULT_HORIZON = 100000
"""Steps a ``LambdaLR`` is read over when the run does not say how long it is."""


class RunOptimizer:
    """The optimizer a training run steps, as the audit's ``optimizer=``: unwrapped from the framework's wrapper
    (Accelerate's ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``) and seen with every param group at
    the highest learning rate its schedule reaches in the run. A warm-up holds lr 0 (or near it) at the first
    batch, where the first step would judge nothing; the rate the run trains at is the schedule's peak.

    The view shares the run's parameters, hyperparameters and state and changes none of them: the audit's first
    step is taken on its own copies, with the gradients clipped as the run clips them (``clip_norm``: the total
    norm, ``clip_value``: each element). ``notes``: what the report says of the rate it was judged at."""

    def __init__(self, optimizer: Any, schedulers: Iterable[Any] = (), horizon: Optional[float] = None,
                 model: Any = None, clip_norm: Any = None, clip_value: Any = None) -> None:
        self.optimizer: Any = None
        self.notes: List[str] = []
        self.clipping: Dict[str, float] = {}
        """``clip_grad_norm`` or ``clip_grad_value`` for the audit: the run's own clipping (none where it is 0)."""
        for key, value in (("clip_grad_norm", clip_norm), ("clip_grad_value", clip_value)):
            number = _number(value)
            if number is not None and 0 < number < float("inf") and not self.clipping:
                self.clipping[key] = number
        opt = unwrapped_optimizer(optimizer)
        if opt is None:
            return
        held = [_lr(g) for g in opt.param_groups]
        peaks = list(held)
        steps, known = _horizon(horizon)
        for scheduler in schedulers:
            scheduler = _unwrapped_scheduler(scheduler)
            if unwrapped_optimizer(getattr(scheduler, "optimizer", None)) is not opt:
                continue
            for i, peak in enumerate(schedule_peaks(scheduler, len(held), steps)):
                if peak is not None and held[i] is not None:
                    peaks[i] = max(peaks[i], peak)
        keep = None if model is None else {id(p) for p in model.parameters()}
        self.optimizer = _view(opt, peaks, keep)
        moved = [(i, held[i], peaks[i]) for i in range(len(held)) if peaks[i] != held[i]]
        if moved:
            from ..rules.base import fmt

            pairs = {(now, peak) for _, now, peak in moved}
            if len(pairs) == 1 and len(moved) == len(held):
                ((now, peak),) = pairs
                each = f"lr {fmt(peak)} for every param group, which holds {fmt(now)} at this batch"
            else:
                each = "; ".join(f"param group {i}: lr {fmt(peak)}, holding {fmt(now)} at this batch"
                                 for i, now, peak in moved)
            within = f"within its {steps:,} steps" if known else f"within {steps:,} steps (the run's length is not known)"
            self.notes.append(f"the first step is judged at the highest learning rate the run's schedule reaches "
                              f"{within} ({each}): the rate it trains at, not its warm-up's start")


def unwrapped_optimizer(optimizer: Any) -> Any:
    """The ``torch.optim.Optimizer`` inside a framework's wrapper, or None."""
    import torch

    seen = 0
    while optimizer is not None and seen < 8:
        inner = getattr(optimizer, "optimizer", None)
        if inner is None:
            inner = getattr(optimizer, "_optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer):
            break
        optimizer, seen = inner, seen + 1
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


def _unwrapped_scheduler(scheduler: Any) -> Any:
    inner = getattr(scheduler, "scheduler", None)  # Accelerate's AcceleratedScheduler
    return inner if inner is not None and hasattr(inner, "optimizer") else scheduler


def schedule_peaks(scheduler: Any, groups: int, steps: int) -> List[Optional[float]]:
    """The highest lr ``scheduler`` gives each param group over ``steps`` steps (None: not known). A warm-up
    schedule (``LambdaLR`` with a factor rising to 1, ``LinearLR`` from a start factor below 1, a sequence that
    begins with one) peaks at its base lr; a ``LambdaLR`` is read step by step, since its base may be 1 with the
    rate in the factor; a one-cycle schedule peaks at its ``max_lr``, a cyclic one at its ``max_lrs``."""
    from torch.optim import lr_scheduler as S

    base = [float(b) for b in getattr(scheduler, "base_lrs", [])] or [None] * groups
    if len(base) != groups:
        return [None] * groups
    children = getattr(scheduler, "_schedulers", None)
    if isinstance(scheduler, (S.SequentialLR, S.ChainedScheduler)) and children:
        out: List[Optional[float]] = [None] * groups
        for child in children:
            for i, peak in enumerate(schedule_peaks(child, groups, steps)):
                if peak is not None:
                    out[i] = peak if out[i] is None else max(out[i], peak)
        return out
    if isinstance(scheduler, S.LambdaLR):
        return [None if b is None else b * f for b, f in zip(base, _lambda_peaks(scheduler.lr_lambdas, steps))]
    if isinstance(scheduler, S.OneCycleLR):
        return [_number(g.get("max_lr")) for g in scheduler.optimizer.param_groups]
    if isinstance(scheduler, S.CyclicLR):
        return [float(m) for m in scheduler.max_lrs]
    if isinstance(scheduler, S.LinearLR):
        return [None if b is None else b * max(scheduler.start_factor, scheduler.end_factor) for b in base]
    if isinstance(scheduler, S.ConstantLR):
        return [None if b is None else b * max(scheduler.factor, 1.0) for b in base]
    if isinstance(scheduler, S.MultiplicativeLR):
        return [None] * groups  # a product of factors: only the rate it holds now is known
    return base  # the decaying schedules (step, cosine, exponential, polynomial, plateau) start at their base


def _lambda_peaks(lambdas: List[Any], steps: int) -> List[Optional[float]]:
    at = list(range(min(steps, LAMBDA_STEPS)))
    if steps > LAMBDA_STEPS:
        at += [LAMBDA_STEPS + (steps - LAMBDA_STEPS) * k // LAMBDA_STEPS for k in range(LAMBDA_STEPS)]
    out: List[Optional[float]] = []
    for f in lambdas:
        best: Optional[float] = None
        for s in at:
            try:
                v = float(f(s))
            except Exception:  # the user's schedule may fail at a step it is never stepped to
                continue
            if v == v and abs(v) != float("inf") and (best is None or v > best):
                best = v
        out.append(best)
    return out


def _horizon(horizon: Optional[float]) -> Tuple[int, bool]:
    """The steps a schedule is read over, and whether they are the run's own."""
    try:
        h = float(horizon) if horizon is not None else 0.0
    except (TypeError, ValueError):
        h = 0.0
    return (int(h), True) if 1 <= h < float("inf") else (DEFAULT_HORIZON, False)


def _lr(group: Dict[str, Any]) -> Optional[float]:
    return _number(group.get("lr"))


def _number(value: Any) -> Optional[float]:
    try:
        x = float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return x if x == x else None


def _view(opt: Any, lrs: List[Optional[float]], keep: Optional[set]) -> Any:
    """``opt`` with param groups of their own (lr ``lrs``; only the parameters in ``keep`` when given), sharing its
    state and hyperparameters: nothing of the run's optimizer changes."""
    import torch

    view = object.__new__(type(opt))
    view.__dict__.update(vars(opt))
    groups = []
    for group, lr in zip(opt.param_groups, lrs):
        new = dict(group)
        if lr is not None and lr != _lr(group):
            old = group.get("lr")
            new["lr"] = torch.tensor(lr, dtype=old.dtype, device=old.device) if isinstance(old, torch.Tensor) else lr
        if keep is not None:
            new["params"] = [p for p in group["params"] if id(p) in keep]
        groups.append(new)
    view.param_groups = groups
    return view


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
