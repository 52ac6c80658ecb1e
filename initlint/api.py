"""The pipeline: load -> capture -> probe -> rules -> report, behind :func:`audit`."""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from . import locate
from .capture import RuntimeCapture, capture
from .link import link_findings
from .load import (DEFAULT_BATCH, LoadError, check_finite, infer_inputs, move_inputs, normalise_inputs,
                   shaped_inputs)
from .probe import ProbeResult, preserved, run_probe
from .report import Finding, Report, group_runs
from .rules import Audit, all_rules, select_rules
from .suppress import apply_suppressions


RULE_ERROR = "IL000"
"""The code :func:`_run_rules` reports a rule's crash under (documented in ``rules/il000_rule_error.py``)."""


class UsageError(LoadError):
    """Bad arguments to :func:`audit` (unknown device, rule code, option)."""


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


def model_device(model: nn.Module) -> torch.device:
    """Device of the model's first parameter or buffer (CPU for a model with neither)."""
    for tensors in (model.parameters(), model.buffers()):
        for t in tensors:
            return t.device
    return torch.device("cpu")


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
          progress: Optional[Callable[[Any], None]] = None, **settings: Any) -> Report:
    """Audit ``model`` at initialisation and return a :class:`~initlint.report.Report`.

    ``example_inputs`` may be a tensor, a tuple of positional inputs or a dict of keyword
    inputs; when omitted, a probe batch is inferred from the first layer that reads the
    input. The model is never changed: parameters, buffers, training flags, gradients,
    hooks, the RNG state and the grad mode are all as before when this returns.

    A model on the ``meta`` device is audited block by block on ``device`` (default CPU; pass
    ``device="meta"`` for the graph rules only), each block initialised by ``init(module)``
    when given, else by the model's own init, and ``progress`` (a function of one
    :class:`~initlint.stream.BlockProgress`) hears of every block; see :mod:`initlint.stream`.
    """
    from .config import apply_settings

    options = apply_settings(dict(select=select, ignore=ignore, logits=logits, seed=seed, batch_size=batch_size,
                                  rule_options=rule_options, device=device), settings)
    if not isinstance(model, nn.Module) and not hasattr(model, "_orig_mod"):
        raise UsageError(f"initlint.audit expects an nn.Module, got {type(model).__name__}")
    user_model = unwrap(model)
    report = Report(model=name or type(user_model).__name__, target=target)
    codes = select_rules(options["select"], options["ignore"])
    if RULE_ERROR not in codes and RULE_ERROR in select_rules(None, options["ignore"]):
        codes = codes + [RULE_ERROR]  # a selected rule's crash stays visible unless IL000 is ignored
    rules = _instantiate(codes, options["rule_options"] or {})
    streamed = _streamed(user_model, options["device"], init)
    sharded = not streamed and _sharded(user_model)
    dev = resolve_device(options["device"] or ("cpu" if streamed else None), user_model)
    report.device = str(dev)
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
    args, kwargs = _probe_inputs(work, example_inputs, input_shapes, options, is_meta)
    if not is_meta:
        args, kwargs = move_inputs(args, dev), move_inputs(kwargs, dev)
        check_finite(args, kwargs)
    needs = set().union(*(r.needs for r in rules)) if rules else set()
    if streamed:
        from .stream import stream_probe

        cap, probe = stream_probe(work, args, kwargs, device=dev, init=init, seed=int(options["seed"]),
                                  logits=bool(options["logits"]), backward="gradients" in needs, notes=report.notes,
                                  progress=progress)
    elif sharded:
        from .distributed import sharded_probe

        cap, probe = sharded_probe(work, args, kwargs, device=dev, seed=int(options["seed"]),
                                   logits=bool(options["logits"]), backward="gradients" in needs, notes=report.notes,
                                   progress=progress)
    else:
        cap, probe = _capture_and_probe(work, args, kwargs, options, needs, is_meta, report)
    work = cap.model  # the streamed and sharded audits ran on a plain copy: the user's classes, global shapes
    report.capture, report.graph, report.probe = cap.name, cap.graph, probe
    cap.graph.module_locations = locate.module_locations(work)
    ctx = Audit(model=work, graph=cap.graph, probe=probe, logits=bool(options["logits"]))
    findings = _run_rules(rules, ctx, probe, is_meta)
    findings = apply_suppressions(findings, work, options.get("per_module_ignores"), codes)
    report.findings = group_runs(link_findings(findings, cap.graph))
    report.notes.extend(probe.notes)
    return report


def _sharded(model: nn.Module) -> bool:
    """A model with DTensor parameters (FSDP2, tensor parallelism) is audited across its ranks."""
    from .distributed import is_sharded

    return is_sharded(model)


def _streamed(model: nn.Module, device: Optional[str], init: Any) -> bool:
    """A model on the meta device is audited block by block, unless the meta device itself is asked for."""
    from .distributed import is_sharded
    from .stream import is_streamable

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
    registry = all_rules()
    by_name = {cls.name: code for code, cls in registry.items()}
    for key in rule_options:
        if key not in registry and key not in by_name:
            raise UsageError(f"options given for unknown rule '{key}'")
    rules = []
    for code in codes:
        cls = registry[code]
        opts = {**rule_options.get(cls.name, {}), **rule_options.get(code, {})}
        try:
            rules.append(cls(**opts))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return rules


