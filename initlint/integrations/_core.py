"""What both training callbacks share: settings, the audit of one batch, the log text and the stop."""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ..inputs.config import MAX_BATCHES_PER_STEP
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
              precision: Optional[Tuple[str, bool]] = None,
              optimizer: Optional[Callable[[], "RunOptimizer"]] = None,
              batches: Iterable[Any] = ()) -> Optional[Report]:
        """Audit ``model`` on ``example`` (once); log the outcome; raise :class:`InitlintFailure` to stop.
        ``precision``: the mixed precision the run trains at, ``(dtype, grad_scaler)``, audited as ``precision=``
        and ``grad_scaler=`` unless the settings say otherwise (and where the model's device can autocast to it).
        ``optimizer``: makes the run's optimizer at its schedule's peak, audited as ``optimizer=`` unless the
        settings give one (``optimizer=None`` among them: no first step). The run's own optimizer never stops
        the run by being unfit for the audit: it is then left out, and the log says why. ``batches``: the run's
        gradient accumulation steps and data-parallel ranks, whose product is the first step's
        ``batches_per_step`` (the batch audited is one of those the run's step averages), whoever gives the
        optimizer, unless the settings give a number for it."""
        from ..api import UsageError, audit
        from ..inputs.load import LoadError

        self.done = True
        loaded, total = checkpoint_share(model)
        if total and 2 * loaded >= total:
            log.info("initlint: %s was loaded from a checkpoint (%d of its %d parameters hold pretrained weights, "
                     "as transformers' from_pretrained marks them): it is not at an initialisation, so it is not "
                     "audited", type(model).__name__, loaded, total)
            return None
        settings = dict(self.settings)
        if precision is not None and "precision" not in settings:
            settings.update(_training_precision(model, precision, log))
        notes: List[str] = []
        if optimizer is not None and "optimizer" not in settings:
            notes = _run_optimizer(optimizer, model, settings, log)
        if settings.get("batches_per_step") is None:  # None among the settings: the run's own, as when not given
            settings.pop("batches_per_step", None)
            k = run_batches(batches)
            if settings.get("optimizer") is not None and k > 1:
                settings["batches_per_step"] = k
        report: Optional[Report] = None
        error: Optional[BaseException] = None
        try:
            report = audit(model, example, **settings)
        except UsageError as exc:  # the callback's own settings are wrong: say so, do not train on silently
            error = exc
        except LoadError as exc:
            log.warning("initlint could not audit %s on the first training batch: %s", type(model).__name__, exc)
        except BaseException as exc:  # noqa: BLE001 - raised below, once the other ranks know
            error = exc
        failing: List[Finding] = []
        if report is not None:
            report.notes[:0] = notes
            self.report = report
            failing = self.failing(report)
            self._log(report, failing, log)
        mine = (_ERRED, f"{type(error).__name__}: {error}") if error is not None else (_STOPS if failing else _GOES, "")
        others = [(rank, outcome) for rank, outcome in enumerate(rank_outcomes(mine)) if outcome[0] != _GOES]
        if error is not None:
            raise error
        if failing:
            raise InitlintFailure(self.stop_message(report, failing), report)  # type: ignore[arg-type]
        if others:
            raise InitlintFailure(self.others_message(report, others), report)  # type: ignore[arg-type]
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

    def others_message(self, report: Optional[Report], others: List[Tuple[int, Tuple[str, str]]]) -> str:
        """Why a rank whose own batch passed stops: other ranks stopped (their findings), or failed (their error)."""
        import torch.distributed as dist

        own = "could not be audited" if report is None else \
            f"has {len(report.findings)} finding(s) below '{self.fail_on}'" if report.findings else "is clean"
        stopped = [str(rank) for rank, (kind, _) in others if kind == _STOPS]
        failed = [f"rank {rank}: {text}" for rank, (kind, text) in others if kind == _ERRED]
        said = []
        if stopped:
            said.append(f"rank{'s' if len(stopped) > 1 else ''} {', '.join(stopped)} of {dist.get_world_size()} found "
                        f"finding(s) at or above '{self.fail_on}' in the model at initialisation, on "
                        f"{'their' if len(stopped) > 1 else 'its'} own first training batch (the findings are in "
                        f"{'their' if len(stopped) > 1 else 'its'} output)")
        if failed:
            said.append(f"the audit failed on {'; '.join(failed)}")
        return (f"initlint stopped training before the first optimizer step: {'; and '.join(said)}; this rank's batch "
                f"{own}. Every rank stops, so that none waits for the others in the first step; pass fail_on=None to "
                f"{self.callback} to log the findings and train on")

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


