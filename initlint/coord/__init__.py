"""Stage ``coord``: the coordinate check over model sizes behind :func:`initlint.sweep`.

``run.py`` builds the model at each width and depth, takes a few optimizer steps and measures each
layer's scale; ``report.py`` holds :class:`SweepReport` (table, text, JSON, SARIF, coordinate plots);
``command.py`` is ``initlint sweep``. The measurements are typed records of the probe stage
(``initlint/probe/coords.py``), judged by the sweep rules (width-unstable, depth-unstable).

``sweep`` and ``SweepReport`` are loaded on first use, so that the command line refuses a bad
argument before torch is imported.
"""
from typing import Any

__all__ = ["sweep", "SweepReport"]


def __getattr__(name: str) -> Any:
    if name == "sweep":
        from .run import sweep

        return sweep
    if name == "SweepReport":
        from .report import SweepReport

        return SweepReport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
