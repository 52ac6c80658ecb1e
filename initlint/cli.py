"""Command line: ``initlint check``, ``initlint rules``, ``initlint explain``.

Exit codes: 0 clean, 1 findings at or above ``--fail-on``, 2 usage or load error.
torch is imported only once a target is known to define a model.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Tuple

import click

from .errors import EXIT_CLEAN, EXIT_ERROR
from .version import __version__



def _fail(message: str) -> None:
    click.echo(f"initlint: error: {message}", err=True)
    sys.exit(EXIT_ERROR)






@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="initlint")
def main() -> None:
    """A linter for PyTorch models at initialisation."""


@main.command()
@click.argument("targets", nargs=-1, required=True)
@click.option("--device", default=None, help="auto, cpu, cuda, cuda:N or mps (default auto).")
@click.option("--input-shape", "input_shapes", multiple=True,
              help="Probe input shape such as 8,3,32,32; repeat for several positional inputs.")
@click.option("--logits/--no-logits", default=None, help="The model output is logits: check its softmax (IL004).")
@click.option("--select", multiple=True, help="Codes or prefixes to run (comma-separated), e.g. IL00,IL010.")
@click.option("--ignore", multiple=True, help="Codes or prefixes to skip (comma-separated).")
@click.option("--extend-select", multiple=True, help="Codes or prefixes to run on top of the selection (comma-separated).")
@click.option("--format", "fmt", default=None, help="text, concise, json, sarif or github.")
@click.option("--output", "output", default=None, type=click.Path(dir_okay=False), help="Write the report to FILE.")
@click.option("--seed", default=None, type=int, help="Seed of the probe batch (default 0).")
@click.option("--batch-size", default=None, type=int, help="Probe batch size when it is inferred (default 16).")
@click.option("--fail-on", default=None, help="Lowest severity that makes the exit code 1: info, warning, error.")
@click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="A pyproject.toml to read [tool.initlint] from (default: the nearest one above the target).")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Save the per-layer signal profile as an image (needs initlint[plot]).")
@click.option("--skip-files-without-models", is_flag=True,
              help="Skip files that define no torch nn.Module subclass or do not parse, and excluded paths (for pre-commit).")
def check(targets: Tuple[str, ...], **opts: Any) -> None:
    """Audit the models in TARGETS (FOLDER, FILE.py, FILE.py:NAME or package.module:NAME)."""
    from .targets import TargetError, collect

    progress = sys.stderr.isatty() and not os.environ.get("INITLINT_NO_PROGRESS")
    hook = opts["skip_files_without_models"]
    try:
        found = collect(targets, hook=hook, config_path=opts["config_path"])
    except TargetError as exc:
        _fail(str(exc))
    for note in found.notes:
        click.echo(f"initlint: note: {note}", err=True)
    if not found.targets:
        if hook:
            sys.exit(EXIT_CLEAN)
        _fail(found.nothing)
    from .runner import run_check

    code = run_check(found.targets, opts, progress=progress, implicit=found.implicit)
    sys.exit(code)


@main.command("rules")
def rules_cmd() -> None:
    """List every rule."""
    from tabulate import tabulate

    from .rules import all_rules

    rows = [[code, r.name, r.severity, r.summary] for code, r in all_rules().items()]
    click.echo(tabulate(rows, headers=["code", "name", "severity", "what it flags"], tablefmt="simple"))


@main.command()
@click.argument("code")
def explain(code: str) -> None:
    """Print the documentation of rule CODE (or its name)."""
    from .docs import render
    from .rules import UnknownCode, get_rule

    try:
        click.echo(render(get_rule(code)))
    except UnknownCode as exc:
        _fail(str(exc))
