"""What ``initlint fix TARGET`` does: seed, build the model, repair it, print the summary and the code.

It never writes to the user's source files: the code goes to stdout or to ``--output FILE``. On
stdout the summary leads as Python comments, so ``initlint fix x.py > fixes.py`` is a module.
Exit codes: 0 when no repairable finding remains, 1 when some remain, 2 on errors.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import click

from ..errors import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS
from ..inputs.config import target_file


class FixError(Exception):
    """One sentence for the user; exit code 2."""


def run_fix(target: str, opts: Dict[str, Any]) -> int:
    """Repair the model named by ``target``; return the exit code."""
    try:
        _check_cheap(opts, target)  # before torch is imported: a typo answers at once
    except FixError as exc:
        click.echo(f"initlint: error: {exc}", err=True)
        return EXIT_ERROR
    from ..api import UsageError
    from ..inputs.config import ConfigError
    from ..inputs.load import LoadError
    from ..rules import UnknownCode

    from ..inputs.usercode import own_folder, stdout_to_stderr, user_code

    path = target_file(target)
    try:
        settings, shapes = _settings(target, opts)
        with own_folder(path), stdout_to_stderr():  # as `check` runs a target: see initlint.inputs.usercode
            name, origin, model = _build(target, int(settings.get("seed") or 0))
            with user_code(f"running {name}"):
                rep = _repair(model, settings, shapes, name, origin)
    except (FixError, LoadError, UnknownCode, ConfigError, UsageError) as exc:
        click.echo(f"initlint: error: {exc}", err=True)
        return EXIT_ERROR
    code = rep.code()
    if opts.get("output"):
        click.echo(rep.summary())
        try:
            with open(opts["output"], "w", encoding="utf-8") as fh:
                fh.write(code)
        except OSError as exc:
            click.echo(f"initlint: error: cannot write {opts['output']}: {exc.strerror}", err=True)
            return EXIT_ERROR
        click.echo(f"code: written to {opts['output']}")
    else:
        click.echo(as_comments(rep.summary()) + "\n\n" + code.rstrip("\n"))
    return EXIT_CLEAN if rep.fixed else EXIT_FINDINGS


def as_comments(text: str) -> str:
    """``text`` as Python comment lines."""
    return "\n".join(f"# {line}".rstrip() for line in text.splitlines())


def _settings(target: str, opts: Dict[str, Any]) -> Tuple[Dict[str, Any], List[Tuple[int, ...]]]:
    from ..inputs.config import load_config, merge_cli
    from ..inputs.load import parse_shape
    from ..rules import select_rules

    config = load_config(opts.get("config_path"), target)
    for warning in config.warnings:
        click.echo(f"initlint: warning: {warning}", err=True)
    for text in opts.get("input_shapes") or ():
        parse_shape(text)
    cli = {k: v for k, v in opts.items() if k not in ("output", "config_path", "method")}
    settings = merge_cli(config, cli)
    seed = settings.get("seed")
    if seed is not None and not 0 <= seed < 2**63:
        raise FixError(f"--seed must be an integer from 0 to 2**63 - 1, not {seed}")
    settings["method"] = opts.get("method") or "auto"
    select_rules(settings.get("select"), settings.get("ignore"))
    return settings, [parse_shape(s) for s in settings.get("input_shapes") or []]


METHODS = ("auto", "analytic", "lsuv")
"""The methods of :func:`initlint.repair.planner.fix`, here so that a wrong one is reported without importing torch."""


def _check_cheap(opts: Dict[str, Any], target: str) -> None:
    method = opts.get("method")
    if method is not None and method not in METHODS:
        raise FixError(f"unknown --method '{method}' (choose from {', '.join(METHODS)})")
    _check_output(opts.get("output"), target)


def _check_output(output: Optional[str], target: str) -> None:
    """``--output`` may not name the target's own source file: fix never edits the user's code."""
    if not output:
        return
    path = target_file(target)
    if os.path.exists(output) and os.path.exists(path) and os.path.samefile(output, path):
        raise FixError(f"--output {output} is the target's own source file; initlint fix never edits it, "
                       f"write the code to another file")
    if os.path.isdir(output):
        raise FixError(f"--output {output} is a directory; name a file")


def _build(target: str, seed: int) -> Tuple[str, str, Any]:
    """The one model of ``target``, built right after seeding (as a seeded script of the user's would)."""
    from ..inputs.load import resolve, unbuildable_error

    _seed(seed)
    candidates = resolve(target)
    buildable = [c for c in candidates if not (c.implicit and c.required_args())]
    if not buildable:
        raise unbuildable_error(target, candidates)
    if len(buildable) > 1:
        names = ", ".join(c.name for c in buildable)
        raise FixError(f"{target} holds {len(buildable)} models ({names}); name one with {target}:NAME")
    cand = buildable[0]
    _seed(seed)
    return cand.name, cand.origin, cand.instantiate()


def _seed(seed: int) -> None:
    from ..inputs.usercode import seed_everything

    seed_everything(seed)  # as `initlint check` does: the printed code matches a seeded build


def _repair(model: Any, settings: Dict[str, Any], shapes: List[Tuple[int, ...]], name: str, origin: str) -> Any:
    from .planner import fix

    return fix(model, method=settings["method"], select=settings.get("select"), ignore=settings.get("ignore"),
               seed=int(settings.get("seed") or 0), device=settings.get("device") or "auto",
               logits=settings.get("logits"), batch_size=settings.get("batch_size"), input_shapes=shapes or None,
               rule_options=settings.get("rule_options"), per_module_ignores=settings.get("per_module_ignores"),
               name=name, target=origin)
