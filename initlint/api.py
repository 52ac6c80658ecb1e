"""The pipeline: load -> capture -> probe -> rules -> report, behind :func:`audit`."""
from __future__ import annotations

import copy
import itertools
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .capture import BACKENDS, CaptureError, capture
from .capture.fx import untraceable
from .errors import LoadError, UsageError
from .rules.link import link_findings
from .inputs.config import MAX_BATCHES_PER_STEP
from .inputs.hf import other_layouts
from .inputs.load import DEFAULT_BATCH, check_finite, infer_inputs, move_inputs, normalise_inputs, shaped_inputs
from .attempts import ForwardFailed, describe_inputs, model_device, probe_retrying
from .probe.guard import guarded
from .probe.run import ProbeResult, run_probe
from .report.findings import Finding, Report, group_runs
from .rules import AuditContext, all_rules, plugin_errors, select_rules, with_uses
from .rules.il000_rule_error import RuleError
from .rules.suppress import apply_suppressions


RULE_ERROR = RuleError.code
"""The code :func:`_run_rules` reports a rule's crash under (the rule class in ``rules/il000_rule_error.py``)."""


def unwrap(model: Any) -> nn.Module:
    """The user's module behind ``torch.compile`` and (Distributed)DataParallel wrappers."""
    for _ in range(8):
        if hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        elif isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        else:
            break
    return model


def _ddp_wrapped(model: Any) -> bool:
    """Whether ``model`` is (behind ``torch.compile``) a DistributedDataParallel wrapper."""
    for _ in range(8):
        if isinstance(model, nn.parallel.DistributedDataParallel):
            return True
        inner = getattr(model, "_orig_mod", None) or (model.module if isinstance(model, nn.DataParallel) else None)
        if not isinstance(inner, nn.Module):
            return False
        model = inner
    return False


PRECISIONS = {"fp16": torch.float16, "bf16": torch.bfloat16}
"""``precision=`` -> the autocast dtype."""


def check_precision(precision: Optional[str], grad_scaler: Any, dev: torch.device) -> Optional[str]:
    """``precision`` checked: None, ``fp16`` or ``bf16`` (``float16``/``bfloat16`` are read the same way), and one
    the device can autocast to; ``grad_scaler`` a boolean. :class:`UsageError` otherwise."""
    if not isinstance(grad_scaler, bool):
        raise UsageError(f"grad_scaler must be True or False, not {grad_scaler!r}")
    if precision is None:
        return None
    text = str(precision).strip().lower() if isinstance(precision, (str, torch.dtype)) else None
    text = {"float16": "fp16", "torch.float16": "fp16", "half": "fp16", "bfloat16": "bf16",
            "torch.bfloat16": "bf16"}.get(text, text)
    if text not in PRECISIONS:
        raise UsageError(f"precision must be fp16, bf16 or None, not {precision!r}")
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ok = torch.amp.is_autocast_available(dev.type)
            if ok:
                with torch.autocast(device_type=dev.type, dtype=PRECISIONS[text]):
                    ok = torch.is_autocast_enabled(dev.type)
        except (RuntimeError, ValueError, AttributeError):
            ok = False
    if not ok or any("autocast" in str(w.message).lower() for w in caught):
        raise UsageError(f"precision {text}: {dev} cannot autocast to {PRECISIONS[text]}; audit on a device that "
                         f"can (--device) or choose the other precision")
    return text