def _probe_inputs(model: nn.Module, example: Any, shapes: Optional[Sequence[Tuple[int, ...]]],
                  options: Dict[str, Any], is_meta: bool) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    if example is not None:
        return normalise_inputs(example)
    seed = int(options["seed"])
    if shapes:
        return shaped_inputs(shapes, model, seed), {}
    return infer_inputs(model, int(options["batch_size"] or DEFAULT_BATCH), seed)


def _capture_and_probe(model: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], options: Dict[str, Any],
                       needs: set, is_meta: bool, report: Report):
    cap = capture(model)
    backward = "gradients" in needs
    if is_meta:
        report.notes.append("the model is on the meta device (its tensors hold no values): only graph rules ran; "
                            "materialise it with model.to_empty(device='cpu') and initialise it for a full audit")
        return cap, run_probe(cap, args, kwargs, forward=False)
    logits = bool(options["logits"])
    try:
        with preserved(model, int(options["seed"])):
            return cap, _probe_retrying(cap, args, kwargs, logits, backward, report)
    except _ForwardFailed as first:
        if cap.name == "runtime":
            raise first.as_load_error(args, kwargs) from None
        report.notes.append(f"the fx-traced graph failed to run ({first.reason}); used the runtime capture")
    cap = RuntimeCapture(model)
    try:
        with preserved(model, int(options["seed"])):
            return cap, _probe_retrying(cap, args, kwargs, logits, backward, report)
    except _ForwardFailed as again:
        raise again.as_load_error(args, kwargs) from None


class _ForwardFailed(Exception):
    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        self.ours = _raised_by_initlint(exc)

    def as_load_error(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> LoadError:
        if self.ours:
            return LoadError(f"initlint's probe failed with {self.reason} on the probe input "
                             f"{describe_inputs(args, kwargs)}; this is a bug in initlint, please report it")
        return LoadError(f"the model's forward raised {self.reason} on the probe input {describe_inputs(args, kwargs)}; "
                         f"pass matching --input-shape or example_inputs")


def _raised_by_initlint(exc: BaseException) -> bool:
    """True when the innermost frame outside torch that raised belongs to initlint, not to the model."""
    import os
    import traceback

    own = os.path.dirname(os.path.abspath(__file__))
    torch_dir = os.path.dirname(torch.__file__)
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.startswith(torch_dir):
            continue
        return frame.filename.startswith(own) and not frame.filename.startswith(os.path.join(own, "capture"))
    return False


def _probe_retrying(cap, args, kwargs, logits: bool, backward: bool, report: Report) -> ProbeResult:
    """Run the probe; on out-of-memory, halve the batch (down to 1) and say so."""
    while True:
        try:
            return run_probe(cap, args, kwargs, logits=logits, backward=backward)
        except (LoadError, KeyboardInterrupt):
            raise
        except Exception as exc:
            if not _out_of_memory(exc):
                raise _ForwardFailed(exc) from None
        smaller = _halve_batch(args, kwargs)
        if smaller is None:
            raise LoadError("the probe ran out of memory even with a batch of 1; try --device cpu")
        args, kwargs = smaller
        report.notes.append(f"the probe ran out of memory; retried with a batch of {_batch_of(args, kwargs)}")


def _out_of_memory(exc: BaseException) -> bool:
    """CUDA/MPS raise ``torch.OutOfMemoryError``; the CPU allocator a plain RuntimeError."""
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(exc))


def _batch_of(args, kwargs) -> int:
    from .capture.runtime import _tensors

    tensors = _tensors((args, kwargs))
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() else 0


def _halve_batch(args, kwargs):
    batch = _batch_of(args, kwargs)
    if batch <= 1:
        return None
    half = batch // 2

    def cut(obj):
        if isinstance(obj, torch.Tensor):
            return obj[:half] if obj.dim() and obj.shape[0] == batch else obj
        if isinstance(obj, (tuple, list)):
            return type(obj)(cut(o) for o in obj)
        if isinstance(obj, dict):
            return {k: cut(v) for k, v in obj.items()}
        return obj

    return cut(args), cut(kwargs)


def describe_inputs(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> str:
    """``(16, 3, 32, 32)`` / ``input_ids=(16, 16) int64``: what the probe tried."""
    def one(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            shape = "(" + ", ".join(str(s) for s in v.shape) + ("," if v.dim() == 1 else "") + ")"
            return shape if v.is_floating_point() else f"{shape} {str(v.dtype).replace('torch.', '')}"
        return type(v).__name__
    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return ", ".join(parts) or "(no inputs)"


def _run_rules(rules, ctx: Audit, probe: ProbeResult, is_meta: bool) -> List[Finding]:
    findings: List[Finding] = []
    report_errors = any(rule.code == RULE_ERROR for rule in rules)
    for rule in rules:
        if is_meta and rule.needs - {"graph"}:
            continue
        if "gradients" in rule.needs and not probe.backward_ran:
            continue
        try:
            findings.extend(rule.check(ctx))
        except Exception as exc:  # one broken rule must not hide the others' findings
            if not report_errors:
                continue
            findings.append(Finding(code=RULE_ERROR, name="rule-error", severity="info", module="",
                                    message=f"{rule.code} ({rule.name}) could not run: {type(exc).__name__}: {exc}",
                                    fix="please report this with the model that triggers it"))
    return findings
