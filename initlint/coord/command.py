"""What ``initlint sweep TARGET --width KW=SIZES [--depth KW=SIZES]`` does: load the factory, sweep, print
the report. Exit codes as ``initlint check``: 0 clean, 1 findings, 2 usage or load error (or no size measured).

The command line's own values are parsed before torch is imported (:func:`parse_axis`, :func:`parse_setting`).
"""
from __future__ import annotations

import ast
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

import click

from ..errors import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, LoadError, UsageError, echo_error
from ..inputs.config import show_progress, target_file

FORMATS = ("text", "json", "sarif")


def parse_axis(option: str, text: str) -> Tuple[str, List[int]]:
    """``d_model=64,128,256`` -> ``("d_model", [64, 128, 256])``; :class:`UsageError` when it is not that."""
    keyword, sep, sizes = text.partition("=")
    keyword = keyword.strip()
    if not sep or not keyword.isidentifier():
        raise UsageError(f"{option} '{text}': write it as KEYWORD=SIZE,SIZE,... such as "
                         f"{'d_model=64,128,256,512' if option == '--width' else 'n_layer=2,4,8,16'}")
    try:
        values = [int(s) for s in sizes.replace(" ", "").split(",") if s]
    except ValueError:
        raise UsageError(f"{option} '{text}': the sizes must be whole numbers separated by commas") from None
    if len(set(values)) < 2 or min(values) < 1:
        raise UsageError(f"{option} '{text}': give at least two different sizes >= 1 to fit a trend")
    return keyword, values


def parse_setting(text: str) -> Tuple[str, Any]:
    """``--set vocab_size=512`` -> ``("vocab_size", 512)``: the value a Python literal, else a string."""
    keyword, sep, value = text.partition("=")
    keyword = keyword.strip()
    if not sep or not keyword.isidentifier():
        raise UsageError(f"--set '{text}': write it as KEYWORD=VALUE, such as vocab_size=512")
    try:
        return keyword, ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        return keyword, value.strip()


def check_arguments(target: str, opts: Dict[str, Any]) -> None:
    """Refuse a bad value of the command line with one sentence, before torch is imported."""
    if ":" not in target or not target.rpartition(":")[2].isidentifier():
        raise UsageError(f"name the factory that builds the model: FILE.py:NAME or package.module:NAME, not '{target}'")
    path = target_file(target)
    if path.endswith(".py") and not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    if not opts.get("width") and not opts.get("depth"):
        raise UsageError("give --width KEYWORD=SIZES or --depth KEYWORD=SIZES (or both)")
    for option in ("width", "depth"):
        if opts.get(option):
            parse_axis(f"--{option}", opts[option])
    for text in opts.get("settings") or ():
        parse_setting(text)
    if opts.get("fmt") not in FORMATS:
        raise UsageError(f"unknown format '{opts.get('fmt')}' (choose from {', '.join(FORMATS)})")
    if opts.get("steps") is not None and opts["steps"] < 0:
        raise UsageError(f"--steps must be 0 or more, not {opts['steps']}")
    if opts.get("target_width") is not None and opts["target_width"] < 1:
        raise UsageError(f"--target-width must be a positive whole number, not {opts['target_width']}")
    if opts.get("optimizer"):
        from ..inputs.optimizer import parse_optimizer

        parse_optimizer(opts["optimizer"])


def run_sweep(target: str, opts: Dict[str, Any]) -> int:
    """Sweep the factory ``target`` names; print the report; return the exit code."""
    try:
        check_arguments(target, opts)
    except UsageError as exc:
        echo_error(str(exc))
        return EXIT_ERROR
    from ..inputs.usercode import own_folder, stdout_to_stderr

    try:
        with own_folder(target_file(target)), stdout_to_stderr():
            report = _sweep(target, opts)
    except (LoadError, UsageError) as exc:
        echo_error(str(exc))
        return EXIT_ERROR
    text = {"text": report.to_text, "json": report.to_json, "sarif": report.to_sarif}[opts["fmt"]]()
    from ..output.formats import deliver

    if not deliver(text, opts.get("output")):
        return EXIT_ERROR
    if opts.get("plot_path"):
        error = _plots(report, opts["plot_path"])
        if error:
            echo_error(error)
            return EXIT_ERROR
    builds = sum(len(a.sizes) for a in report.data.axes)
    click.echo(f"initlint: sweep of {builds} build(s) x {report.steps} step(s) took {report.seconds:.1f} s", err=True)
    return EXIT_CLEAN if report.clean else EXIT_FINDINGS


