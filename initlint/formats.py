"""Output formats for a list of reports."""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence

from tabulate import tabulate

from .report import Finding, Report
from .version import __version__


def relpath(path: str) -> str:
    """Path relative to the working directory when it lies below it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def where(f: Finding) -> str:
    """``path:line:col`` (col is always 1) or ``-``."""
    return f"{relpath(f.location[0])}:{f.location[1]}:1" if f.location else "-"


def findings_table(findings: Sequence[Finding]) -> str:
    """A compact table of findings with the fix on its own line."""
    rows = []
    for f in findings:
        text = f.message + f"\nhelp: {f.fix}"
        if f.caused_by:
            text += "\ncaused by: " + ", ".join(f.caused_by)
        rows.append([where(f), f.code, f.severity, f.module or "<model>", text])
    return tabulate(rows, headers=["location", "code", "severity", "module", "message"], tablefmt="simple",
                    maxcolwidths=[None, None, None, 32, 90])


def _colour(text: str, code: str, enabled: bool) -> str:
    return f"\033[{code}m{text}\033[0m" if enabled else text


def format_text(reports: List[Report], colour: bool = False) -> str:
    """Default format: one block per model with a table of its findings."""
    out: List[str] = []
    for r in reports:
        head = f"{r.target or r.model} ({r.model}; capture: {r.capture or '-'}, device: {r.device})"
        out.append(_colour(head, "1", colour))
        if r.error:
            out.append(_colour(f"  error: {r.error}", "31", colour))
        elif not r.findings:
            out.append(_colour("  no findings", "32", colour))
        else:
            out.append(findings_table(r.findings))
        for note in r.notes:
            out.append(f"  note: {note}")
        out.append("")
    total = sum(len(r.findings) for r in reports)
    errors = sum(1 for r in reports if r.error)
    out.append(f"{total} finding(s) in {len(reports)} model(s)" + (f", {errors} could not be audited" if errors else ""))
    return "\n".join(out)


def format_concise(reports: List[Report], colour: bool = False) -> str:
    """One line per finding: ``path:line:col: CODE [module] message``."""
    lines = []
    for r in reports:
        if r.error:
            lines.append(f"{r.target or r.model}: error: {r.error}")
        for f in r.findings:
            lines.append(f"{where(f) if f.location else (r.target or r.model)}: {f.code} [{f.module or '<model>'}] {f.message}")
    return "\n".join(lines)


def to_json_document(reports: List[Report]) -> Dict[str, Any]:
    """``{"initlint": VERSION, "results": [...]}``."""
    return {"initlint": __version__, "results": [r.to_dict() for r in reports]}


def format_json(reports: List[Report], colour: bool = False) -> str:
    """The JSON document, indented."""
    return json.dumps(to_json_document(reports), indent=2, default=str)


FORMATS: Dict[str, Callable[..., str]] = {"text": format_text, "concise": format_concise, "json": format_json}
