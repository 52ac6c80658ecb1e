"""Command line: ``initlint check``, ``initlint fix``, ``initlint sweep``, ``initlint rules``, ``initlint explain``.

Exit codes: 0 clean, 1 findings at or above ``--fail-on``, 2 usage or load error, 130 interrupted.
torch is imported only once a target is known to define a model.
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Dict, List, Tuple

import click

from .errors import EXIT_CLEAN, EXIT_ERROR, EXIT_INTERRUPTED, echo_error
from .version import __version__
from .inputs.config import target_file

# torch warns at import when NumPy is missing; initlint does not need NumPy, and `pip install .`
# does not bring it, so the warning would greet every first run of a minimal install
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)


def _fail(message: str) -> None:
    echo_error(message)
    sys.exit(EXIT_ERROR)


def _interrupted() -> None:
    click.echo("initlint: interrupted", err=True)
    sys.exit(EXIT_INTERRUPTED)


class _Group(click.Group):
    """Click's usage errors as one ``initlint: error:`` line (exit 2); Ctrl-C as exit 130."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.ClickException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # plain `initlint`: the help, as click shows it
                exc.show()
                sys.exit(EXIT_ERROR)
            message = exc.format_message().rstrip(".")
            hint = f" (see '{exc.ctx.command_path} --help')" if isinstance(exc, click.UsageError) and exc.ctx else ""
            _fail(message[:1].lower() + message[1:] + hint)
        except (click.Abort, KeyboardInterrupt):
            _interrupted()
        sys.exit(code if isinstance(code, int) else EXIT_CLEAN)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="initlint")
def main() -> None:
    """A linter for PyTorch models at initialisation."""


SHAPE_HELP = ("Probe input shape: sizes separated by commas, such as 8,3,32,32 (8x3x32x32 and (8,3,32,32) "
              "are read the same way); repeat for several positional inputs.")


@main.command()
@click.argument("targets", nargs=-1, required=True)
@click.option("--device", default=None, help="auto, cpu, cuda, cuda:N or mps (default auto).")
@click.option("--input-shape", "input_shapes", multiple=True, help=SHAPE_HELP)
@click.option("--logits/--no-logits", default=None, help="The model output is logits: check its softmax (IL004).")
@click.option("--precision", default=None, type=click.Choice(["fp16", "bf16"]),
              help="The precision training uses: also probe under torch.autocast at that dtype (precision-headroom).")
@click.option("--grad-scaler", is_flag=True, default=None,
              help="fp16 training uses torch.amp.GradScaler: judge gradient underflow at its initial scale.")
@click.option("--select", multiple=True, help="Codes or prefixes to run (comma-separated), e.g. IL00,IL010.")
@click.option("--ignore", multiple=True, help="Codes or prefixes to skip (comma-separated).")
@click.option("--extend-select", multiple=True, help="Codes or prefixes to run on top of the selection (comma-separated).")
@click.option("--format", "fmt", default=None, help="text, concise, json, sarif or github.")
@click.option("--output", "output", default=None, type=click.Path(dir_okay=False), help="Write the report to FILE.")
@click.option("--seed", default=None, type=int,
              help="Seed of the probe batch, and of torch, random and NumPy before each target is imported and "
                   "built (default 0).")
@click.option("--batch-size", default=None, type=int, help="Probe batch size when it is inferred (default 16).")
@click.option("--import-timeout", default=None, type=float, metavar="SECONDS",
              help="Stop importing a target that takes longer (default 120; 0: no limit).")
@click.option("--fail-on", default=None, help="Lowest severity that makes the exit code 1: info, warning, error.")
@click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="A pyproject.toml to read [tool.initlint] from (default: the nearest one above the target).")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Save the per-layer signal profile as an image (needs initlint[plot]).")
@click.option("--skip-files-without-models", is_flag=True,
              help="Skip files that define no torch nn.Module subclass or do not parse, and excluded paths (for pre-commit).")
@click.option("--optimizer", default=None, metavar="SPEC",
              help="The optimizer the model trains with, such as \"AdamW(lr=3e-4, weight_decay=0.1)\" or "
                   "package.module:Name(...); its first step is audited. A target file's "
                   "initlint_optimizer(model) is used when it defines one.")
@click.option("--clip-grad-norm", default=None, type=float, metavar="MAX_NORM",
              help="Training clips the gradients' total norm to MAX_NORM (clip_grad_norm_): the optimizer's first "
                   "step is taken on gradients clipped so.")
