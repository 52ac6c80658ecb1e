"""The findings table: shared by the text format and :meth:`Report.assert_clean`.

It reads findings by their fields only, so it imports neither the report nor the formats.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from tabulate import tabulate


def relpath(path: str) -> str:
    """Path relative to the working directory when it lies below it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def where(f: Any) -> str:
    """``path:line:col`` (col is always 1) or ``-``."""
    return f"{relpath(f.location[0])}:{f.location[1]}:1" if f.location else "-"


SEVERITY_COLOURS = {"info": "36", "warning": "33", "error": "31"}
"""ANSI colour of each severity in the text format (cyan, yellow, red)."""


def findings_table(findings: Sequence[Any], colour: bool = False) -> str:
    """A compact table of findings with the fix on its own line."""
    rows = []
    for f in findings:
        text = f.message + f"\nhelp: {f.fix}"
        if f.caused_by:
            text += "\ncaused by: " + ", ".join(f.caused_by)
        severity = colour_text(f.severity, SEVERITY_COLOURS.get(f.severity, "0"), colour)
        rows.append([where(f), colour_text(f.code, "1", colour), severity, f.module or "<model>", text])
    return tabulate(rows, headers=["location", "code", "severity", "module", "message"], tablefmt="simple",
                    maxcolwidths=[None, None, None, 32, 90])


def colour_text(text: str, code: str, enabled: bool) -> str:
    """``text`` in ANSI colour ``code`` when ``enabled``."""
    return f"\033[{code}m{text}\033[0m" if enabled else text
