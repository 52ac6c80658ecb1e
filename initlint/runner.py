"""What ``initlint check`` does once torch is needed: load, audit, format, exit code."""
from __future__ import annotations

import os
import sys
from typing import Any, Collection, Dict, List

import click

from .errors import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS
from .report import SEVERITIES, Report


def run_check(targets: List[str], opts: Dict[str, Any], progress: bool = False, implicit: Collection[str] = ()) -> int:
    """Audit every target; print the report; return the exit code.

    ``implicit`` targets were found by walking a folder: like every target under
    ``--skip-files-without-models``, they are passed over when they hold no model to build.
    """
    from .api import UsageError, audit
    from .config import ConfigError, load_config, merge_cli
    from .formats import FORMATS, use_colour
    from .load import LoadError, NoModelsError, NoProbeInputError, parse_shape, resolve, unbuildable_error
    from .rules import UnknownCode
    from .targets import FileSettings

    def say(msg: str) -> None:
        if progress:
            click.echo(f"initlint: {msg}", err=True)

    try:
        config = load_config(opts.get("config_path"), targets[0])
        for text in opts.get("input_shapes") or ():
            parse_shape(text)  # before merging, which drops empty values: --input-shape "" is an error too
        settings = merge_cli(config, opts)
        shapes = [parse_shape(s) for s in settings.get("input_shapes") or []]
        fmt = settings.get("format") or "text"
        if fmt not in FORMATS:
            raise UsageError(f"unknown format '{fmt}' (choose from {', '.join(FORMATS)})")
        fail_on = settings.get("fail_on") or "warning"
        if fail_on not in SEVERITIES:
            raise UsageError(f"--fail-on takes one of {', '.join(SEVERITIES)}, not '{fail_on}'")
        from .rules import select_rules

        select_rules(settings.get("select"), settings.get("ignore"))
    except (LoadError, UnknownCode, ConfigError) as exc:
        click.echo(f"initlint: error: {exc}", err=True)
        return EXIT_ERROR
    for warning in config.warnings:
        click.echo(f"initlint: warning: {warning}", err=True)
    if opts.get("plot_path"):
        from .plot import PlotError, require_matplotlib

        try:
            require_matplotlib()  # before minutes of auditing, not after
        except PlotError as exc:
            click.echo(f"initlint: error: {exc}", err=True)
            return EXIT_ERROR

    reports: List[Report] = []
    load_failed = False
    per_file = FileSettings(opts, targets[0], config, settings)
    fail_levels: Dict[int, str] = {}
    for target in targets:
        try:  # each file's own [tool.initlint], merged with the command line
            settings = per_file(target)
            if settings is None:
                continue  # under a configuration file whose error is already reported
            shapes = [parse_shape(s) for s in settings.get("input_shapes") or []]
        except (LoadError, UnknownCode, ConfigError) as exc:
            reports.append(Report(model="-", target=target, error=str(exc)))
            load_failed = True
            continue
        for warning in per_file.take_warnings():
            click.echo(f"initlint: warning: {warning}", err=True)
        device = settings.get("device") or "auto"
        lenient = bool(opts.get("skip_files_without_models")) or target in implicit
        say(f"loading {target}")
        try:
            candidates = resolve(target)
        except LoadError as exc:
            if lenient and isinstance(exc, NoModelsError):
                continue  # its classes only looked like torch modules to the static scan
            reports.append(Report(model="-", target=target, error=str(exc)))
            load_failed = True
            continue
        buildable = [c for c in candidates if not (c.implicit and c.required_args())]
        if not buildable and not lenient:
            reports.append(Report(model="-", target=target, error=str(unbuildable_error(target, candidates))))
            load_failed = True
            continue
        for cand in candidates:
            if cand not in buildable:
                # a building block such as Block(dim): the file's models that can be built are audited
                click.echo(f"initlint: note: {cand.origin} skipped: it needs constructor arguments "
                           f"({', '.join(cand.required_args())})", err=True)
                continue
            try:
                model = cand.instantiate()
                say(f"auditing {cand.name}: capture, probe, rules")
                report = audit(model, device=device, select=settings.get("select"), ignore=settings.get("ignore"),
                               logits=settings.get("logits"), seed=settings.get("seed") or 0,
                               batch_size=settings.get("batch_size"), input_shapes=shapes or None,
                               rule_options=settings.get("rule_options"), name=cand.name, target=cand.origin,
                               per_module_ignores=settings.get("per_module_ignores"))
            except (LoadError, UnknownCode) as exc:
                if lenient and cand.implicit and isinstance(exc, NoProbeInputError):
                    click.echo(f"initlint: note: {cand.origin} skipped: {exc}", err=True)  # a layer-less helper
                    continue
                report = Report(model=cand.name, target=cand.origin, error=str(exc))
                load_failed = True
            reports.append(report)
            fail_levels[id(report)] = settings.get("fail_on") or fail_on
            if opts.get("plot_path") and report.graph is not None:
                path = _plot_path(opts["plot_path"], cand.name, len(candidates) + len(targets) > 2)
                say(f"plotting {cand.name} to {path}")
                try:
                    report.plot(path)
                except PlotError as exc:
                    click.echo(f"initlint: error: {exc}", err=True)
                    load_failed = True
    say("reporting")
    colour = fmt == "text" and not opts.get("output") and use_colour(sys.stdout)
    text = FORMATS[fmt](_shown_reports(reports, fmt, opts), colour=colour)
    if fmt == "text" and not opts.get("output") and any(r.error for r in reports):
        text += f", {sum(1 for r in reports if r.error)} could not be audited"  # their errors follow on stderr
    if opts.get("output"):
        try:
            with open(opts["output"], "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError as exc:
            click.echo(f"initlint: error: cannot write {opts['output']}: {exc.strerror}", err=True)
            return EXIT_ERROR
    elif text:
        click.echo(text)
    for r in reports:
        if r.error:
            where = r.target or r.model
            named = r.error.startswith(where.split(":")[0])  # "missing.py: no such file" names it already
            click.echo(f"initlint: error: {r.error}" if named else f"initlint: error: {where}: {r.error}", err=True)
    if load_failed:
        return EXIT_ERROR
    failing = [f for r in reports for f in r.findings
               if SEVERITIES.index(f.severity) >= SEVERITIES.index(fail_levels.get(id(r), fail_on))]
    return EXIT_FINDINGS if failing else EXIT_CLEAN


def _shown_reports(reports: List[Report], fmt: str, opts: Dict[str, Any]) -> List[Report]:
    """The reports a format prints: on a terminal, text and concise leave errors to stderr (printed once)."""
    if opts.get("output") or fmt not in ("text", "concise"):
        return reports
    return [r for r in reports if not r.error]


def _plot_path(path: str, name: str, several: bool) -> str:
    if not several:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}-{name}{ext or '.png'}"