@click.option("--clip-grad-value", default=None, type=float, metavar="VALUE",
              help="Training clamps every gradient element to +-VALUE (clip_grad_value_).")
@click.option("--batches-per-step", default=None, type=int, metavar="N",
              help="The run's optimizer step averages the gradients of N batches like the probe's: its global "
                   "batch over the probe's batch (default 1). An SGD step is judged so.")
def check(targets: Tuple[str, ...], **opts: Any) -> None:
    """Audit the models in TARGETS (FOLDER, FILE.py, FILE.py:NAME or package.module:NAME).

    Progress lines (loading, auditing, reporting) go to stderr when it is a terminal;
    INITLINT_PROGRESS=1 shows them anywhere (a CI log, a file), INITLINT_NO_PROGRESS=1 hides them.
    """
    _one_answer(_check, targets, opts)


def missing_path(target: str) -> str:
    """Why a target that names a file or folder cannot be used (it does not exist), else ``""``.

    Module targets (``package.module:NAME``) are left to the loader: only importing tells."""
    path = target_file(target)
    looks_like_path = path.endswith(".py") or "/" in path or os.sep in path
    if not looks_like_path or os.path.exists(path):
        return ""
    return f"{path}: no such file" + ("" if path.endswith(".py") else " or folder")


def _one_answer(command: Any, *args: Any) -> None:
    """Run a command's body: Ctrl-C exits 130 in one line; an error nothing else explained is one
    sentence saying it is a bug in initlint, never a traceback."""
    try:
        command(*args)
    except KeyboardInterrupt:
        _interrupted()
    except Exception as exc:
        if os.environ.get("INITLINT_TRACEBACK"):
            raise
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        _fail(f"initlint failed with {type(exc).__name__}: {first}; this is a bug in initlint, please report it "
              f"(INITLINT_TRACEBACK=1 shows the traceback)")


def _check(targets: Tuple[str, ...], opts: Dict[str, Any]) -> None:
    from .inputs.targets import TargetError, collect

    _check_arguments(targets, opts)
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
    _supported_torch()
    from .inputs.config import show_progress
    from .runner import run_check

    code = run_check(found.targets, opts, progress=show_progress(), implicit=found.implicit, notes=found.notes)
    sys.exit(code)


def _supported_torch() -> None:
    """Refuse a torch older than initlint supports with one sentence (exit 2), before the pipeline imports it."""
    from .errors import UnsupportedTorch

    try:
        from . import compat  # noqa: F401 - raises on a torch that is too old
    except UnsupportedTorch as exc:
        _fail(str(exc))


def _check_arguments(targets: Tuple[str, ...], opts: Dict[str, Any]) -> None:
    """Refuse a bad value of the command line itself with one sentence, before any file is read and before
    torch is imported: a missing path, a malformed number, shape or device, an unknown format, severity
    or rule. (The configuration files are checked once a target holds a model.)"""
    from .inputs.config import ConfigError, check_choices, check_flags, parse_shape
    from .errors import UsageError
    from .rules import UnknownCode, check_patterns

    for target in targets:  # a typo answers at once, before a model of another target is audited
        if missing_path(target):
            _fail(missing_path(target))
    try:
        check_flags(opts)
        for text in opts.get("input_shapes") or ():
            parse_shape(text)
        if opts.get("fmt") is not None or opts.get("fail_on") is not None:
            check_choices({"format": opts.get("fmt"), "fail_on": opts.get("fail_on")})
        check_patterns(_patterns(opts, "select", "ignore", "extend_select"))
    except (ConfigError, UsageError, UnknownCode) as exc:
        _fail(str(exc))


def _patterns(opts: Dict[str, Any], *keys: str) -> List[str]:
    """The rule codes, prefixes and names of comma-separated options."""
    return [c.strip() for key in keys for v in opts.get(key) or () for c in v.split(",") if c.strip()]


@main.command("fix")
@click.argument("target")
@click.option("--method", default=None, help="auto (default), analytic (fans and gains) or lsuv (measured scales).")
@click.option("--output", "output", default=None, type=click.Path(dir_okay=False),
              help="Write the code of the repair to FILE (never the target's own file).")
