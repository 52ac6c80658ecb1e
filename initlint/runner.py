"""What ``initlint check`` does once torch is needed: load, audit, format, exit code."""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, List

import click

from .errors import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS
from .report import SEVERITIES, Report


def run_check(targets: List[str], opts: Dict[str, Any], progress: bool = False) -> int:
    """Audit every target; print the report; return the exit code."""
    from .api import UsageError, audit
    from .config import ConfigError, load_config, merge_cli
    from .formats import FORMATS, use_colour
    from .load import LoadError, parse_shape, resolve, unbuildable_error
    from .rules import UnknownCode

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
    device = settings.get("device") or "auto"
    for target in targets:
        say(f"loading {target}")
        try:
            candidates = resolve(target)
        except LoadError as exc:
            reports.append(Report(model="-", target=target, error=str(exc)))
            load_failed = True
            continue
        buildable = [c for c in candidates if not (c.implicit and c.required_args())]
        if not buildable and not opts.get("skip_files_without_models"):
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
                report = Report(model=cand.name, target=cand.origin, error=str(exc))
                load_failed = True
            reports.append(report)
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
    text = FORMATS[fmt](reports, colour=colour)
    if opts.get("output"):
        try:
            with open(opts["output"], "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError as exc:
            click.echo(f"initlint: error: cannot write {opts['output']}: {exc.strerror}", err=True)
            return EXIT_ERROR
    else:
        click.echo(text)
    for r in reports:
        if r.error:
            where = r.target or r.model
            named = r.error.startswith(where.split(":")[0])  # "missing.py: no such file" names it already
            click.echo(f"initlint: error: {r.error}" if named else f"initlint: error: {where}: {r.error}", err=True)
    if load_failed:
        return EXIT_ERROR
    level = SEVERITIES.index(fail_on)
    failing = [f for r in reports for f in r.findings if SEVERITIES.index(f.severity) >= level]
    return EXIT_FINDINGS if failing else EXIT_CLEAN


def _plot_path(path: str, name: str, several: bool) -> str:
    if not several:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}-{name}{ext or '.png'}"
