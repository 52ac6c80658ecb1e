"""The signal profile of a model at initialisation, as four panels against depth.

``report.plot("signal.png")`` (or ``initlint check ... --plot signal.png``) draws, for each
measured op in execution order: the activation std of weight-layer and activation outputs,
the dead-unit fraction of ReLU ops, the saturated fraction of bounded activations and the
gradient std of each weight. Layers named by a warning or error are marked in red.
matplotlib is an optional dependency (``pip install 'initlint[plot]'``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Set, Tuple

from ..capture import ops as O


class PlotError(Exception):
    """Plotting is not possible; the message is one sentence for the user."""


@dataclass
class Series:
    """One line of a panel: x positions (depth), values, and which points belong to flagged modules."""

    label: str
    depth: List[int] = field(default_factory=list)
    values: List[float] = field(default_factory=list)
    modules: List[str] = field(default_factory=list)
    flagged: List[bool] = field(default_factory=list)

    def add(self, depth: int, value: float, module: str, flagged: bool) -> None:
        """Append one point."""
        self.depth.append(depth)
        self.values.append(float(value))
        self.modules.append(module)
        self.flagged.append(flagged)

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class Panel:
    """One subplot: its title, y axis and the series it shows."""

    key: str
    title: str
    ylabel: str
    log: bool
    series: tuple


PANELS = (
    Panel("activation", "activation std", "std (log)", True, ("weight layers", "activations")),
    Panel("dead", "dead ReLU units", "fraction dead", False, ("relu",)),
    Panel("saturated", "saturated bounded activations", "fraction saturated", False, ("saturated",)),
    Panel("gradient", "weight gradient std", "std (log)", True, ("weight gradients",)),
)
"""The four panels, top to bottom; ``series`` names the :func:`signal_series` keys each one draws."""
UPDATE_PANEL = Panel("update", "first-step update ratio, rms(update) / rms(weight)", "ratio (log)", True,
                     ("update ratio",))
"""A fifth panel when the audit took the optimizer's first step (``optimizer=``)."""


MAX_NAMED_TICKS = 40
"""Up to this many layers, the depth axis is labelled with module paths."""


def require_matplotlib() -> Any:
    """Import matplotlib with the Agg backend, or raise :class:`PlotError` saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise PlotError("plotting needs matplotlib, which is not installed; pip install 'initlint[plot]'") from None
    return matplotlib


def flagged_modules(report: Any) -> Set[str]:
    """Module paths named by a warning or error of the report (members of grouped findings included)."""
    return {m for f in report.findings if f.severity != "info" for m in (f.members or [f.module])}


def measured_ops(report: Any) -> List[Any]:
    """Weight-layer and activation ops that the probe measured, in execution order: the depth axis."""
    stats = report.probe.ops
    return [op for op in report.graph.ops if op.id in stats and "rms" in stats[op.id]
            and (op.kind in O.WEIGHT_KINDS or (op.kind in O.ACTIVATIONS and op.kind != "identity"))]


def signal_series(report: Any) -> Dict[str, Series]:
    """The plotted data: series name -> :class:`Series`, with depth = index in :func:`measured_ops`."""
    if report.graph is None or report.probe is None or not report.probe.forward_ran:
        raise PlotError(f"nothing to plot for {report.model}: the probe did not run a forward pass")
    flagged = flagged_modules(report)
    out = {name: Series(name) for panel in PANELS + (UPDATE_PANEL,) for name in panel.series}
    for depth, op in enumerate(measured_ops(report)):
        stats = report.probe.ops[op.id]
        hit = op.module in flagged
        out["weight layers" if op.kind in O.WEIGHT_KINDS else "activations"].add(depth, stats["rms"], op.module, hit)
        units = stats.get("units")
        if "dead" in stats and units:
            out["relu"].add(depth, stats["dead"] / units, op.module, hit)
        if "saturated" in stats:
            out["saturated"].add(depth, stats["saturated"], op.module, hit)
        grad = report.probe.grads.get(op.params.get("weight", ""), {})
        if op.kind in O.WEIGHT_KINDS and "std" in grad:
            out["weight gradients"].add(depth, grad["std"], op.module, hit)
        moved = report.step.params.get(op.params.get("weight", "")) if report.step is not None else None
        if op.kind in O.WEIGHT_KINDS and moved is not None and moved.ratio is not None:
            out["update ratio"].add(depth, moved.ratio, op.module, hit)
    return out


def panels(report: Any) -> Tuple[Panel, ...]:
    """The panels of ``report``'s figure: the update ratio's too when the optimizer's first step was taken."""
    return PANELS + ((UPDATE_PANEL,) if getattr(report, "step", None) is not None else ())


