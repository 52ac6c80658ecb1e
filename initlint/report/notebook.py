"""How a :class:`~initlint.report.findings.Report` shows in Jupyter: an HTML table, or Markdown where HTML is not rendered.

One row per finding (a grouped run of layers is one row, as in the text format): code and
rule name, severity, module, the message with its ``caused by`` references, the fix as code
and the source location. Every piece of text from the model (module paths, messages, file
names) is HTML-escaped.
"""
from __future__ import annotations

import html
import re
from typing import Any, List

from .table import where

_SEVERITY_STYLE = {"error": "color:#c62828;font-weight:bold", "warning": "color:#b26a00;font-weight:bold",
                   "info": "color:#00838f"}
_CELL = "text-align:left;vertical-align:top"


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _where(f: Any) -> str:
    return where(f)


def _headline(report: Any) -> str:
    count = len(report.findings)
    state = "could not be audited" if report.error else (f"{count} finding(s)" if count else "no findings")
    return f"{report.model}: {state} at initialisation (capture: {report.capture or '-'}, device: {report.device})"


def _message(f: Any) -> str:
    return f.message + (f"\ncaused by: {', '.join(f.caused_by)}" if f.caused_by else "")


def report_html(report: Any) -> str:
    """The report as an HTML fragment."""
    parts = [f'<div class="initlint-report"><p><strong>initlint</strong> &middot; {_e(_headline(report))}</p>']
    if report.error:
        parts.append(f'<p style="{_SEVERITY_STYLE["error"]}">error: {_e(report.error)}</p>')
    if report.findings:
        head = "".join(f'<th style="{_CELL}">{h}</th>' for h in
                       ("code", "severity", "module", "message", "fix", "location"))
        rows = [_html_row(f) for f in report.findings]
        parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
    if getattr(report, "step", None) is not None:
        parts.append("<pre>" + _e("\n".join(report.step.lines())) + "</pre>")
    parts.extend(f"<p>note: {_e(note)}</p>" for note in report.notes)
    parts.append("</div>")
    return "".join(parts)


def _html_row(f: Any) -> str:
    message = _e(_message(f)).replace("\n", "<br>")
    cells = [f"<code>{_e(f.code)}</code> {_e(f.name)}",
             f'<span style="{_SEVERITY_STYLE.get(f.severity, "")}">{_e(f.severity)}</span>',
             f"<code>{_e(f.module or '<model>')}</code>",
             message,
             f'<pre style="margin:0"><code>{_e(f.fix)}</code></pre>',
             _e(_where(f))]
    return "<tr>" + "".join(f'<td style="{_CELL}">{c}</td>' for c in cells) + "</tr>"


def report_markdown(report: Any) -> str:
    """The report as GitHub-flavoured Markdown (a table; pipes and newlines in cells escaped)."""
    lines: List[str] = [f"**initlint** · {_md(_headline(report))}", ""]
    if report.error:
        lines += [f"error: {_md(report.error)}", ""]
    if report.findings:
        lines += ["| code | severity | module | message | fix | location |", "| --- | --- | --- | --- | --- | --- |"]
        for f in report.findings:
            cells = [f"{f.code} {f.name}", f.severity, _code(f.module or "<model>"), _md(_message(f)),
                     _code(f.fix), _md(_where(f))]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if getattr(report, "step", None) is not None:
        lines += [_md(line) + "  " for line in report.step.lines()] + [""]
    lines += [f"note: {_md(note)}" for note in report.notes]
    return "\n".join(lines).rstrip() + "\n"


def _md(text: str) -> str:
    """Plain text inside a Markdown table cell: Markdown punctuation, HTML and pipes made literal."""
    out = text.replace("\\", "\\\\")
    for char in "`*_[]|":
        out = out.replace(char, "\\" + char)
    return html.escape(out, quote=False).replace("\n", "<br>")


def _code(text: str) -> str:
    """``text`` as inline code that survives a table cell: a fence longer than any backtick run in it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    body = text.replace("\n", " ").replace("|", "\\|")
    pad = " " if body.startswith("`") or body.endswith("`") else ""
    return f"{fence}{pad}{body}{pad}{fence}"
