"""initlint: a linter for PyTorch models at initialisation.

``initlint.audit(model)`` captures the model's graph, runs one probe batch forward and
backward, applies the rules and returns a :class:`Report` whose findings each carry the
measured value, the threshold and a fix. ``initlint.sweep(factory, width=..., depth=...)`` builds
the model at several sizes and flags the layers whose scale grows with width or depth.

Names are imported lazily so that ``initlint check`` on files without models never
imports torch.
"""
from typing import Any

from .version import __version__

__all__ = ["audit", "fix", "sweep", "SweepReport", "FixReport", "Report", "Finding", "LoadError", "UsageError", "ignore", "__version__"]

_LAZY = {"audit": "api", "UsageError": "errors", "Report": "report", "Finding": "report", "LoadError": "errors",
         "ignore": "rules.suppress", "fix": "repair", "FixReport": "repair", "sweep": "coord",
         "SweepReport": "coord"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        if _LAZY[name] != "errors":
            importlib.import_module(".compat", __name__)  # one sentence on a torch older than initlint supports
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'initlint' has no attribute '{name}'")