def depth_labels(layers: List[Any]) -> List[str]:
    """The name of each point on the depth axis: a module call by its path; a functional call
    (``torch.relu``) by what was called and where: its enclosing module, else its source line."""
    from ..capture.locate import shown_path

    labels = []
    for op in layers:
        if op.attrs.get("module_op"):
            labels.append(op.module or "<model>")
        elif op.module:
            labels.append(f"{op.module}: {op.target}")
        elif op.location:
            labels.append(f"{op.target} ({os.path.basename(shown_path(op.location[0]))}:{op.location[1]})")
        else:
            labels.append(op.target)
    return labels


def plot_signal(report: Any, path: str, *, dpi: int = 120) -> Dict[str, Series]:
    """Save the four-panel figure of ``report`` to ``path``; return the plotted series."""
    fig, series = signal_figure(report)
    try:
        fig.savefig(path, dpi=dpi)
    except OSError as exc:
        raise PlotError(f"cannot write {path}: {exc.strerror or exc}") from None
    return series


def signal_figure(report: Any) -> Tuple[Any, Dict[str, Series]]:
    """The four-panel figure of ``report`` (a matplotlib ``Figure`` that notebooks show inline) and its series."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    series = signal_series(report)
    layers = measured_ops(report)
    depth = len(layers)
    shown = panels(report)
    fig = _figure_class()(figsize=(9, 2.5 * len(shown)), constrained_layout=True)
    FigureCanvasAgg(fig)  # Agg, without touching pyplot's global backend
    axes = fig.subplots(len(shown), 1, sharex=True)
    for ax, panel in zip(axes, shown):
        _draw_panel(ax, panel, series, depth)
    axes[-1].set_xlabel("depth (measured weight layers and activations, in execution order)")
    if depth <= MAX_NAMED_TICKS:  # name the layers while the names still fit
        axes[-1].set_xticks(range(depth))
        axes[-1].set_xticklabels(depth_labels(layers), rotation=90, fontsize=7)
    fig.suptitle(f"{report.model}: signal at initialisation (red: flagged layers)")
    return fig, series


_FIGURE: List[Any] = []


def _figure_class() -> Any:
    """A matplotlib ``Figure`` that renders itself as PNG in IPython/Jupyter, with or without pyplot."""
    if not _FIGURE:
        from matplotlib.figure import Figure

        class SignalFigure(Figure):
            def _repr_png_(self) -> bytes:
                import io

                buffer = io.BytesIO()
                self.savefig(buffer, format="png", dpi=100)
                return buffer.getvalue()

        _FIGURE.append(SignalFigure)
    return _FIGURE[0]


_STYLE = {"weight layers": ("o", "tab:blue"), "activations": ("s", "tab:gray"), "relu": ("o", "tab:blue"),
          "saturated": ("o", "tab:blue"), "weight gradients": ("o", "tab:blue"), "update ratio": ("o", "tab:blue")}


def _draw_panel(ax: Any, panel: Panel, series: Dict[str, Series], depth: int) -> None:
    ax.set_title(panel.title, loc="left", fontsize=10)
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, alpha=0.3)
    ax.set_xlim(-0.5, max(depth, 1) - 0.5)
    drawn = False
    for name in panel.series:
        s = series[name]
        if not len(s):
            continue
        values = [v if not panel.log else max(v, 1e-30) for v in s.values]
        marker, colour = _STYLE[name]
        ax.plot(s.depth, values, marker=marker, color=colour, label=name, linewidth=1, markersize=4)
        red = [(d, v) for d, v, hit in zip(s.depth, values, s.flagged) if hit]
        if red:
            ax.scatter(*zip(*red), color="red", s=36, zorder=3)
        drawn = True
    if panel.log and drawn:
        ax.set_yscale("log")
    if not panel.log:
        ax.set_ylim(-0.02, 1.02)
    if drawn and len(panel.series) > 1:
        ax.legend(loc="best", fontsize=8)
    if not drawn:
        ax.text(0.5, 0.5, _EMPTY[panel.key], transform=ax.transAxes, ha="center", va="center", color="gray")


_EMPTY = {
    "activation": "no measured weight layers or activations",
    "dead": "no ReLU in the measured graph",
    "saturated": "no bounded activation (tanh, sigmoid, ...) in the measured graph",
    "gradient": "no gradient statistics: the backward probe did not run (no selected rule needs it)",
    "update": "no weight layer was stepped",
}
