"""The result of a sweep: per-layer scales at every size and step, the fitted exponents, the findings;
as a table, text, JSON, SARIF and mup-style coordinate plots."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from ..output.formats import format_sarif
from ..probe.coords import INPUT_GRAD, Axis, Curve, SweepData
from ..report.findings import Finding, Report
from ..report.plot import PlotError, require_matplotlib
from ..report.table import findings_table
from ..rules.base import fmt
from ..version import __version__


@dataclass
class SweepReport:
    """What :func:`initlint.sweep` measured and found."""

    model: str
    data: SweepData
    findings: List[Finding] = field(default_factory=list)
    flagged: Set[Tuple[str, str, str]] = field(default_factory=set)
    """``(axis kind, layer, quantity)`` of the curves a finding names."""
    notes: List[str] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0
    """Wall time of the whole sweep (builds, steps and measurements)."""
    target: str = ""
    """What the command line was pointed at (``model.py:make_gpt``), if anything."""

    @property
    def clean(self) -> bool:
        """No warnings or errors."""
        return not [f for f in self.findings if f.severity != "info"]

    @property
    def failed(self) -> Dict[str, str]:
        """``keyword=size`` -> why that size could not be measured."""
        return {f"{a.keyword}={s}": why for a in self.data.axes for s, why in a.failed.items()}

    def codes(self) -> List[Tuple[str, str]]:
        """``(code, module)`` pairs of every finding."""
        return [(f.code, f.module) for f in self.findings]

    def curve(self, layer: str, quantity: str = "output", kind: Optional[str] = None) -> Optional[Curve]:
        """The curve of ``layer`` (pooled path) and ``quantity`` on the first axis (or the axis ``kind``) that has it."""
        for axis in self.data.axes:
            if kind in (None, axis.kind) and (layer, quantity) in axis.curves:
                return axis.curves[(layer, quantity)]
        return None

    # ------------------------------------------------------------------ text
    def table(self) -> str:
        """One table per axis: each layer's rms at every size, at init and after each step, with the fitted
        exponent of ``rms ~ size^alpha`` and its fit error; flagged layers are marked ``<-``."""
        from tabulate import tabulate

        out = []
        for axis in self.data.axes:
            headers = ["layer", "step"] + [f"{axis.keyword}={s}" for s in axis.sizes] + ["alpha", "fit err", ""]
            rows = []
            for curve in axis.curves.values():
                for step, values in enumerate(curve.values):
                    fit = curve.fit(step)
                    rows.append([curve.label if step == 0 else "", "init" if step == 0 else str(step),
                                 *[fmt(v) if v is not None else "-" for v in values],
                                 f"{fit.alpha:+.2f}" if fit else "-", f"{fit.error:.2f}" if fit else "-",
                                 "<-" if step == 0 and (axis.kind, curve.layer, curve.quantity) in self.flagged else ""])
            out.append(f"{axis.kind}: {axis.keyword} = {', '.join(map(str, axis.sizes))}  (rms; alpha: "
                       f"rms ~ {axis.keyword}^alpha)")
            out.append(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))
            out.append("")
        return "\n".join(out).rstrip()

    def to_text(self, colour: bool = False) -> str:
        """The table, the findings, the sizes that failed and the notes."""
        parts = [f"{self.target or self.model} ({self.model}; sweep over "
                 f"{', '.join(a.kind for a in self.data.axes)}, {self.steps} step(s))", "", self.table(), ""]
        if self.findings:
            parts.append(findings_table(self.findings, colour))
        else:
            parts.append("no findings")
        for size, why in self.failed.items():
            parts.append(f"  failed at {size}: {why}")
        for note in self.notes:
            parts.append(f"  note: {note}")
        parts.append(f"{len(self.findings)} finding(s); {sum(len(a.measured) for a in self.data.axes)} size(s) "
                     f"measured in {self.seconds:.1f} s")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.to_text()

    # ------------------------------------------------------------------ machine-readable
    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready: the axes with every curve (values per step and size, one fit per step), the findings."""
        return {"initlint": __version__, "target": self.target, "model": self.model, "steps": self.steps,
                "seconds": round(self.seconds, 3), "target_width": self.data.target_width,
                "axes": [_axis_dict(a) for a in self.data.axes],
                "findings": [f.to_dict() for f in self.findings], "notes": list(self.notes)}

    def to_json(self) -> str:
        """The JSON document, indented (non-finite values as strings)."""
        from ..output.formats import _dumps

        return _dumps(self.to_dict())

    def as_report(self) -> Report:
        """The findings as a :class:`~initlint.report.Report` (what the formats of ``initlint check`` read)."""
        notes = list(self.notes) + [f"failed at {size}: {why}" for size, why in self.failed.items()]
        return Report(model=self.model, target=self.target, findings=list(self.findings), notes=notes)

    def to_sarif(self) -> str:
        """SARIF 2.1.0, as ``initlint check --format sarif`` writes it."""
        return format_sarif([self.as_report()])

    # ------------------------------------------------------------------ plot
    def plot(self, path: Optional[str] = None, *, kind: Optional[str] = None, dpi: int = 120) -> Any:
        """Coordinate curves as in mup's ``plot_coord_data``: rms (log) against size (log), one panel per
        step, one line per layer; the layers a finding names in colour, the others grey. The first axis of
        the sweep (or ``kind``). With ``path``, saves the image; returns the matplotlib ``Figure``."""
        axis = next((a for a in self.data.axes if kind in (None, a.kind)), None)
        if axis is None or not axis.curves:
            raise PlotError(f"nothing to plot for {self.model}: no {kind or 'axis'} was measured")
        flagged = {(layer, quantity) for kind, layer, quantity in self.flagged if kind == axis.kind}
        fig = coord_figure(axis, flagged, f"{self.target or self.model}")
        if path is not None:
            try:
                fig.savefig(path, dpi=dpi)
            except OSError as exc:
                raise PlotError(f"cannot write {path}: {exc.strerror or exc}") from None
        return fig


