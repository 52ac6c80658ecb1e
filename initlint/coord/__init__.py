"""Stage ``coord``: the coordinate check over model sizes behind :func:`initlint.sweep`.

``run.py`` builds the model at each width and depth, takes a few optimizer steps and measures each
layer's scale; ``report.py`` holds :class:`SweepReport` (table, text, JSON, SARIF, coordinate plots).
The measurements are typed records of the probe stage (``initlint/probe/coords.py``), judged by the
sweep rules (width-unstable, depth-unstable).
"""
from .report import SweepReport
from .run import sweep

__all__ = ["sweep", "SweepReport"]
