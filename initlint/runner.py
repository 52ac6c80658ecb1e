"""What ``initlint check`` does once torch is needed: load, audit, format, exit code."""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Collection, Dict, List, Optional

import click

from .errors import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, echo_error
from .report.findings import SEVERITIES, Report
from .inputs.config import target_file


def run_check(targets: List[str], opts: Dict[str, Any], progress: bool = False, implicit: Collection[str] = (),
              notes: Collection[str] = ()) -> int:
    """Audit every target; print the report; return the exit code.

    ``implicit`` targets were found by walking a folder: like every target under
    ``--skip-files-without-models``, they are passed over when they hold no model to build.
    ``notes`` name the files the walk passed over; with the models passed over here, every format
    that carries them (json, sarif, github) reports them.
    """
    from .output.formats import FORMATS, deliver, use_colour

    def say(msg: str) -> None:
        if progress:
            click.echo(f"initlint: {msg}", err=True)

    per_file = prepare(targets, opts)
    if per_file is None:
        return EXIT_ERROR
    settings = per_file.base
    reports: List[Report] = []
    fail_levels: Dict[int, str] = {}
    load_failed = False
    skipped = list(notes)
    for target in targets:
        lenient = bool(opts.get("skip_files_without_models")) or target in implicit
        load_failed |= _check_target(target, per_file, opts, say, reports, fail_levels, lenient,
                                     several=len(targets) > 1, notes=skipped)
    say("reporting")
    fmt = settings.get("format") or "text"
    colour = fmt == "text" and not opts.get("output") and use_colour(sys.stdout)
    shown = _shown_reports(reports, fmt, opts)
    text = FORMATS[fmt](shown, colour=colour, notes=skipped)
    if fmt == "concise" and len(shown) < len(reports) and not any(r.findings for r in reports):
        text = ""  # not "All checks passed!": the errors that follow on stderr say otherwise
    if fmt == "text" and not opts.get("output") and any(r.error for r in reports):
        text += f", {sum(1 for r in reports if r.error)} could not be audited"  # their errors follow on stderr
    if not deliver(text, opts.get("output")):
        return EXIT_ERROR
    _echo_errors(reports)
    if load_failed:
        return EXIT_ERROR
    default_level = settings.get("fail_on") or "warning"
    failing = [f for r in reports for f in r.findings
               if SEVERITIES.index(f.severity) >= SEVERITIES.index(fail_levels.get(id(r), default_level))]
    return EXIT_FINDINGS if failing else EXIT_CLEAN


def prepare(targets: List[str], opts: Dict[str, Any]) -> Optional[Any]:
    """Read the configuration and check every setting before any user code runs (and before torch is
    imported); None after an error, which is printed.

    Returns the per-file settings (:class:`initlint.inputs.targets.FileSettings`): each target's own
    ``[tool.initlint]`` merged with the command line."""
    from .inputs.config import ConfigError, check_choices, check_flags, load_config, merge_cli, parse_shape
    from .errors import LoadError, UnknownCode
    from .rules import select_rules
    from .inputs.targets import FileSettings

    try:
        check_flags(opts)
        config = load_config(opts.get("config_path"), targets[0])
        for text in opts.get("input_shapes") or ():
            parse_shape(text)  # before merging, which drops empty values: --input-shape "" is an error too
        settings = merge_cli(config, opts)
        check_choices(settings)
        select_rules(settings.get("select"), settings.get("ignore"))
    except (LoadError, UnknownCode, ConfigError) as exc:
        echo_error(str(exc))
        return None
    for warning in config.warnings:
        click.echo(f"initlint: warning: {warning}", err=True)
    if opts.get("plot_path"):
        from .report.plot import PlotError, require_matplotlib

        try:
            require_matplotlib()  # before minutes of auditing, not after
        except PlotError as exc:
            echo_error(str(exc))
            return None
    return FileSettings(opts, targets[0], config, settings)


def _note(notes: List[str], text: str) -> None:
    """A model passed over: said on stderr at once, and kept for the formats that carry notes."""
    click.echo(f"initlint: note: {text}", err=True)
    notes.append(text)


def _check_target(target: str, per_file: Any, opts: Dict[str, Any], say: Callable[[str], None],
                  reports: List[Report], fail_levels: Dict[int, str], lenient: bool, several: bool,
                  notes: List[str]) -> bool:
    """Load, build and audit the models of one target into ``reports``; True when something failed.

    The user's code runs with its own folder first on ``sys.path``, its stdout sent to stderr,
    and the RNGs seeded before the import and before each model is built.
    """
    from .inputs.config import DEFAULT_IMPORT_TIMEOUT, ConfigError
    from .errors import LoadError, NoModelsError, UnknownCode
    from .inputs.load import parse_shape, resolve, unbuildable_error
    from .inputs.usercode import own_folder, seed_everything, stdout_to_stderr

    try:  # the file's own [tool.initlint], merged with the command line
        settings = per_file(target)
        if settings is None:
            return False  # under a configuration file whose error is already reported
        shapes = [parse_shape(s) for s in settings.get("input_shapes") or []]
    except (LoadError, UnknownCode, ConfigError) as exc:
        reports.append(Report(model="-", target=target, error=str(exc)))
        return True
    for warning in per_file.take_warnings():
        click.echo(f"initlint: warning: {warning}", err=True)
    seed = settings.get("seed") or 0
    timeout = settings.get("import_timeout", DEFAULT_IMPORT_TIMEOUT)
    path = target_file(target)
    with own_folder(path), stdout_to_stderr():
        say(f"loading {target}")
        seed_everything(seed)
        try:
            candidates = resolve(target, timeout=timeout)
        except LoadError as exc:
            if lenient and isinstance(exc, NoModelsError):
                return False  # its classes only looked like torch modules to the static scan
            reports.append(Report(model="-", target=target, error=str(exc)))
            return True
        buildable = [c for c in candidates if not (c.implicit and c.required_args())]
        if not buildable and not lenient:
            reports.append(Report(model="-", target=target, error=str(unbuildable_error(target, candidates))))
            return True
        failed = False
        for cand in candidates:
            if cand not in buildable:
                # a building block such as Block(dim): the file's models that can be built are audited
                _note(notes, f"{cand.origin} skipped: it needs constructor arguments "
                             f"({', '.join(cand.required_args())})")
                continue
            seed_everything(seed)
            report = _audit_candidate(cand, settings, shapes, say, lenient, notes)
            if report is None:
                continue
            failed |= report.error is not None
            reports.append(report)
            fail_levels[id(report)] = settings.get("fail_on") or "warning"
            if opts.get("plot_path") and report.graph is not None:
                failed |= not _plot(report, opts["plot_path"], cand.name, several or len(candidates) > 1, say)
    return failed