def checkpoint_share(model: Any) -> Tuple[int, int]:
    """``(loaded, total)``: how many of ``model``'s parameters hold a checkpoint's weights, as transformers'
    ``from_pretrained`` marks them (``_is_hf_initialized`` on each tensor it loaded; a model built from its
    config, and the new head of a loaded one, have none), and how many parameters it has."""
    params = list(model.parameters()) if hasattr(model, "parameters") else []
    return sum(1 for p in params if getattr(p, "_is_hf_initialized", False) is True), len(params)


def _run_optimizer(make: Callable[[], "RunOptimizer"], model: Any, settings: Dict[str, Any],
                   log: logging.Logger) -> List[str]:
    """Put the run's optimizer (and its clipping, unless the settings give one) into ``settings``; the report's
    notes about it. Whatever fails here is logged, and the audit goes on without the first step."""
    from ..api import UsageError
    from ..probe.step import resolve_optimizer

    try:
        run = make()
        if run.optimizer is None:
            if run.why:
                log.info("initlint: %s", run.why)
        else:
            resolve_optimizer(run.optimizer, model)  # an optimizer over none of them (a layer-wise stand-in, say)
    except UsageError as exc:
        log.info("initlint: the run's optimizer is not audited: %s", exc)
        run = None
    except Exception as exc:  # noqa: BLE001 - a framework's object of a kind not foreseen: never stop the run
        log.info("initlint: the run's optimizer is not audited (%s: %s)", type(exc).__name__, exc)
        run = None
    if run is None or run.optimizer is None:
        for key in ("clip_grad_norm", "clip_grad_value", "batches_per_step"):
            if settings.pop(key, None) is not None:
                log.info("initlint: %s is not audited: the run gives no optimizer to take the first step with", key)
        return []
    settings["optimizer"] = run.optimizer
    if "clip_grad_norm" not in settings and "clip_grad_value" not in settings:
        settings.update(run.clipping)
    return list(run.notes)


_GOES, _STOPS, _ERRED = "goes on", "stops", "failed"
"""A rank's outcome of its callback's audit: its batch passed, gave findings at or above ``fail_on``, or raised."""


def rank_outcomes(mine: Tuple[str, str]) -> List[Tuple[str, str]]:
    """Every rank's outcome (``(kind, error text)``), in rank order, where the run is data-parallel; empty
    elsewhere. Every rank audits its own batch, and a verdict near a limit may differ between batches: so that
    every rank stops with one that stops or fails, instead of waiting for it in the first step's collective.
    Exchanged with ``all_gather_object``, on the device the process group's backend takes (CPU for gloo, the
    rank's current accelerator for NCCL and its kin): every rank of the group must run the callback."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return []
    gathered: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return [tuple(outcome) for outcome in gathered]  # type: ignore[misc]


def run_batches(values: Iterable[Any]) -> int:
    """The batches like the audited one that the run's step averages: the product of ``values`` (its gradient
    accumulation steps, its data-parallel ranks), each a whole number from 1 (another value counts as 1), at
    most :data:`MAX_BATCHES_PER_STEP`."""
    from ..probe.step import whole_number

    product = 1
    for value in values:
        product = min(product * (whole_number(value) or 1), MAX_BATCHES_PER_STEP)
    return product


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
SIMULATED_STEPS = 100000
"""Any other scheduler is stepped on a copy over a stand-in optimizer for the run's steps, up to this many."""
DEFAULT_HORIZON = 100000
"""Steps a schedule is read over when the run does not say how long it is."""