def _sweep(target: str, opts: Dict[str, Any]) -> Any:
    from ..inputs.load import resolve
    from ..inputs.optimizer import parse_optimizer
    from .run import sweep

    factory = resolve(target, opts.get("import_timeout"))[0].build
    width = dict([parse_axis("--width", opts["width"])]) if opts.get("width") else None
    depth = dict([parse_axis("--depth", opts["depth"])]) if opts.get("depth") else None
    fixed = dict(parse_setting(t) for t in opts.get("settings") or ())
    optimizer = parse_optimizer(opts["optimizer"]) if opts.get("optimizer") else None
    inputs = _shaped(opts.get("input_shapes") or (), int(opts.get("seed") or 0))
    rule_options = _rule_options(target, opts.get("config_path"))
    total = sum(len(parse_axis("--" + k, opts[k])[1]) for k in ("width", "depth") if opts.get(k))
    with _Progress(total) as progress:
        report = sweep(factory, width=width, depth=depth, example_inputs=inputs, optimizer=optimizer,
                       steps=opts["steps"], seed=int(opts.get("seed") or 0), device=opts.get("device"),
                       target_width=opts.get("target_width"), fixed=fixed, logits=opts.get("logits"),
                       rule_options=rule_options, progress=progress)
    report.target = target
    return report


def _rule_options(target: str, config_path: Optional[str]) -> Dict[str, Dict[str, Any]]:
    """The options ``[tool.initlint.rules]`` gives the sweep rules (and signal-drift, whose limit the depth
    budget reads); the other rules' options are for ``initlint check``."""
    from ..inputs.config import ConfigError, load_config
    from ..rules.il005_signal_drift import SignalDrift
    from ..rules.il018_width_unstable import WidthUnstable
    from ..rules.il019_depth_unstable import DepthUnstable

    try:
        config = load_config(config_path, target)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if config_path:
        for warning in config.warnings:
            click.echo(f"initlint: warning: {warning}", err=True)
    names = {key for cls in (SignalDrift, WidthUnstable, DepthUnstable) for key in (cls.code, cls.name)}
    return {k: dict(v) for k, v in (config.values.get("rule_options") or {}).items() if k in names}


def _shaped(texts: Any, seed: int) -> Any:
    if not texts:
        return None
    from ..attempts import model_device
    from ..inputs.load import parse_shape, shaped_inputs

    shapes = [parse_shape(t) for t in texts]
    return lambda model: shaped_inputs(shapes, model, seed, model_device(model))  # the model is on its device


class _Progress:
    """A progress bar over the builds on stderr (when progress is shown: a terminal, or INITLINT_PROGRESS=1)."""

    def __init__(self, total: int) -> None:
        self.bar = click.progressbar(length=total, label="sweep", file=sys.stderr,
                                     item_show_func=lambda item: item) if show_progress() else None
        self.done = 0

    def __enter__(self) -> "_Progress":
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def __call__(self, done: int, total: int, label: str) -> None:
        if self.bar is not None:
            self.bar.update(done - self.done, label)
        self.done = done


def _plots(report: Any, path: str) -> Optional[str]:
    """The coordinate plot of each axis: ``path`` for the first, ``STEM-depth.EXT`` for a second; an error sentence."""
    from ..report.plot import PlotError

    stem, ext = os.path.splitext(path)
    try:
        for i, axis in enumerate(report.data.axes):
            if axis.curves:
                name = path if i == 0 else f"{stem}-{axis.kind}{ext or '.png'}"
                report.plot(name, kind=axis.kind)
                click.echo(f"initlint: {axis.kind} plot written to {name}", err=True)
    except PlotError as exc:
        return str(exc)
    return None