@click.option("--device", default=None, help="auto, cpu, cuda, cuda:N or mps (default auto).")
@click.option("--input-shape", "input_shapes", multiple=True, help=SHAPE_HELP)
@click.option("--logits/--no-logits", default=None, help="The model output is logits: check its softmax (IL004).")
@click.option("--select", multiple=True, help="Codes or prefixes to run and repair (comma-separated).")
@click.option("--ignore", multiple=True, help="Codes or prefixes to skip (comma-separated).")
@click.option("--seed", default=None, type=int, help="Seed of the build, the fresh draws and the probe (default 0).")
@click.option("--batch-size", default=None, type=int, help="Probe batch size when it is inferred (default 16).")
@click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="A pyproject.toml to read [tool.initlint] from.")
def fix(target: str, **opts: Any) -> None:
    """Re-initialise what the findings blame in the model TARGET and print the code of the repair."""
    _one_answer(_fix, target, opts)


def _fix(target: str, opts: Dict[str, Any]) -> None:
    from .inputs.config import ConfigError, check_flags, parse_shape
    from .errors import UsageError
    from .rules import UnknownCode, check_patterns

    if missing_path(target):  # the command line's own values, checked before torch is imported
        _fail(missing_path(target))
    try:
        check_flags(opts)
        for text in opts.get("input_shapes") or ():
            parse_shape(text)
        check_patterns(_patterns(opts, "select", "ignore"))
    except (ConfigError, UsageError, UnknownCode) as exc:
        _fail(str(exc))
    _supported_torch()
    from .repair.command import run_fix

    sys.exit(run_fix(target, opts))


@main.command("rules")
def rules_cmd() -> None:
    """List every rule."""
    from tabulate import tabulate

    from .rules import rule_info

    rows = [[code, r.name, r.severity, r.summary] for code, r in rule_info().items()]
    click.echo(tabulate(rows, headers=["code", "name", "severity", "what it flags"], tablefmt="simple"))


@main.command()
@click.argument("code")
def explain(code: str) -> None:
    """Print the documentation of rule CODE (or its name)."""
    from .output.docs import page
    from .rules import UnknownCode, find_rule

    try:
        click.echo(page(find_rule(code)), nl=False)
    except UnknownCode as exc:
        _fail(str(exc))


@main.command("sweep")
@click.argument("target")
@click.option("--width", default=None, metavar="KEYWORD=SIZES",
              help="The factory's width keyword and the sizes to build, such as d_model=64,128,256,512.")
@click.option("--depth", default=None, metavar="KEYWORD=SIZES",
              help="The factory's depth keyword and the sizes to build, such as n_layer=2,4,8,16.")
@click.option("--set", "settings", multiple=True, metavar="KEYWORD=VALUE",
              help="A keyword given to every build, such as vocab_size=512 (repeatable).")
@click.option("--optimizer", default=None, help='The optimizer, such as "AdamW(lr=1e-3)" (default Adam(lr=1e-3)).')
@click.option("--steps", default=3, type=int, show_default=True, help="Optimizer steps at each size.")
@click.option("--target-width", "target_width", default=None, type=int,
              help="The width the findings extrapolate to (default 8x the largest width tried).")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Save the coordinate curves as an image (a second axis goes to FILE-depth.png; needs initlint[plot]).")
@click.option("--format", "fmt", default="text", show_default=True, help="text, json or sarif.")
@click.option("--output", "output", default=None, type=click.Path(dir_okay=False), help="Write the report to FILE.")
@click.option("--device", default=None, help="auto, cpu, cuda, cuda:N or mps (default: where the factory builds it).")
@click.option("--input-shape", "input_shapes", multiple=True, help=SHAPE_HELP)
@click.option("--logits/--no-logits", default=None,
              help="The model output is logits: the loss is cross-entropy on random labels (default: decided from "
                   "the output and the inputs).")
@click.option("--seed", default=0, type=int, show_default=True, help="Seed of every build and of the probe batch.")
@click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="A pyproject.toml whose [tool.initlint.rules] options (limit of width-unstable and depth-unstable) "
                   "apply (default: the nearest one above the target).")
@click.option("--import-timeout", default=None, type=float, metavar="SECONDS",
              help="Stop importing the target after this long (default: no limit).")
def sweep_cmd(target: str, **opts: Any) -> None:
    """Build the model TARGET (FILE.py:FACTORY or package.module:NAME, such as transformers:GPT2Config) at
    several widths and depths, take a few optimizer steps at each, and flag the layers whose scale grows
    with size (a coordinate check).

    The progress bar over the builds goes to stderr when it is a terminal (INITLINT_PROGRESS=1 shows it
    anywhere); the time the sweep took is printed there at the end.
    """
    _one_answer(_sweep, target, opts)


def _sweep(target: str, opts: Dict[str, Any]) -> None:
    _supported_torch()
    from .coord.command import run_sweep

    sys.exit(run_sweep(target, opts))
