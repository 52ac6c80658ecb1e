"""The findings table: shared by the text format and :meth:`Report.assert_clean`.

It reads findings by their fields only, so it imports neither the report nor the formats.
Files are named as every format names them (:func:`initlint.capture.locate.shown_path`).
"""
from __future__ import annotations

import re
from typing import Any, Sequence

from tabulate import tabulate

from ..capture.locate import is_library, shown_path


def where(f: Any) -> str:
    """``path:line:col`` (col is always 1) in the user's files, ``package/file.py:line`` in an installed
    library (not a place to edit, so no column), or ``-``."""
    if not f.location:
        return "-"
    path, line = f.location
    return f"{shown_path(path)}:{line}" if is_library(path) else f"{shown_path(path)}:{line}:1"


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
        rows.append([where(f), colour_text(f.code, "1", colour), severity, wrap_path(f.module or "<model>"), text])
    return tabulate(rows, headers=["location", "code", "severity", "module", "message"], tablefmt="simple",
                    maxcolwidths=[None, None, None, None, 90])


def wrap_path(path: str, width: int = 32) -> str:
    """A module path on lines of at most ``width`` characters, broken after a dot (never inside a name),
    so that it reads and copies as the key it is."""
    lines = [""]
    for part in re.split(r"\.(?![^{]*\})", path):  # not the dots of a grouped run, layers.{0..11}
        piece = part if not lines[-1] else "." + part
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines[-1] += "."
            lines.append(part)
        else:
            lines[-1] += piece
    return "\n".join(lines)


def colour_text(text: str, code: str, enabled: bool) -> str:
    """``text`` in ANSI colour ``code`` when ``enabled``."""
    return f"\033[{code}m{text}\033[0m" if enabled else text
