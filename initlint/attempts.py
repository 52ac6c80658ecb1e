"""Running the probe and explaining what went wrong: out-of-memory retries with a smaller batch,
and one sentence for a forward that raised (the model's fault, initlint's, or a batch too small
for BatchNorm in training mode)."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from .capture import nested
from .compat import out_of_memory
from .errors import LoadError
from .probe.run import ProbeResult, run_probe
from .report.findings import Report
from .rules import all_rules
from .inputs.usercode import user_frame


def model_device(model: nn.Module) -> torch.device:
    """Device of the model's first parameter or buffer (CPU for a model with neither)."""
    for tensors in (model.parameters(), model.buffers()):
        for t in tensors:
            return t.device
    return torch.device("cpu")


class ForwardFailed(Exception):
    """The probe's forward (or backward) raised: why, whose code raised it, and what to tell the user."""

    def __init__(self, exc: BaseException, backend: str) -> None:
        super().__init__(str(exc))
        self.backend = backend
        self.reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        self.ours = _raised_by_initlint(exc)
        self.one_per_channel = isinstance(exc, ValueError) and "Expected more than 1 value per channel" in str(exc)
        self.copy_on_write = "COW" in str(exc)
        self.about_inputs = isinstance(exc, (RuntimeError, ValueError, TypeError, IndexError)) and bool(
            _INPUT_MISMATCH.search(str(exc)))
        self.where = user_frame(exc)

    def as_load_error(self, model: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> LoadError:
        inputs = describe_inputs(args, kwargs)
        if self.ours:
            return LoadError(f"initlint's probe failed with {self.reason} on the probe input "
                             f"{inputs}; this is a bug in initlint, please report it")
        if self.one_per_channel:
            return LoadError(_one_value_per_channel(model, inputs))
        if self.about_inputs:
            return LoadError(f"the model's forward raised {self.reason} on the probe input {inputs}; "
                             f"pass matching --input-shape or example_inputs")
        return LoadError(f"the model's forward raised {self.reason}{self.where} on the probe input {inputs}")


_INPUT_MISMATCH = re.compile(
    r"shape|size|dimension|\bdims?\b|channels|mat1 and mat2|must match|to unpack|out of range|out of bounds"
    r"|positional argument|keyword argument|expected .*input", re.IGNORECASE)
"""What a forward says when its inputs do not fit it (sizes, number of dimensions, of channels or of
arguments, token ids beyond the vocabulary): only then is ``--input-shape`` the advice."""


def _one_value_per_channel(model: nn.Module, inputs: str) -> str:
    """The probe runs every module in training mode, where BatchNorm needs a batch of 2 or more."""
    from torch.nn.modules.batchnorm import _BatchNorm

    in_eval = any(isinstance(m, _BatchNorm) and not m.training for m in model.modules())
    why = ("the probe runs every module in training mode (this model is in eval mode), where BatchNorm"
           if in_eval else "BatchNorm in training mode")
    return (f"the probe input {inputs} gives BatchNorm one value per channel: {why} needs at least 2; "
            f"pass a batch of 2 or more with --batch-size, --input-shape or example_inputs")


def _raised_by_initlint(exc: BaseException) -> bool:
    """True when the innermost frame outside torch that raised belongs to initlint, not to the model."""
    import os
    import traceback

    own = os.path.dirname(os.path.abspath(__file__))  # the initlint package
    torch_dir = os.path.dirname(torch.__file__)
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.startswith(torch_dir):
            continue
        return frame.filename.startswith(own) and not frame.filename.startswith(os.path.join(own, "capture"))
    return False


def probe_retrying(cap, args, kwargs, logits: Optional[bool], backward: bool, report: Report,
                   step: Optional[Any] = None) -> ProbeResult:
    """Run the probe; on out-of-memory, halve the batch (down to 1) and say so."""
    while True:
        try:
            return run_probe(cap, args, kwargs, logits=logits, backward=backward, step=step)
        except (LoadError, KeyboardInterrupt):
            raise
        except Exception as exc:
            if not out_of_memory(exc):
                raise ForwardFailed(exc, cap.name) from None
        smaller = _halve_batch(args, kwargs)
        if smaller is None:
            raise LoadError(_out_of_memory_at_smallest(model_device(cap.model), backward, _batch_of(args, kwargs)))
        args, kwargs = smaller
        report.notes.append(f"the probe ran out of memory; retried with a batch of {_batch_of(args, kwargs)}")


def _out_of_memory_at_smallest(device: torch.device, backward: bool, batch: int) -> str:
    """What to try when the smallest batch does not fit: the CPU only when the probe was elsewhere."""
    batch_text = ("even with a batch of 1" if batch <= 1 else
                  f"with a batch of {batch}, which cannot be halved for these inputs (pass a smaller one)")
    if device.type != "cpu":
        return f"the probe ran out of memory {batch_text} on {device}; try --device cpu"
    hint = (f"; without the backward probe it needs less: --ignore {','.join(_gradient_rules())}" if backward else "")
    return f"the probe ran out of memory {batch_text} on the CPU, which has too little free memory for it{hint}"


def _gradient_rules() -> List[str]:
    return [code for code, rule in all_rules().items() if "gradients" in rule.needs]


def _batch_of(args, kwargs) -> int:
    found = nested.tensors((args, kwargs))
    return int(found[0].shape[0]) if found and found[0].dim() else 0


def _halve_batch(args, kwargs):
    """The inputs with half the batch, or None when it cannot shrink (a batch of 1, a packed
    sequence or another structure whose batch is not the leading dimension of a dense tensor)."""
    batch = _batch_of(args, kwargs)
    if batch <= 1:
        return None
    half = batch // 2

    def cut(t):
        if not isinstance(t, torch.Tensor):  # a packed sequence stays whole
            return t
        dense = t.layout == torch.strided and not t.is_nested
        return t[:half] if dense and t.dim() and t.shape[0] == batch else t

    smaller = nested.map_tensors(cut, args), nested.map_tensors(cut, kwargs)
    return smaller if _batch_of(*smaller) < batch else None


def describe_inputs(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> str:
    """``(16, 3, 32, 32)`` / ``input_ids=(16, 16) int64``: what the probe tried."""
    def one(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            shape = "(" + ", ".join(str(s) for s in v.shape) + ("," if v.dim() == 1 else "") + ")"
            return shape if v.is_floating_point() else f"{shape} {str(v.dtype).replace('torch.', '')}"
        return type(v).__name__
    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return ", ".join(parts) or "(no inputs)"