class RunOptimizer:
    """The optimizer a training run steps, as the audit's ``optimizer=``: unwrapped from the framework's wrapper
    (Accelerate's ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``) and seen with every param group at
    the highest learning rate its schedule reaches in the run. A warm-up holds lr 0 (or near it) at the first
    batch, where the first step would judge nothing; the rate the run trains at is the schedule's peak.

    The view shares the run's parameters, hyperparameters and state and changes none of them: the audit's first
    step is taken on its own copies, with the gradients clipped as the run clips them (``clip_norm``: the total
    norm, ``clip_value``: each element). ``notes``: what the report says of the rate it was judged at. An
    optimizer that is not a ``torch.optim.Optimizer`` over the model's own tensors (DeepSpeed's ZeRO optimizers
    hold flat copies) gives no view (``optimizer`` None); a schedule that cannot be read leaves the rate the
    optimizer holds."""

    def __init__(self, optimizer: Any, schedulers: Iterable[Any] = (), horizon: Optional[float] = None,
                 model: Any = None, clip_norm: Any = None, clip_value: Any = None) -> None:
        self.optimizer: Any = None
        self.notes: List[str] = []
        self.clipping: Dict[str, float] = {}
        """``clip_grad_norm`` or ``clip_grad_value`` for the audit: the run's own clipping (none where it is 0)."""
        from ..probe.step import real_number

        for key, value in (("clip_grad_norm", clip_norm), ("clip_grad_value", clip_value)):
            number = real_number(value)
            if number is not None and 0 < number < float("inf") and not self.clipping:
                self.clipping[key] = number
        self.why = ""
        """Why a given optimizer gives no view (empty when it does, or none was given)."""
        opt = unwrapped_optimizer(optimizer)
        if opt is None:
            if optimizer is not None:
                self.why = (f"the run's optimizer ({type(optimizer).__name__}) holds no torch.optim.Optimizer over the "
                            f"model's own tensors (DeepSpeed's ZeRO optimizers hold flat copies): its first step is "
                            f"not audited")
            return
        held = [_lr(g) for g in opt.param_groups]
        peaks = list(held)
        steps, known = _horizon(horizon)
        read = steps
        for scheduler in schedulers:
            scheduler = _unwrapped_scheduler(scheduler)
            if unwrapped_optimizer(getattr(scheduler, "optimizer", None)) is not opt:
                continue
            found, span = schedule_peaks(scheduler, len(held), steps)
            read = min(read, span)
            for i, peak in enumerate(found):
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
            within = (f"within its {steps:,} steps" if known and read == steps else
                      f"within its first {read:,} steps" if known else
                      f"within {read:,} steps (the run's length is not known)")
            self.notes.append(f"the first step is judged at the highest learning rate the run's schedule reaches "
                              f"{within} ({each}): the rate it trains at, not its warm-up's start")


def unwrapped_optimizer(optimizer: Any) -> Any:
    """The ``torch.optim.Optimizer`` inside a framework's wrappers (followed through ``optimizer`` and
    ``_optimizer`` attributes), or None when the innermost object is not one (DeepSpeed's ZeRO optimizers)."""
    import torch

    for _ in range(8):
        inner = getattr(optimizer, "optimizer", None)
        if inner is None:
            inner = getattr(optimizer, "_optimizer", None)
        if inner is None or inner is optimizer:
            break
        optimizer = inner
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


def _unwrapped_scheduler(scheduler: Any) -> Any:
    inner = getattr(scheduler, "scheduler", None)  # Accelerate's AcceleratedScheduler
    return inner if inner is not None and hasattr(inner, "optimizer") else scheduler


