"""Stage 2, capture: turn an ``nn.Module`` into the project's :class:`~initlint.capture.graph.Graph`.

Backends are tried in order. ``fx`` traces symbolically (no execution, module structure
kept); ``runtime`` records the dataflow while the probe batch runs (module hooks plus a
``TorchFunctionMode``) and so handles anything that can run a forward pass. A capture
object exposes ``name``, ``graph`` and ``run(args, kwargs, observe)``, which executes the
model once, calling ``observe(op, value)`` after every op.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Capture", "CaptureError", "Observer", "FxCapture", "RuntimeCapture", "capture", "BACKENDS"]

# Names load on first use: ``locate`` and ``nested`` serve stages that must not import torch
# (the command line's checks of its arguments), and importing them imports this package.
_LAZY = {"Capture": "base", "CaptureError": "base", "Observer": "base", "FxCapture": "fx",
         "RuntimeCapture": "runtime", "capture": "backends", "BACKENDS": "backends"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'initlint.capture' has no attribute '{name}'")