def resolve_device(device: Optional[str], model: nn.Module) -> torch.device:
    """``None`` -> the model's device; ``auto`` -> CUDA, else MPS, else CPU; checks availability."""
    if device is None:
        return model_device(model)
    if str(device) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise UsageError(f"unknown device '{device}'; use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device '{device}' was asked for, but this machine has no usable CUDA device")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UsageError(f"device '{device}' does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"device '{device}' was asked for, but MPS is not available on this machine")
    if dev.type not in ("cpu", "cuda", "mps", "meta"):
        raise UsageError(f"unsupported device '{device}'; use auto, cpu, cuda, cuda:N or mps")
    return dev


def audit(model: nn.Module, example_inputs: Any = None, *, device: Optional[str] = None,
          select: Optional[Iterable[str]] = None, ignore: Optional[Iterable[str]] = None,
          logits: Optional[bool] = None, seed: int = 0, batch_size: Optional[int] = None,
          input_shapes: Optional[Sequence[Tuple[int, ...]]] = None,
          rule_options: Optional[Dict[str, Dict[str, Any]]] = None, name: Optional[str] = None,
          target: str = "", init: Optional[Callable[[nn.Module], None]] = None,
          progress: Optional[Callable[[Any], None]] = None, optimizer: Any = None,
          loss: Optional[Callable[[Any, Any], Any]] = None, precision: Optional[str] = None,
          grad_scaler: bool = False, clip_grad_norm: Optional[float] = None,
          clip_grad_value: Optional[float] = None, batches_per_step: Optional[int] = None,
          **settings: Any) -> Report:
    """Audit ``model`` at initialisation and return a :class:`~initlint.report.findings.Report`.

    ``example_inputs`` may be a tensor, a tuple of positional inputs or a dict of keyword
    inputs; when omitted, a probe batch is inferred from the first layer that reads the
    input. The model is never changed: capture and probe run under
    :func:`initlint.probe.guard.guarded`, so parameters, buffers and module attributes (the same
    objects, bits and version counters), training flags, gradients, hooks, the RNG states
    and the global modes are all as before when this returns, or raises.

    A model on the ``meta`` device is audited block by block on ``device`` (default CPU; pass
    ``device="meta"`` for the graph rules only), each block initialised by ``init(module)``
    when given, else by the model's own init, and ``progress`` (a function of one
    :class:`~initlint.scale.stream.BlockProgress`) hears of every block; see :mod:`initlint.scale.stream`.

    ``optimizer``: the ``torch.optim.Optimizer`` the model will train with (over its parameters), or a
    callable ``model -> Optimizer``. initlint then takes one real step of that optimizer's class with
    its param groups and state on a private copy (:mod:`initlint.probe.step`), with the gradients of
    ``loss(output, inputs)`` when given, else of the model's own ``.loss``, else of cross-entropy
    against random labels when the output is logits, else of the probe's random direction; the
    optimizer itself is only read. ``precision`` (``"fp16"``, ``"bf16"`` or None) and ``grad_scaler``
    (fp16 training with ``torch.amp.GradScaler``) say how the model will train: with a precision the probe
    runs once more under ``torch.autocast`` at that dtype (:mod:`initlint.probe.precision`).
    ``clip_grad_norm`` or ``clip_grad_value``: the gradient clipping training applies before each step
    (``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)``, ``clip_grad_value_``); the first step
    is taken on gradients clipped so. ``batches_per_step``: how many batches like the probe's the run's optimizer
    step averages over, its global batch over the probe's batch (default 1; the training callbacks pass gradient
    accumulation steps x data-parallel ranks). An SGD step is the gradient, whose noise on one batch is larger
    than on the run's mean of several: update-scale judges it so.
    """
    from .inputs.config import apply_settings

    options = apply_settings(dict(select=select, ignore=ignore, logits=logits, seed=seed, batch_size=batch_size,
                                  rule_options=rule_options, device=device, input_shapes=input_shapes), settings)
    if not isinstance(model, nn.Module) and not hasattr(model, "_orig_mod"):
        raise UsageError(f"initlint.audit expects an nn.Module, got {type(model).__name__}")
    user_model = unwrap(model)
    wrapped_ddp = _ddp_wrapped(model)
    report = Report(model=name or type(user_model).__name__, target=target)
    codes = select_rules(options["select"], options["ignore"], options.get("extend_select"))
    if RULE_ERROR not in codes and RULE_ERROR in select_rules(None, options["ignore"]):
        codes = codes + [RULE_ERROR]  # a selected rule's crash stays visible unless its code is ignored
    rules = _instantiate(codes, options["rule_options"] or {})
    streamed = _streamed(user_model, options["device"], init)
    sharded = not streamed and _sharded(user_model)
    dev = resolve_device(options["device"] or ("cpu" if streamed else None), user_model)
    report.device = str(dev)
    precision = check_precision(precision, grad_scaler, dev)
    from .probe.step import check_clipping, request_for, resolve_optimizer

    user_optimizer = resolve_optimizer(optimizer, user_model)
    if user_optimizer is None and precision is None and loss is not None:
        raise UsageError("loss= is used for the first step of an optimizer and the precision probe; pass "
                         "optimizer= or precision= too")
    clip_norm, clip_value = check_clipping(clip_grad_norm, clip_grad_value)
    batches = 1 if batches_per_step is None else check_batches_per_step(batches_per_step)
    if user_optimizer is None and (clip_norm is not None or clip_value is not None or batches > 1):
        which = "clip_grad_norm" if clip_norm is not None else "clip_grad_value" if clip_value is not None \
            else "batches_per_step"
        raise UsageError(f"{which} (--{which.replace('_', '-')}) is a setting of an optimizer's first step, and no "
                         f"optimizer was given (optimizer=, --optimizer, or initlint_optimizer in the target file)")
    step = None if user_optimizer is None else request_for(user_optimizer, user_model, loss, int(options["seed"]),
                                                           clip_norm, clip_value, batches)
    work = user_model
    if dev != model_device(user_model) and model_device(user_model).type != "meta":
        work = copy.deepcopy(user_model).to(dev)  # the user's model stays where it is
    elif _has_lazy_parameters(user_model):
        work = copy.deepcopy(user_model)  # a forward would materialise the user's lazy modules
        report.notes.append("the model has lazy modules: audited a copy, materialised by the probe batch")
    if isinstance(work, torch.jit.ScriptModule):
        report.notes.append("the model is a TorchScript module: its ops run outside Python, so initlint sees "
                            "only its inputs and outputs; audit the nn.Module before torch.jit.script")
    is_meta = model_device(work).type == "meta" and not streamed
    args, kwargs = _probe_inputs(work, example_inputs, options["input_shapes"], options, None if is_meta else dev)
    inferred = example_inputs is None and not options["input_shapes"]
    bad_batch = None
    if not is_meta:
        args, kwargs = _real_inputs((args, kwargs), int(options["seed"]), report, dev)
        args, kwargs = move_inputs(args, dev), move_inputs(kwargs, dev)
        try:
            check_finite(args, kwargs)
        except LoadError as exc:
            if not sharded:
                raise
            bad_batch = exc  # one rank's batch: every rank raises it, from the sharded probe's first collective
    needs = set().union(*(r.needs for r in rules)) if rules else set()
    if step is not None and (streamed or sharded or is_meta):
        report.notes.append("the first step of the optimizer is taken only for a model audited whole on a real "
                            "device: the rules that read it did not run")
        step = None
    if streamed:
        from .scale.stream import stream_probe

        cap, probe = stream_probe(work, args, kwargs, device=dev, init=init, seed=int(options["seed"]),
                                  logits=options["logits"], backward="gradients" in needs, notes=report.notes,
                                  progress=progress)
    elif sharded:
        from .scale.distributed import sharded_probe

        cap, probe = sharded_probe(work, args, kwargs, device=dev, seed=int(options["seed"]),
                                   logits=options["logits"], backward="gradients" in needs, notes=report.notes,
                                   progress=progress, failed=bad_batch)
    else:
        layouts = other_layouts(work, kwargs, int(options["seed"])) if inferred and not args else iter(())
        cap, probe, (args, kwargs) = _capture_and_probe(work, args, kwargs, options, needs, is_meta, report, step,
                                                        layouts)
    work = cap.model  # the streamed and sharded audits ran on a plain copy: the user's classes, global shapes
    probe.seal()
    report.capture, report.graph, report.probe = cap.name, cap.graph, probe
    cap.finish()  # already done by the probe's forward pass, unless it raised before
    precise = None
    if precision is not None and "precision" in needs:
        precise = _precision_probe(cap, args, kwargs, precision, grad_scaler, probe, int(options["seed"]),
                                   skipped=streamed or sharded or is_meta, notes=report.notes, loss=loss)
    ctx = AuditContext(model=work, graph=cap.graph, probe=probe, logits=bool(options["logits"]),
                       precision=precision, grad_scaler=bool(grad_scaler), ddp=wrapped_ddp,
                       precision_probe=precise)
    if step is not None:
        from .probe.step import first_step

        ctx.step = report.step = first_step(step, cap.model)
        report.notes.extend(ctx.step.notes)
    findings = _run_rules(rules, ctx, probe, is_meta, codes)
    probe.release()
    findings = apply_suppressions(findings, work, options.get("per_module_ignores"), codes)
    report.findings = group_runs(link_findings(findings, cap.graph))
    report.notes.extend(probe.notes)
    return report


def _precision_probe(cap: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], precision: str, grad_scaler: bool,
                     probe: ProbeResult, seed: int, skipped: bool, notes: List[str], loss: Any = None) -> Any:
    """The autocast pass (:func:`initlint.probe.precision.run_precision_probe`) under the state guard."""
    from .probe.precision import run_precision_probe

    if skipped:
        notes.append(f"the precision probe ({precision}) runs on models audited whole, not block by block or "
                     f"sharded: precision-headroom was not checked")
        return None
    try:
        with guarded(cap.model, seed, (args, kwargs)):
            stats = run_precision_probe(cap, args, kwargs, precision, grad_scaler=grad_scaler,
                                        logits=probe.logits is not None, seed=seed, loss=loss)
    except (UsageError, KeyboardInterrupt):
        raise
    except Exception as exc:  # a kernel without a half-precision version on this device, a dtype check in forward
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        notes.append(f"the model's forward or backward under torch.autocast ({precision}) raised "
                     f"{type(exc).__name__}: {first}; precision-headroom was not checked")
        return None
    notes.extend(stats.notes)
    return stats


