"""A Report in a notebook: an HTML findings table (escaped), a Markdown fallback, and an inline figure."""
from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import List

import pytest
import torch
import torch.nn as nn

import initlint
from initlint.report.findings import Finding, Report

PNG = b"\x89PNG\r\n\x1a\n"


class Cells(HTMLParser):
    """Rows of the HTML table body as lists of cell texts, and every start tag seen."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: List[List[str]] = []
        self.tags: List[str] = []
        self._in_body = False
        self._cell = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.rows.append([])
        elif tag == "td" and self._in_body:
            self._cell = ""

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.rows[-1].append(self._cell)
            self._cell = None
        elif tag == "tbody":
            self._in_body = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def parse(text: str) -> Cells:
    cells = Cells()
    cells.feed(text)
    return cells


def hostile_report() -> Report:
    """Findings whose texts carry HTML, quotes, pipes and backticks."""
    return Report(model="Net<script>", target="net.py:Net", capture="fx", findings=[
        Finding(code="IL001", name="init-scale", severity="warning", module="blocks.<script>alert(1)</script>",
                message='weight std 1 is 10x the 0.1 that "relu" needs | a & b', fix="nn.init.kaiming_normal_(w) # <b>`x`</b>",
                value=1.0, threshold=0.1, location=("models/<net>.py", 7), caused_by=["IL008 head"]),
        Finding(code="IL002", name="bias-before-norm", severity="error", module="", message="second",
                fix="nn.Conv2d(..., bias=False)"),
    ], notes=["a note with <tags>"])


def test_html_has_one_row_per_finding_with_the_fix_as_code():
    report = hostile_report()
    text = report._repr_html_()
    cells = parse(text)
    assert len(cells.rows) == len(report.findings)
    codes, severities, modules, messages, fixes, locations = zip(*cells.rows)
    assert [c.split()[0] for c in codes] == ["IL001", "IL002"] and list(severities) == ["warning", "error"]
    assert list(modules) == ["blocks.<script>alert(1)</script>", "<model>"]  # shown as text, after unescaping
    assert list(fixes) == ["nn.init.kaiming_normal_(w) # <b>`x`</b>", "nn.Conv2d(..., bias=False)"]
    assert messages[0] == 'weight std 1 is 10x the 0.1 that "relu" needs | a & bcaused by: IL008 head'
    assert locations[0] == "models/<net>.py:7:1"
    assert text.count("<pre") == 2 and text.count('<pre style="margin:0"><code>') == 2


def test_html_escapes_everything_from_the_model():
    text = hostile_report()._repr_html_()
    tags = set(parse(text).tags)
    assert "script" not in tags and "b" not in tags and "net" not in tags and "tags" not in tags
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "&amp; b" in text and "&quot;relu&quot;" in text
    assert "note: a note with &lt;tags&gt;" in text


def test_html_of_a_clean_report_and_of_an_error():
    clean = Report(model="Net", capture="fx")
    assert "no findings" in clean._repr_html_() and "<table" not in clean._repr_html_()
    failed = Report(model="-", target="x.py", error="importing x.py raised ImportError: <apex>")
    text = failed._repr_html_()
    assert "could not be audited" in text and "error: importing x.py raised ImportError: &lt;apex&gt;" in text


def test_markdown_table_one_row_per_finding_with_cells_intact():
    report = hostile_report()
    lines = report._repr_markdown_().splitlines()
    table = [line for line in lines if line.startswith("| ") and not line.startswith("| ---")]
    assert len(table) == 1 + len(report.findings)  # the header and one row each
    rows = [re.split(r"(?<!\\)\|", line)[1:-1] for line in table[1:]]
    assert all(len(row) == 6 for row in rows)  # no pipe in a message or fix split a cell
    assert "``nn.init.kaiming_normal_(w) # <b>`x`</b>``" in rows[0][4]
    assert rows[0][2].strip() == "`blocks.<script>alert(1)</script>`"  # inside code: shown literally
    assert rows[0][3].strip() == 'weight std 1 is 10x the 0.1 that "relu" needs \\| a &amp; b<br>caused by: IL008 head'


def test_a_real_report_shows_its_findings():
    torch.manual_seed(0)
    report = initlint.audit(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()), select=["IL002"])
    rows = parse(report._repr_html_()).rows
    assert [(row[0].split()[0], row[2]) for row in rows] == report.codes() == [("IL002", "0")]
    assert "bias=False" in rows[0][4]


def test_ipython_shows_the_report_as_html_and_the_plot_as_an_image():
    pytest.importorskip("IPython")
    pytest.importorskip("matplotlib")
    from IPython.core import formatters

    torch.manual_seed(0)
    report = initlint.audit(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    data, _ = formatters.DisplayFormatter().format(report)
    assert {"text/html", "text/markdown", "text/plain"} <= set(data)
    fig = report.plot()
    from matplotlib.figure import Figure

    assert isinstance(fig, Figure) and len(fig.axes) == 4
    data, _ = formatters.DisplayFormatter().format(fig)
    assert data["image/png"][:8] == PNG