def schedule_peaks(scheduler: Any, groups: int, steps: int) -> Tuple[List[Optional[float]], int]:
    """The highest lr ``scheduler`` gives each param group over the run's first ``steps`` steps (None: not known;
    the rate the optimizer holds stands), and how many steps were read.

    A ``LambdaLR`` (every Hugging Face schedule is one) is read from its factors: at each of the first
    :data:`LAMBDA_STEPS` steps and at as many spread over the rest (its base may be 1 with the rate in the factor,
    as under the Transformer paper's schedule). Any other scheduler is stepped, on a copy that drives a stand-in
    optimizer with the run's param groups, for up to :data:`SIMULATED_STEPS` steps: its own code says what it
    does, warm-ups that last longer than the run and chained or sequenced schedules included. A scheduler that
    cannot be copied or stepped that way (``ReduceLROnPlateau`` wants a metric) gives None."""
    from torch.optim import lr_scheduler as S

    try:
        if type(scheduler) is S.LambdaLR or (isinstance(scheduler, S.LambdaLR) and
                                               type(scheduler).step is S.LambdaLR.step):
            base = [float(b) for b in scheduler.base_lrs]
            if len(base) != groups:
                return [None] * groups, steps
            factors = _lambda_peaks(scheduler.lr_lambdas, steps)
            return [None if f is None else b * f for b, f in zip(base, factors)], steps
        return _simulated_peaks(scheduler, groups, min(steps, SIMULATED_STEPS))
    except Exception:  # noqa: BLE001 - the user's schedule may fail in any way: the held rate stands
        return [None] * groups, steps


def _lambda_peaks(lambdas: List[Any], steps: int) -> List[Optional[float]]:
    at = list(range(min(steps, LAMBDA_STEPS)))
    if steps > LAMBDA_STEPS:
        at += [LAMBDA_STEPS + (steps - LAMBDA_STEPS) * k // LAMBDA_STEPS for k in range(LAMBDA_STEPS)]
    done: Dict[int, Optional[float]] = {}  # Hugging Face repeats one factor for every group
    out: List[Optional[float]] = []
    for f in lambdas:
        if id(f) not in done:
            best: Optional[float] = None
            for s in at:
                try:
                    v = float(f(s))
                except Exception:  # noqa: BLE001 - a step the schedule is never stepped to
                    continue
                if v == v and abs(v) != float("inf") and (best is None or v > best):
                    best = v
            done[id(f)] = best
        out.append(done[id(f)])
    return out


def _simulated_peaks(scheduler: Any, groups: int, steps: int) -> Tuple[List[Optional[float]], int]:
    """Step a copy of ``scheduler`` that drives a stand-in optimizer (the run's param groups, one dummy tensor
    each) ``steps - 1`` times; the largest lr each group held."""
    import copy
    import warnings

    import torch

    real = scheduler.optimizer
    stand_in = torch.optim.Optimizer(
        [{**{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}, "params": [torch.zeros(1, requires_grad=True)]}
         for g in real.param_groups], {})
    memo: Dict[int, Any] = {id(real): stand_in}
    inner = unwrapped_optimizer(real)
    if inner is not None:
        memo[id(inner)] = stand_in
    copied = copy.deepcopy(scheduler, memo)
    best = [_lr(g) for g in stand_in.param_groups]
    if len(best) != groups:
        return [None] * groups, steps
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()" and the like
        for _ in range(max(steps - 1, 0)):
            copied.step()
            for i, g in enumerate(stand_in.param_groups):
                lr = _lr(g)
                if lr is not None and (best[i] is None or lr > best[i]):
                    best[i] = lr
    return best, steps


def _horizon(horizon: Optional[float]) -> Tuple[int, bool]:
    """The steps a schedule is read over, and whether they are the run's own."""
    try:
        h = float(horizon) if horizon is not None else 0.0
    except (TypeError, ValueError, OverflowError):
        h = 0.0
    return (int(h), True) if 1 <= h < float("inf") else (DEFAULT_HORIZON, False)


def _lr(group: Dict[str, Any]) -> Optional[float]:
    from ..probe.step import real_number

    return real_number(group.get("lr"))


def _view(opt: Any, lrs: List[Optional[float]], keep: Optional[set]) -> Any:
    """``opt`` with param groups of their own (lr ``lrs``; only the parameters in ``keep`` when given), sharing its
    state and hyperparameters: nothing of the run's optimizer changes (the groups are set in the view's own
    ``__dict__``, past any property of the class)."""
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
    view.__dict__["param_groups"] = groups
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