def _axis_dict(axis: Axis) -> Dict[str, Any]:
    curves = []
    for curve in axis.curves.values():
        fits = curve.fits()
        curves.append({"layer": curve.layer, "quantity": curve.quantity, "values": curve.values,
                       "alpha": [None if f is None else round(f.alpha, 4) for f in fits],
                       "fit_error": [None if f is None else round(f.error, 4) for f in fits]})
    return {"kind": axis.kind, "keyword": axis.keyword, "sizes": axis.sizes, "steps": axis.steps,
            "failed": {str(s): why for s, why in axis.failed.items()}, "params": {str(s): n for s, n in axis.params.items()},
            "readout": axis.readout, "input_layer": axis.input_layer, "curves": curves}


_PALETTE = ("tab:red", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:blue")


def plotted(axis: Axis) -> List[Curve]:
    """The curves a coordinate plot draws: activations on a width axis (a gradient norm is another unit),
    everything on a depth axis (where the input layer's gradient is judged)."""
    return [c for c in axis.curves.values() if axis.kind == "depth" or c.quantity != INPUT_GRAD]


def coord_figure(axis: Axis, flagged: Set[Tuple[str, str]], title: str) -> Any:
    """The figure: one panel per step (init, step 1, ...), rms against size on log-log axes; flagged curves in
    colour with their exponents in the legend, the others grey."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    steps = axis.steps + 1
    cols = min(steps, 4)
    rows = (steps + cols - 1) // cols
    curves = plotted(axis)
    colours = {c.label: _PALETTE[i % len(_PALETTE)]
               for i, c in enumerate(c for c in curves if (c.layer, c.quantity) in flagged)}
    legend_rows = (len(colours) + 1 + 2) // 3
    fig = Figure(figsize=(3.3 * cols + 0.6, 3.1 * rows + 0.9 + 0.22 * legend_rows))
    FigureCanvasAgg(fig)
    panels = fig.subplots(rows, cols, squeeze=False, sharey=True)
    for step in range(rows * cols):
        ax = panels[step // cols][step % cols]
        if step < steps:
            _panel(ax, axis, curves, step, colours)
        else:
            ax.set_visible(False)
    handles = [Line2D([], [], color=colour, linewidth=1.8, marker="o", markersize=4) for colour in colours.values()]
    labels = [_legend_label(c) for c in curves if c.label in colours]
    handles.append(Line2D([], [], color="0.7", linewidth=0.8, marker=".", markersize=3))
    labels.append("other layers" if colours else "all layers (none flagged)")
    fig.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), fontsize=8, frameon=False)
    fig.suptitle(f"{title}: rms against {axis.keyword} (a flat line transfers; colour: flagged)", fontsize=10)
    bottom = (0.35 + 0.22 * legend_rows) / (3.1 * rows + 0.9 + 0.22 * legend_rows)
    fig.tight_layout(rect=(0, bottom, 1, 0.96))
    return fig


def _legend_label(curve: Curve) -> str:
    """``lm_head: +0.53 at init, up to +0.68`` (the fitted exponents)."""
    fits = curve.fits()
    init = fits[0]
    steepest = max((f.alpha for f in fits if f is not None), key=abs, default=None)
    text = curve.label + ":"
    if init is not None:
        text += f" {init.alpha:+.2f} at init"
    if steepest is not None and (init is None or abs(steepest - init.alpha) > 0.05):
        text += f"{',' if init is not None else ''} up to {steepest:+.2f} after steps"
    return text


def _panel(ax: Any, axis: Axis, curves: List[Curve], step: int, colours: Dict[str, str]) -> None:
    for curve in sorted(curves, key=lambda c: c.label in colours):  # flagged curves drawn last, on top
        points = [(s, v) for s, v in zip(curve.sizes, curve.values[step]) if v is not None and v > 0]
        if not points:
            continue
        xs, ys = zip(*points)
        colour = colours.get(curve.label)
        if colour is None:
            ax.plot(xs, ys, color="0.7", linewidth=0.8, marker=".", markersize=3, zorder=1)
        else:
            ax.plot(xs, ys, color=colour, linewidth=1.8, marker="o", markersize=4, zorder=3)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(axis.sizes)
    ax.set_xticklabels([str(s) for s in axis.sizes], fontsize=8)
    ax.minorticks_off()
    ax.set_title("init" if step == 0 else f"after step {step}", fontsize=9, loc="left")
    ax.set_xlabel(axis.keyword, fontsize=8)
    ax.grid(True, alpha=0.3)
    if step % 4 == 0:
        ax.set_ylabel("rms", fontsize=8)
