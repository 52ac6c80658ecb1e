"""Stage 5, report: findings and the report object returned by :func:`initlint.audit`."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..capture.locate import shown_path
from .table import findings_table

SEVERITIES = ("info", "warning", "error")


@dataclass
class Finding:
    """One problem found in one place of the model."""

    code: str
    name: str
    severity: str
    module: str
    """Module path as the user would type it against their model (``layers.3``; ``""`` for the root)."""
    message: str
    fix: str
    value: Optional[float] = None
    """What was measured."""
    threshold: Optional[float] = None
    """The limit it crossed."""
    location: Optional[Tuple[str, int]] = None
    """``(file, line)`` where the module was constructed or the functional op was called; for one inside an
    installed library, the user's line that built its enclosing module when there is one."""
    caused_by: List[str] = field(default_factory=list)
    """``CODE module`` references of the findings that explain this one."""
    members: List[str] = field(default_factory=list)
    """Modules merged into this finding when a run of identical layers was grouped."""

    def ref(self) -> str:
        """``IL001 layers.3``: how other findings point at this one."""
        return f"{self.code} {self.module or '<model>'}"

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready form."""
        data = asdict(self)
        data["location"] = None if self.location is None else {"path": shown_path(self.location[0]),
                                                               "line": self.location[1]}
        return data


@dataclass
class Report:
    """Result of auditing one model."""

    model: str
    target: str = ""
    device: str = "cpu"
    capture: str = ""
    """Which capture backend produced the graph (``fx`` or ``runtime``)."""
    findings: List[Finding] = field(default_factory=list)
    error: Optional[str] = None
    notes: List[str] = field(default_factory=list)
    graph: Any = None
    probe: Any = None
    step: Any = None
    """The first step of the optimizer given (:class:`initlint.probe.step.StepStats`), else None."""

    @property
    def clean(self) -> bool:
        """No warnings or errors (informational findings do not count)."""
        return not self.error and not [f for f in self.findings if f.severity != "info"]

    def codes(self) -> List[Tuple[str, str]]:
        """``(code, module)`` pairs of every finding, members of groups included."""
        pairs = []
        for f in self.findings:
            for module in f.members or [f.module]:
                pairs.append((f.code, module))
        return pairs

    def assert_clean(self, *, fail_on: str = "warning") -> None:
        """Raise ``AssertionError`` listing the findings at or above ``fail_on``.

        The message is the findings table, readable as it stands in a failing test.
        """
        __tracebackhide__ = True  # pytest: show the caller's line, not this one
        if fail_on not in SEVERITIES:
            raise ValueError(f"fail_on takes one of {', '.join(SEVERITIES)}, not {fail_on!r}")
        level = SEVERITIES.index(fail_on)
        bad = [f for f in self.findings if SEVERITIES.index(f.severity) >= level]
        if self.error:
            raise AssertionError(f"initlint could not audit {self.model}: {self.error}")
        if bad:
            codes = sorted({f.code for f in bad})
            raise AssertionError(
                f"initlint found {len(bad)} problem(s) in {self.model} at initialisation:\n\n"
                + findings_table(bad)
                + f"\n\nexplain a rule with `initlint explain {codes[0]}`; silence one on purpose with "
                  f"@initlint.ignore(\"{codes[0]}\", reason=...) on the module class or per_module_ignores")

    def plot(self, path: Optional[str] = None) -> Any:
        """The per-layer signal profile (four panels against depth); needs ``initlint[plot]``.

        With ``path``, saves the image there and returns the plotted series by name (see
        :func:`initlint.report.plot.signal_series`). Without it, returns the matplotlib ``Figure``,
        which a notebook shows inline when it is the cell's result. Raises
        :class:`initlint.report.plot.PlotError` when matplotlib is missing or the probe did not run.
        """
        from .plot import plot_signal, signal_figure

        if path is None:
            return signal_figure(self)[0]
        return plot_signal(self, path)

    def _repr_html_(self) -> str:
        """The findings table for Jupyter: one row per finding, the fix as code, everything escaped."""
        from .notebook import report_html

        return report_html(self)

    def _repr_markdown_(self) -> str:
        """The findings as a Markdown table, for front ends that render Markdown but not HTML."""
        from .notebook import report_markdown

        return report_markdown(self)

    def to_dict(self) -> Dict[str, Any]:
        """The ``results[]`` entry of the JSON output."""
        return {
            "target": self.target,
            "model": self.model,
            "device": self.device,
            "capture": self.capture,
            "findings": [f.to_dict() for f in self.findings],
            "error": self.error,
            "notes": list(self.notes),
            **({"step": self.step.to_dict()} if self.step is not None else {}),
        }


_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")


def group_runs(findings: List[Finding], min_run: int = 4) -> List[Finding]:
    """Merge findings of one code and severity over runs of layers that differ only in one index.

    ``layers.0 .. layers.99`` with the same code become one finding on ``layers.{0..99}``
    carrying the worst value; ``members`` keeps every module path. In paths with several
    indices (``layers.3.0.to_qkv``: block 3, sub-layer 0) the index that varies is grouped and
    the others stay as they are (``layers.{0..5}.0.to_qkv``).
    """
    buckets: Dict[Tuple[str, str, str], List[Finding]] = {}
    order: List[Tuple[str, str, str]] = []
    for f in findings:
        key = (f.code, f.severity, _run_key(f, findings))
        if key not in buckets:
            order.append(key)
        buckets.setdefault(key, []).append(f)
    out: List[Finding] = []
    for key in order:
        group = buckets[key]
        if len(group) < min_run or key[2].startswith("\0") or key[2].count("{}") != 1:
            out.extend(group)
            continue
        out.append(_merge(group, key[2]))
    return out


def _run_key(f: Finding, findings: List[Finding]) -> str:
    """``f``'s module with its varying index as ``{}``: the index that takes the most values among
    the findings of the same code whose paths have the same shape; the others stay literal."""
    indexes = _INDEX.findall(f.module)
    if not indexes:
        return f"\0{f.module}"
    shape = _INDEX.sub("{}", f.module)
    if len(indexes) == 1:
        return shape
    peers = [_INDEX.findall(g.module) for g in findings if g.code == f.code and _INDEX.sub("{}", g.module) == shape]
    varying = max(range(len(indexes)), key=lambda i: (len({p[i] for p in peers}), i))
    parts = iter(range(len(indexes)))
    return _INDEX.sub(lambda m: "{}" if next(parts) == varying else m.group(0), f.module)


def _merge(group: List[Finding], pattern: str) -> Finding:
    indexes = [_varying_index(f.module, pattern) for f in group]
    worst = max(group, key=lambda f: (SEVERITIES.index(f.severity), abs(_log(f.value, f.threshold))))
    lo, hi = min(indexes), max(indexes)
    contiguous = sorted(indexes) == list(range(lo, hi + 1))
    ordered = sorted(indexes)
    steps = {b - a for a, b in zip(ordered, ordered[1:])}
    if contiguous:
        label = f"{{{lo}..{hi}}}"
    elif len(steps) == 1 and len(ordered) > 3:
        label = f"{{{ordered[0]},{ordered[1]},...,{ordered[-1]}}}"
    else:
        label = "{" + ",".join(str(i) for i in ordered) + "}"
    merged = Finding(**{k: v for k, v in worst.__dict__.items()})
    merged.module = pattern.replace("{}", label)
    merged.members = [f.module for f in group]
    merged.message = f"{len(group)} layers like this; worst: {worst.module}: {worst.message}"
    merged.caused_by = sorted({c for f in group for c in f.caused_by})
    return merged


def _varying_index(module: str, pattern: str) -> int:
    """The number standing where ``pattern`` has ``{}``."""
    prefix = pattern.split("{}")[0]
    return int(re.match(r"\d+", module[len(prefix):]).group(0))


def _log(value: Optional[float], threshold: Optional[float]) -> float:
    import math

    if not value or not threshold or value <= 0 or threshold <= 0:
        return 0.0
    return math.log(value / threshold)
