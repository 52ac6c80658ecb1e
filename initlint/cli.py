"""Command line: ``initlint check``, ``initlint fix``, ``initlint rules``, ``initlint explain``.

Exit codes: 0 clean, 1 findings at or above ``--fail-on``, 2 usage or load error.
torch is imported only once a target is known to define a model.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Tuple

import click

from .version import __version__

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


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
              help="Silently skip .py files that define no nn.Module subclass (for pre-commit).")
def check(targets: Tuple[str, ...], **opts: Any) -> None:
    """Audit the models in TARGETS (FILE.py, FILE.py:NAME or package.module:NAME)."""
    from .scan import file_defines_module

    progress = sys.stderr.isatty() and not os.environ.get("INITLINT_NO_PROGRESS")
    wanted = []
    for target in targets:
        path = target.split(":")[0] if ":" in target and not os.path.exists(target) else target
        if path.endswith(".py") and ":" not in target and file_defines_module(path) is False:
            if opts["skip_files_without_models"]:
                continue
            if len(targets) == 1:
                _fail(f"{path} defines no nn.Module subclass; name a factory with {path}:NAME")
            continue
        wanted.append(target)
    if not wanted:
        if opts["skip_files_without_models"]:
            sys.exit(EXIT_CLEAN)
        _fail("none of the targets defines an nn.Module subclass")
    from .runner import run_check

    code = run_check(wanted, opts, progress=progress)
    sys.exit(code)


@main.command("fix")
@click.argument("target")
@click.option("--method", default=None, help="auto (default), analytic (fans and gains) or lsuv (measured scales).")
@click.option("--output", "output", default=None, type=click.Path(dir_okay=False),
              help="Write the code of the repair to FILE (never the target's own file).")
@click.option("--device", default=None, help="auto, cpu, cuda, cuda:N or mps (default auto).")
@click.option("--input-shape", "input_shapes", multiple=True, help="Probe input shape such as 8,3,32,32; repeatable.")
@click.option("--logits/--no-logits", default=None, help="The model output is logits: check its softmax (IL004).")
@click.option("--select", multiple=True, help="Codes or prefixes to run and repair (comma-separated).")
@click.option("--ignore", multiple=True, help="Codes or prefixes to skip (comma-separated).")
@click.option("--seed", default=None, type=int, help="Seed of the build, the fresh draws and the probe (default 0).")
@click.option("--batch-size", default=None, type=int, help="Probe batch size when it is inferred (default 16).")
@click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="A pyproject.toml to read [tool.initlint] from.")
def fix(target: str, **opts: Any) -> None:
    """Re-initialise what the findings blame in the model TARGET and print the code of the repair."""
    from .fix_cli import run_fix

    sys.exit(run_fix(target, opts))


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