def _real_inputs(inputs: Any, seed: int, report: Report, device: torch.device) -> Any:
    """Example inputs on the meta device carry shapes, not values: floats get standard-normal values and
    masks (bool) ones, of the same shapes and dtypes, on ``device``; integers (token ids) cannot be made up."""
    from .capture import nested
    from .probe import draw

    if not any(t.device.type == "meta" for t in nested.tensors(inputs)):
        return inputs
    gen = draw.generator(device, seed) if device.type != "meta" else None
    gen = gen if gen is not None else torch.Generator().manual_seed(seed)

    def real(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta":
            return t
        if t.is_floating_point() or t.is_complex():
            return torch.randn(t.shape, generator=gen, device=gen.device, dtype=t.dtype)
        if t.dtype == torch.bool:
            return torch.ones(t.shape, dtype=torch.bool, device=gen.device)
        raise UsageError(f"an example input of shape {tuple(t.shape)} and dtype {t.dtype} is on the meta device, "
                         f"which holds no values to probe with; pass real inputs (token ids, indices) for it")

    report.notes.append("the example inputs are on the meta device: probed with standard-normal values of their "
                        "shapes and dtypes")
    return nested.map_tensors(real, inputs)


def _sharded(model: nn.Module) -> bool:
    """A model with DTensor parameters (FSDP2, tensor parallelism) is audited across its ranks."""
    from .scale.distributed import is_sharded

    return is_sharded(model)


def _streamed(model: nn.Module, device: Optional[str], init: Any) -> bool:
    """A model on the meta device is audited block by block, unless the meta device itself is asked for."""
    from .scale.distributed import is_sharded
    from .scale.stream import is_streamable

    if is_sharded(model) or not is_streamable(model):
        if init is not None:
            raise UsageError(f"init= is for a model on the meta device; this model's tensors are on "
                             f"{model_device(model)}")
        return False
    return device is None or str(device) != "meta"


def _has_lazy_parameters(model: nn.Module) -> bool:
    from torch.nn.parameter import UninitializedParameter

    return any(isinstance(p, UninitializedParameter) for p in model.parameters())


def _instantiate(codes: List[str], rule_options: Dict[str, Dict[str, Any]]) -> list:
    """The selected rules and the rules they use, instantiated with their options, in run order."""
    registry = all_rules()
    by_name = {cls.name: code for code, cls in registry.items()}
    for key in rule_options:
        if key not in registry and key not in by_name:
            raise UsageError(f"options given for unknown rule '{key}'")
    rules = []
    for cls in with_uses(codes):
        opts = {**rule_options.get(cls.name, {}), **rule_options.get(cls.code, {})}
        try:
            rules.append(cls(**opts))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return rules


def _probe_inputs(model: nn.Module, example: Any, shapes: Optional[Sequence[Tuple[int, ...]]],
                  options: Dict[str, Any], device: Optional[torch.device]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """The example inputs, or a probe batch drawn on ``device`` (the host when None: a model on ``meta``)."""
    if example is not None:
        return normalise_inputs(example)
    seed = int(options["seed"])
    if shapes:
        return shaped_inputs(shapes, model, seed, device), {}
    lazy = _first_lazy_module(model)
    if lazy is not None:
        raise LoadError(f"cannot infer a probe input for {type(model).__name__}: {type(lazy[1]).__name__} at "
                        f"'{lazy[0]}' learns its input size from the first batch; pass --input-shape or example_inputs")
    return infer_inputs(model, int(options["batch_size"] or DEFAULT_BATCH), seed, device)


def _first_lazy_module(model: nn.Module) -> Optional[Tuple[str, nn.Module]]:
    from torch.nn.parameter import UninitializedParameter

    for path, module in model.named_modules():
        if any(isinstance(p, UninitializedParameter) for p in module.parameters(recurse=False)):
            return path, module
    return None


def _capture_and_probe(model: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], options: Dict[str, Any],
                       needs: set, is_meta: bool, report: Report, step: Any = None,
                       layouts: Iterable[Tuple[str, Dict[str, Any]]] = ()):
    """Capture and probe inside the state guard: fx first, then the runtime capture; returns the capture,
    the probe and the inputs probed with.

    Each attempt runs in its own guard, so what a failed fx trace or probe left behind (a
    half-updated buffer, an fx Proxy registered as a buffer) is undone before the next one. Where the
    forward refuses inferred inputs' sizes, each of ``layouts`` (:func:`~initlint.inputs.hf.other_layouts`)
    is tried in turn, and the one that runs is named in a note."""
    if is_meta:
        with guarded(model, int(options["seed"])):
            cap = capture(model)
            probe = run_probe(cap, args, kwargs, forward=False)
        report.notes.append("the model is on the meta device (its tensors hold no values): only graph rules ran; "
                            "materialise it with model.to_empty(device='cpu') and initialise it for a full audit")
        return cap, probe, (args, kwargs)
    tries = itertools.chain([("", kwargs)], layouts)  # each layout made only if the one before was refused
    refused: Optional[ForwardFailed] = None
    notes = len(report.notes)
    for described, kw in tries:
        try:
            cap, probe = _capture_and_probe_once(model, args, kw, options, needs, report, step)
        except ForwardFailed as failed:
            del report.notes[notes:]  # the fx attempt's note on inputs that did not run
            if (refused is None and not failed.about_inputs) or failed.ours:
                raise failed.as_load_error(model, args, kw) from None
            refused = refused or failed  # a refused layout: the next one, and in the end the first refusal
            continue
        except LoadError:
            if refused is None:
                raise
            del report.notes[notes:]  # another layout that cannot run here (out of memory at a batch of 1)
            continue
        if refused is not None:
            report.notes.insert(notes, f"the model's forward refused the inferred inputs "
                                       f"{describe_inputs(args, kwargs)} ({refused.reason}); probed with {described}")
        return cap, probe, (args, kw)
    assert refused is not None
    raise refused.as_load_error(model, args, kwargs) from None


def _capture_and_probe_once(model: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], options: Dict[str, Any],
                            needs: set, report: Report, step: Any = None):
    """One capture and probe on these inputs; raises :class:`ForwardFailed` where the runtime capture's
    forward raised."""
    seed = int(options["seed"])
    # logits None: judged as logits when the output says so (a `logits` field, a tied head)
    run = dict(logits=options["logits"], backward="gradients" in needs or step is not None, report=report, step=step)
    reasons: List[str] = []
    attempts = [("fx", True), ("runtime", True)]  # (backend, copy-on-write stand-ins for the parameters)
    known = untraceable(model)
    if known is not None:  # no trace to try, and no state guard around it
        reasons.append(f"fx: {known}")
        attempts.pop(0)
    while attempts:
        backend, lazy = attempts.pop(0)
        try:
            with guarded(model, seed, (args, kwargs), copy_on_write=lazy):
                cap = BACKENDS[backend](model)
                cap.fallback_reasons = reasons
                return cap, probe_retrying(cap, args, kwargs, **run)
        except CaptureError as exc:  # fx only: the runtime capture accepts every module
            reasons.append(f"{backend}: {exc}")
        except ForwardFailed as failed:
            if failed.copy_on_write and lazy:
                attempts.insert(0, (backend, False))  # a kernel that mishandles copy-on-write tensors
            elif backend == "runtime":
                raise
            else:
                report.notes.append(f"the fx-traced graph failed to run ({failed.reason}); used the runtime capture")
    raise AssertionError("unreachable: the runtime capture either returns or raises")


