"""Output formats for a list of reports: text, concise, json, sarif and github.

Every format is a function ``(reports, colour=False, notes=()) -> str`` registered in :data:`FORMATS`;
``notes`` are the files and models passed over (``models/block.py:Block skipped: ...``). Every format
names files the same way (:func:`initlint.capture.locate.shown_path`): relative to the working directory,
an installed library's file relative to its package folder.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import quote


from ..capture.locate import is_library, shown_path
from ..report.findings import Finding, Report
from ..report.table import colour_text, findings_table, where
from ..version import __version__


def use_colour(stream: Any, environ: Optional[Dict[str, str]] = None) -> bool:
    """ANSI colour only on a terminal, and never when ``NO_COLOR`` is set (https://no-color.org)."""
    env = os.environ if environ is None else environ
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not env.get("NO_COLOR")


def format_text(reports: List[Report], colour: bool = False, notes: Sequence[str] = ()) -> str:
    """Default format: one block per model with a table of its findings."""
    out: List[str] = []
    for r in reports:
        head = f"{r.target or r.model} ({r.model}; capture: {r.capture or '-'}, device: {r.device})"
        out.append(colour_text(head, "1", colour))
        if r.error:
            out.append(colour_text(f"  error: {r.error}", "31", colour))
        elif not r.findings:
            out.append(colour_text("  no findings", "32", colour))
        else:
            out.append(findings_table(r.findings, colour))
        out.extend(step_lines(r))
        for note in r.notes:
            out.append(f"  note: {note}")
        out.append("")
    total = sum(len(r.findings) for r in reports)
    errors = sum(1 for r in reports if r.error)
    out.append(f"{total} finding(s) in {len(reports)} model(s)" + (f", {errors} could not be audited" if errors else ""))
    return "\n".join(out)


def step_lines(report: Report) -> List[str]:
    """With an optimizer: the first step's optimizer and loss, and one line per param group (lr, weight
    decay, size, median first-update ratio)."""
    step = getattr(report, "step", None)
    if step is None:
        return []
    first, *groups = step.lines()
    return [f"  {first}"] + [f"    {line}" for line in groups]


ALL_PASSED = "All checks passed!"
"""What the concise format prints when no model has a finding or an error (as ruff does)."""


def format_concise(reports: List[Report], colour: bool = False, notes: Sequence[str] = ()) -> str:
    """One line per finding: ``path:line:col: CODE [module] message``; one line when all is clean."""
    if not any(r.findings or r.error for r in reports):
        return ALL_PASSED
    lines = []
    for r in reports:
        if r.error:
            lines.append(f"{r.target or r.model}: error: {r.error}")
        for f in r.findings:
            lines.append(f"{where(f) if f.location else (r.target or r.model)}: {f.code} [{f.module or '<model>'}] {f.message}")
    return "\n".join(lines)


def to_json_document(reports: List[Report], notes: Sequence[str] = ()) -> Dict[str, Any]:
    """``{"initlint": VERSION, "results": [...], "notes": [...]}``: ``notes`` as ``{"path", "message"}``."""
    return {"initlint": __version__, "results": [r.to_dict() for r in reports],
            "notes": [{"path": path, "message": message} for path, message in map(split_note, notes)]}


def split_note(note: str) -> Tuple[Optional[str], str]:
    """``models/block.py:Block skipped: ...`` -> (``models/block.py``, the whole note): the file it is about, if any."""
    subject = note.partition(" skipped: ")[0] if " skipped: " in note else ""
    path = subject if os.path.isfile(subject) else subject.rpartition(":")[0]
    return (shown_path(path) if path and os.path.isfile(path) else None), note


def _finite(obj: Any) -> Any:
    """JSON has no NaN or Infinity: write such measurements as the strings ``"nan"``, ``"inf"``."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _dumps(document: Dict[str, Any]) -> str:
    return json.dumps(_finite(document), indent=2, default=str, allow_nan=False)


def format_json(reports: List[Report], colour: bool = False, notes: Sequence[str] = ()) -> str:
    """The JSON document, indented."""
    return _dumps(to_json_document(reports, notes))


# ----------------------------------------------------------------------------- SARIF
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SARIF_LEVELS = {"info": "note", "warning": "warning", "error": "error"}
SRCROOT = "%SRCROOT%"


def doc_section(doc: str, heading: str) -> str:
    """The text under ``## heading`` of a rule docstring (empty when there is none)."""
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", doc, re.MULTILINE | re.DOTALL)
    return match.group(1).strip() if match else ""


def sarif_rules() -> List[Dict[str, Any]]:
    """``tool.driver.rules``: one reporting descriptor per registered rule, from its docstring."""
    from ..rules import all_rules

    out = []
    for code, rule in all_rules().items():
        doc = rule.doc()
        descriptor: Dict[str, Any] = {
            "id": code,
            "name": rule.name,
            "shortDescription": {"text": rule.summary or rule.name},
            "fullDescription": {"text": doc_section(doc, "What it does") or rule.summary or rule.name},
            "help": {"text": doc, "markdown": doc},
            "defaultConfiguration": {"level": SARIF_LEVELS.get(rule.severity, "warning")},
        }
        if rule.options:
            descriptor["properties"] = {"options": dict(rule.options)}
        out.append(descriptor)
    return out


def artifact_location(path: str) -> Dict[str, str]:
    """A relative URI under ``%SRCROOT%`` (the working directory) when possible, else an absolute ``file:`` URI."""
    rel = shown_path(path)
    if os.path.isabs(rel):
        return {"uri": Path(path).resolve().as_uri()}
    return {"uri": quote(Path(rel).as_posix()), "uriBaseId": SRCROOT}


def target_file(report: Report) -> Optional[str]:
    """The Python file a report's target names (``models/net.py:Net`` -> ``models/net.py``), if it exists."""
    target = report.target or ""
    path = target if os.path.isfile(target) else target.rpartition(":")[0]
    return path if path.endswith(".py") and os.path.isfile(path) else None


def source_place(report: Report, f: Finding) -> Tuple[Optional[str], Optional[int], Optional[str]]:
    """``(file, line, library)`` of a finding for code scanning: its line in the user's code; for a line
    inside an installed library, which no project file holds, the target's file without a line and the
    library's place as text (``transformers/models/gpt2/modeling_gpt2.py:233``)."""
    if f.location and is_library(f.location[0]):
        return target_file(report), None, where(f)
    if f.location:
        return f.location[0], int(f.location[1]) if f.location[1] >= 1 else None, None
    return target_file(report), None, None


def _sarif_result(report: Report, f: Finding, index: Dict[str, int]) -> Dict[str, Any]:
    module = f.module or "<model>"
    path, line, library = source_place(report, f)
    text = f"{module}: {f.message}\nhelp: {f.fix}"
    if f.caused_by:
        text += "\ncaused by: " + ", ".join(f.caused_by)
    if library:
        text += f"\nconstructed in: {library}"
    location: Dict[str, Any] = {"logicalLocations": [{"name": module, "fullyQualifiedName": f"{report.model}.{module}"
                                                       if f.module else report.model, "kind": "module"}]}
    if path:
        physical: Dict[str, Any] = {"artifactLocation": artifact_location(path)}
        if line:
            physical["region"] = {"startLine": line}
        location["physicalLocation"] = physical
    result: Dict[str, Any] = {
        "ruleId": f.code,
        "level": SARIF_LEVELS.get(f.severity, "warning"),
        "message": {"text": text},
        "locations": [location],
        "properties": {"model": report.model, "target": report.target, "module": f.module, "value": f.value,
                       "threshold": f.threshold, "fix": f.fix, "caused_by": f.caused_by, "members": f.members,
                       "library_location": library},
    }
    if f.code in index:
        result["ruleIndex"] = index[f.code]
    return result


def _notification(level: str, text: str, path: Optional[str]) -> Dict[str, Any]:
    """A ``toolExecutionNotifications`` entry, located at the file it is about when there is one."""
    out: Dict[str, Any] = {"level": level, "message": {"text": text}}
    if path:
        out["locations"] = [{"physicalLocation": {"artifactLocation": artifact_location(path)}}]
    return out


def to_sarif(reports: List[Report], notes: Sequence[str] = ()) -> Dict[str, Any]:
    """The SARIF 2.1.0 log: one run, the rule registry as ``tool.driver.rules``, one result per finding;
    errors, the reports' notes and the files passed over as the invocation's notifications."""
    rules = sarif_rules()
    index = {r["id"]: i for i, r in enumerate(rules)}
    notifications = [_notification("error", f"{r.target or r.model}: {r.error}", target_file(r))
                     for r in reports if r.error]
    notifications += [_notification("note", f"{r.target or r.model}: {note}", target_file(r))
                      for r in reports for note in r.notes]
    notifications += [_notification("note", text, path) for path, text in map(split_note, notes)]
    run = {
        "tool": {"driver": {"name": "initlint", "version": __version__, "semanticVersion": __version__,
                            "rules": rules}},
        "originalUriBaseIds": {SRCROOT: {"uri": Path.cwd().as_uri() + "/"}},
        "invocations": [{"executionSuccessful": not any(r.error for r in reports),
                         "toolExecutionNotifications": notifications}],
        "results": [_sarif_result(r, f, index) for r in reports for f in r.findings],
    }
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def format_sarif(reports: List[Report], colour: bool = False, notes: Sequence[str] = ()) -> str:
    """SARIF 2.1.0, for GitHub code scanning and other SARIF viewers."""
    return _dumps(to_sarif(reports, notes))


# ----------------------------------------------------------------------------- GitHub Actions
GITHUB_COMMANDS = {"info": "notice", "warning": "warning", "error": "error"}


def github_data(text: str) -> str:
    """Escape a workflow command's message (as ``@actions/core`` does)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def github_property(text: str) -> str:
    """Escape a workflow command's property value; ``:`` and ``,`` separate properties."""
    return github_data(text).replace(":", "%3A").replace(",", "%2C")


def _github_line(command: str, message: str, title: str, path: Optional[str] = None,
                 line: Optional[int] = None) -> str:
    props = []
    if path:
        props.append(f"file={github_property(shown_path(path))}")
        if line:
            props.append(f"line={int(line)}")
    props.append(f"title={github_property(title)}")
    return f"::{command} {','.join(props)}::{github_data(message)}"


def format_github(reports: List[Report], colour: bool = False, notes: Sequence[str] = ()) -> str:
    """GitHub Actions workflow commands: one annotation per finding, error or note."""
    lines = []
    for r in reports:
        if r.error:
            lines.append(_github_line("error", f"{r.target or r.model}: {r.error}", "initlint", target_file(r)))
        for f in r.findings:
            path, line, library = source_place(r, f)
            message = f"{f.module or '<model>'}: {f.message}\nhelp: {f.fix}"
            if library:
                message += f"\nconstructed in: {library}"
            lines.append(_github_line(GITHUB_COMMANDS.get(f.severity, "warning"), message, f"{f.code} {f.name}",
                                      path, line))
        for note in r.notes:
            lines.append(_github_line("notice", f"{r.target or r.model}: {note}", "initlint note", target_file(r)))
    lines += [_github_line("notice", text, "initlint note", path) for path, text in map(split_note, notes)]
    return "\n".join(lines)


FORMATS: Dict[str, Callable[..., str]] = {"text": format_text, "concise": format_concise, "json": format_json,
                                          "sarif": format_sarif, "github": format_github}


def deliver(text: str, path: Optional[str]) -> bool:
    """Write a report's ``text`` to ``path``, or print it (unless empty) when there is none. False, with
    the error on stderr, when the file cannot be written."""
    import click

    from ..errors import echo_error

    if path:
        try:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError as exc:
            echo_error(f"cannot write {path}: {exc.strerror}")
            return False
    elif text:
        click.echo(text)
    return True