def _audit_candidate(cand: Any, settings: Dict[str, Any], shapes: list, say: Callable[[str], None],
                     lenient: bool, notes: List[str]) -> Optional[Report]:
    """The report for one model; a model that cannot be built or probed gives a report with an error
    (None: a layer-less helper of a folder walk or a hook run, passed over with a note)."""
    from .api import audit
    from .errors import LoadError, NoProbeInputError, UnknownCode
    from .inputs.usercode import target_hook, user_code

    try:
        model = cand.instantiate()
        optimizer = target_hook(cand.origin) or _optimizer_spec(settings.get("optimizer"))
        say(f"auditing {cand.name}: capture, probe, rules")
        with user_code(f"running {cand.name}"):
            report = audit(model, device=settings.get("device") or "auto", select=settings.get("select"),
                           ignore=settings.get("ignore"), logits=settings.get("logits"),
                           seed=settings.get("seed") or 0, batch_size=settings.get("batch_size"),
                           input_shapes=shapes or None, rule_options=settings.get("rule_options"), name=cand.name,
                           target=cand.origin, per_module_ignores=settings.get("per_module_ignores"),
                           optimizer=optimizer, precision=settings.get("precision"),
                           grad_scaler=bool(settings.get("grad_scaler")),
                           clip_grad_norm=settings.get("clip_grad_norm"),
                           clip_grad_value=settings.get("clip_grad_value"),
                           batches_per_step=settings.get("batches_per_step"))
        _point_at_the_user_file(report, cand.origin, model)
        return report
    except (LoadError, UnknownCode) as exc:
        if lenient and cand.implicit and isinstance(exc, NoProbeInputError):
            _note(notes, f"{cand.origin} skipped: {exc}")
            return None
        return Report(model=cand.name, target=cand.origin, error=str(exc))
    except Exception as exc:  # the CLI's promise: one sentence, never a traceback
        if os.environ.get("INITLINT_TRACEBACK"):
            raise
        return Report(model=cand.name, target=cand.origin, error=_unexpected(exc))


def _optimizer_spec(text: Optional[str]) -> Any:
    """``--optimizer`` / ``optimizer = "..."``: a spec, callable on the model (None when not given)."""
    from .inputs.optimizer import parse_optimizer

    return parse_optimizer(text) if text else None


def _point_at_the_user_file(report: Report, origin: str, model: Any) -> None:
    """Findings still located inside an installed library (a model such as ``GPT2Model`` built whole by a
    factory of the user's file) point at the line of that file that builds the model."""
    from .capture.locate import construction_site, is_library

    path, _, name = origin.rpartition(":")
    if not (path.endswith(".py") and os.path.isfile(path)):
        return
    site = None
    for f in report.findings:
        if f.location and is_library(f.location[0]):
            site = site or construction_site(path, name, model)
            if site is None:
                return
            f.location = site


def _unexpected(exc: Exception) -> str:
    """One sentence for an exception nothing else explained."""
    import torch

    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in first:
        return (f"the probe does not fit in memory ({type(exc).__name__}: {first[:200]}); "
                f"lower --batch-size or --input-shape")
    return (f"initlint failed with {type(exc).__name__}: {first[:300]}; this is a bug in initlint, please report it "
            f"(INITLINT_TRACEBACK=1 shows the traceback)")


def _plot(report: Report, path: str, name: str, several: bool, say: Callable[[str], None]) -> bool:
    from .report.plot import PlotError

    path = _plot_path(path, name, several)
    say(f"plotting {name} to {path}")
    try:
        report.plot(path)
    except PlotError as exc:
        echo_error(str(exc))
        return False
    return True


def _shown_reports(reports: List[Report], fmt: str, opts: Dict[str, Any]) -> List[Report]:
    """The reports a format prints: on a terminal, text and concise leave errors to stderr (printed once)."""
    if opts.get("output") or fmt not in ("text", "concise"):
        return reports
    return [r for r in reports if not r.error]


def _echo_errors(reports: List[Report]) -> None:
    for r in reports:
        if r.error:
            where = r.target or r.model
            named = r.error.startswith(where.split(":")[0])  # "missing.py: no such file" names it already
            echo_error(r.error if named else f"{where}: {r.error}")


def _plot_path(path: str, name: str, several: bool) -> str:
    if not several:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}-{name}{ext or '.png'}"