def _run_rules(rules, ctx: AuditContext, probe: ProbeResult, is_meta: bool, selected: List[str]) -> List[Finding]:
    """Run the rules in order; a rule that only serves another (through ``uses``) is not reported."""
    findings: List[Finding] = []
    error_rule = all_rules()[RULE_ERROR]
    report_errors = RULE_ERROR in selected
    if report_errors:
        findings.extend(error_rule.make("", problem, "fix or uninstall the plugin; the built-in rules still ran")
                        for problem in plugin_errors())
    for rule in rules:
        if is_meta and rule.needs - {"graph"}:
            continue
        if "gradients" in rule.needs and not probe.backward_ran:
            continue
        if "step" in rule.needs and ctx.step is None:
            continue
        try:
            found = list(rule.check(ctx))
        except Exception as exc:  # one broken rule must not hide the others' findings
            found = []
            if report_errors and rule.code in selected:
                findings.append(error_rule.make("", f"{rule.code} ({rule.name}) could not run: {type(exc).__name__}: {exc}",
                                                "please report this with the model that triggers it"))
        ctx.results[rule.code] = found
        if rule.code in selected:
            findings.extend(found)
    return findings


def check_batches_per_step(value: Any) -> int:
    """The batches the run's step averages over, as an integer from 1; :class:`UsageError` (one sentence) otherwise."""
    from .probe.step import shown, whole_number

    number = whole_number(value)
    if number is None or number > MAX_BATCHES_PER_STEP:
        raise UsageError(f"batches_per_step must be a whole number from 1 to {MAX_BATCHES_PER_STEP} (the batches like "
                         f"the probe's that the run's optimizer step averages over), not {shown(value)}")
    return number
