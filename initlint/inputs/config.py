"""Settings: defaults, ``[tool.initlint]`` in pyproject.toml, CLI flags, ``audit()`` keywords.

Precedence: command-line flags, then the configuration file, then defaults; rule selection
is layered as in ruff (:func:`initlint.rules.resolve_selection`). The file is the nearest
``pyproject.toml`` at or above each target that has a ``[tool.initlint]`` table, or the one
given with ``--config``. Unknown keys are warned about; values of the wrong type or out of
range stop the run with one sentence naming the file and the key. :func:`check_flags` and
:func:`apply_settings` hold command-line flags and ``audit()`` keywords to the same checks.
"""
from __future__ import annotations

import difflib
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import ConfigError, UsageError

KNOWN = ("select", "ignore", "extend_select", "logits", "seed", "batch_size", "rule_options", "device", "fail_on",
         "per_module_ignores", "input_shapes")
"""Settings :func:`initlint.audit` accepts as keywords (``-`` may be written for ``_``)."""

SEED_MIN, SEED_MAX = -(2 ** 63), 2 ** 64 - 1
"""The seeds ``torch.Generator.manual_seed`` accepts."""
MAX_BATCH = 2 ** 31 - 1
MAX_BATCHES_PER_STEP = 1 << 20
"""The most batches a run's optimizer step may be said to average over (``batches-per-step``)."""
DEFAULT_IMPORT_TIMEOUT = 120.0
MAX_IMPORT_TIMEOUT = 1e6
MIN_ELEMENT_BYTES = 2
"""The smallest element the probe builds (a half-precision input): a shape needs at least this per element."""


class _Invalid(Exception):
    """A value check failed: the message completes "KEY must be ...", or is a whole sentence when ``whole``."""

    def __init__(self, message: str, whole: bool = False) -> None:
        super().__init__(message)
        self.whole = whole


@dataclass
class Config:
    """Settings read from a file, with the warnings it produced."""

    path: Optional[str] = None
    values: Dict[str, Any] = field(default_factory=dict)
    warnings: List[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- value checks

def target_file(target: str) -> str:
    """The file or folder of a target: ``models.py:build`` names ``models.py``, unless a file of that
    whole name exists (``C:`` paths and names with a colon)."""
    return target.split(":")[0] if ":" in target and not os.path.exists(target) else target

def _codes(value: Any) -> List[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise _Invalid("a list of rule codes or names such as [\"IL001\", \"dead-relu\"]")
    return [c.strip() for v in items for c in v.split(",") if c.strip()]


def _api_codes(value: Any) -> List[str]:
    """``select``/``ignore``/``extend_select`` of :func:`initlint.audit`: a string or any list, tuple or set of them."""
    return _codes(sorted(value) if isinstance(value, (set, frozenset)) else
                  list(value) if isinstance(value, tuple) else value)


def _globs(value: Any) -> List[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v.strip() for v in items):
        raise _Invalid("a list of glob patterns such as [\"tests/fixtures\", \"*_legacy.py\"]")
    return [v.strip() for v in items]


def _one_of(choices: Callable[[], List[str]]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in choices():
            raise _Invalid(f"one of {', '.join(choices())}")
        return value
    return check


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise _Invalid("a string")
    return value


def _integer(minimum: int, maximum: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise _Invalid(f"an integer of at least {minimum} and at most {maximum}")
        return value
    return check


def _seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not SEED_MIN <= value <= SEED_MAX:
        raise _Invalid("an integer from -2**63 to 2**64 - 1")
    return value


def _timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not 0 <= value <= MAX_IMPORT_TIMEOUT:  # NaN fails both comparisons
        raise _Invalid(f"a number of seconds from 0 (no limit) to {MAX_IMPORT_TIMEOUT:.0f}")
    return float(value)


DEVICE = re.compile(r"auto|(cpu|cuda|mps|meta)(:[0-9]+)?")
"""What ``--device`` may name; whether the machine has it is checked once torch is imported."""


def _device(value: Any) -> str:
    if not DEVICE.fullmatch(_string(value)):
        raise _Invalid("auto, cpu, cuda, cuda:N or mps")
    return value


def _positive(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Invalid("a finite number above 0")
    try:
        number = float(value)
    except OverflowError:  # an integer past float's range (10**400)
        number = float("inf")
    if not 0 < number < float("inf"):  # NaN fails the comparison
        raise _Invalid("a finite number above 0")
    return number


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid("true or false")
    return value


def _shapes(value: Any) -> List[str]:
    """``"8,3,32,32"``, ``[8, 3, 32, 32]``, ``["8,10", "8,4"]`` or ``[[8, 10], [8, 4]]`` -> strings."""
    def one(shape: Any) -> str:
        _checked_shape(shape, "a shape such as \"8,3,32,32\" or [8, 3, 32, 32], or a list of shapes",
                       lambda _: f"input-shape {shape!r}")
        return shape if isinstance(shape, str) else ",".join(str(s) for s in shape)
    if isinstance(value, list) and value and all(isinstance(s, int) for s in value):
        return [one(value)]
    if isinstance(value, list) and value:
        return [one(s) for s in value]
    return [one(value)]


def _checked_shape(shape: Any, expected: str, name: Callable[[Tuple[int, ...]], str]) -> Tuple[int, ...]:
    """One shape as text or integers, parsed; ``expected`` says what a bad one should have been,
    ``name(parsed)`` names a shape too large to probe."""
    parsed = shape_from_text(shape) if isinstance(shape, str) else _int_shape(shape)
    if parsed is None:
        raise _Invalid(expected)
    too_big = probe_size_problem(parsed)
    if too_big:
        raise _Invalid(f"{name(parsed)}: {too_big}", True)
    return parsed


def _int_shape(shape: Any) -> Optional[Tuple[int, ...]]:
    if isinstance(shape, (list, tuple)) and shape and all(isinstance(s, int) and not isinstance(s, bool) and s > 0
                                                          for s in shape):
        return tuple(shape)
    return None


def shape_from_text(text: str) -> Optional[Tuple[int, ...]]:
    """``8,3,32,32`` or ``8x3x32x32`` -> ``(8, 3, 32, 32)``; None unless every size is a positive integer."""
    parts = [p.strip() for p in text.strip().strip("()[]").replace("x", ",").split(",")]
    if not all(p.isascii() and p.isdigit() for p in parts):
        return None
    shape = tuple(int(p) if len(p) < 40 else 10 ** 40 for p in parts)  # 10**40 is as impossible as any longer
    return shape if shape and all(s > 0 for s in shape) else None


def parse_shape(text: str) -> Tuple[int, ...]:
    """``--input-shape`` text -> sizes: ``8,3,32,32``, ``8x3x32x32`` and ``(8,3,32,32)`` all give ``(8, 3, 32, 32)``.

    Raises :class:`UsageError` on anything else, and on a shape whose probe input cannot fit in
    memory (estimated before anything is allocated)."""
    shape = shape_from_text(text)
    if shape is None:
        raise UsageError(f"--input-shape {text!r} is not a list of positive integers such as 8,3,32,32")
    too_big = probe_size_problem(shape)
    if too_big:
        raise UsageError(f"--input-shape {text!r} cannot be probed: {too_big}")
    return shape


def probe_size_problem(shape: Tuple[int, ...]) -> Optional[str]:
    """Why a probe input of ``shape`` cannot be built, or None; estimated before anything is allocated."""
    numel = math.prod(shape)
    if numel > 2 ** 63 - 1:
        return f"{numel:.3g} elements, more than a tensor can hold"
    need, memory = numel * MIN_ELEMENT_BYTES, total_memory()
    if memory is not None and need > memory:
        return (f"a probe input of {numel:.3g} elements needs at least {_bytes(need)} "
                f"({MIN_ELEMENT_BYTES} bytes per element), more than this machine's {_bytes(memory)} of memory")
    return None


def total_memory() -> Optional[int]:
    """Physical memory in bytes, lowered to the cgroup (container) limit; None where it cannot be read."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as fh:
            limit = fh.read().strip()
        if limit.isdigit():
            memory = min(memory, int(limit))
    except OSError:
        pass
    return memory if memory > 0 else None


def _bytes(n: float) -> str:
    """``1.82 TB``: binary units, as memory is sold."""
    units = ("bytes", "KB", "MB", "GB", "TB", "PB")
    power = min(int(math.log(max(n, 1), 1024)), len(units) - 1)
    return f"{int(n)} bytes" if power == 0 else f"{n / 1024 ** power:.3g} {units[power]}"


def _formats() -> List[str]:
    from ..output.formats import FORMATS

    return list(FORMATS)


def _optimizer(value: Any) -> str:
    """An optimizer spec such as ``AdamW(lr=3e-4, weight_decay=0.1)``, parsed now (without torch) so a bad
    one answers before any model is built; kept as text."""
    from .optimizer import parse_optimizer

    if not isinstance(value, str):
        raise _Invalid("a string such as \"AdamW(lr=3e-4, weight_decay=0.1)\"")
    try:
        parse_optimizer(value)
    except UsageError as exc:
        raise _Invalid(str(exc), True) from None
    return value


def _severities() -> List[str]:
    from ..report.findings import SEVERITIES

    return list(SEVERITIES)


def _rule_options(value: Any, prefix: str = "rules.") -> Dict[str, Dict[str, Any]]:
    """``{rule name or code: {option: value}}``, every option checked against the rule's ``options``."""
    from ..rules import UnknownCode, find_rule, rule_info

    if not isinstance(value, dict):
        raise _Invalid("a table of rule names to option tables, such as [tool.initlint.rules.dead-relu]")
    out: Dict[str, Dict[str, Any]] = {}
    for key, opts in value.items():
        try:
            rule = find_rule(key)
        except UnknownCode:
            raise _Invalid(f"{prefix}{key}: unknown rule (known: {', '.join(rule_info())})", True) from None
        if not isinstance(opts, dict):
            raise _Invalid(f"{prefix}{key} must be a table of options, such as [tool.initlint.rules.{key}]", True)
        checked = out.setdefault(rule.code, {})
        for option, setting in opts.items():
            name = option if option in rule.options else str(option).replace("_", "-")
            if name not in rule.options:
                known = ", ".join(rule.options) or "none"
                raise _Invalid(f"{prefix}{key}: {rule.code} ({rule.name}) has no option '{option}' "
                               f"(its options: {known})", True)
            checked[name] = _option_value(rule, f"{prefix}{key}.{option}", name, setting)
    return out


def _option_value(rule: Any, where: str, name: str, value: Any) -> Any:
    default = rule.options[name]
    numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif numeric:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
            (isinstance(default, float) or isinstance(value, int))
    else:
        ok = isinstance(value, type(default))
    if ok and numeric:
        return _in_range(rule, where, name, default, value)
    if not ok:
        kind = _TYPE_NAMES.get(type(default), type(default).__name__)
        raise _Invalid(f"{where} must be {'an' if kind[0] in 'aeiou' else 'a'} {kind} "
                       f"(default {default!r}), not {value!r}", True)
    return value


def _in_range(rule: Any, where: str, name: str, default: Any, value: Any) -> Any:
    low, high = getattr(rule, "option_ranges", {}).get(name, (None, None))
    kind = "a number" if isinstance(default, float) else "an integer"
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        number = math.inf
    if not math.isfinite(number) or (low is not None and number < low) or (high is not None and number > high):
        span = (f"from {low:g} to {high:g}" if high is not None else f"of at least {low:g}") if low is not None \
            else "that is finite"
        raise _Invalid(f"{where} must be {kind} {span} (default {default!r}), not {value!r}", True)
    return number if isinstance(default, float) else value


_TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list"}

def _ignores(value: Any) -> Dict[str, List[str]]:
    from ..rules.suppress import normalise_ignores, unknown_code

    try:
        table = normalise_ignores(value, "per-module-ignores")
    except TypeError:
        raise _Invalid("a table of module patterns to lists of codes, such as \"encoder.*\" = [\"IL004\"]") from None
    unknown = unknown_code(table)
    if unknown:
        raise _Invalid(f"per-module-ignores: '{unknown[0]}' (for '{unknown[1]}') is not a known rule code or name", True)
    return table


@dataclass(frozen=True)
class Key:
    """One key of ``[tool.initlint]``: where it goes and how it is checked."""

    name: str
    dest: str
    check: Callable[[Any], Any]
    help: str


KEYS: Dict[str, Key] = {k.name: k for k in (
    Key("select", "select", _codes, "codes, prefixes or names of the rules to run (default: all)"),
    Key("ignore", "ignore", _codes, "codes, prefixes or names of the rules to skip"),
    Key("extend-select", "extend_select", _codes, "rules to run on top of select"),
    Key("exclude", "exclude", _globs, "paths a folder walk skips, replacing the defaults"),
    Key("extend-exclude", "extend_exclude", _globs, "paths a folder walk skips, besides the defaults"),
    Key("fail-on", "fail_on", _one_of(_severities), "lowest severity that makes the exit code 1"),
    Key("device", "device", _device, "auto, cpu, cuda, cuda:N or mps"),
    Key("seed", "seed", _seed, "seed of the probe batch"),
    Key("batch-size", "batch_size", _integer(1, MAX_BATCH), "probe batch size when the input is inferred"),
    Key("import-timeout", "import_timeout", _timeout, "seconds a target's import may take (0: no limit)"),
    Key("logits", "logits", _boolean, "the model output is logits (check its softmax, IL004)"),
    Key("precision", "precision", _one_of(lambda: ["fp16", "bf16"]), "the precision training uses (fp16, bf16)"),
    Key("grad-scaler", "grad_scaler", _boolean, "fp16 training uses torch.amp.GradScaler"),
    Key("clip-grad-norm", "clip_grad_norm", _positive, "training clips the gradients' total norm to this (the "
        "optimizer's first step is taken so)"),
    Key("clip-grad-value", "clip_grad_value", _positive, "training clamps every gradient element to +-this"),
    Key("batches-per-step", "batches_per_step", _integer(1, MAX_BATCHES_PER_STEP), "the run's optimizer step averages "
        "the gradients of this many batches like the probe's (its global batch over the probe's batch)"),
    Key("format", "format", _one_of(_formats), "output format"),
    Key("input-shape", "input_shapes", _shapes, "probe input shape(s)"),
    Key("rules", "rule_options", _rule_options, "per-rule options, by rule name or code"),
    Key("per-module-ignores", "per_module_ignores", _ignores, "module path pattern -> codes to silence there"),
    Key("optimizer", "optimizer", _optimizer, "the optimizer the model trains with, such as \"AdamW(lr=3e-4)\" "
        "(its first step is audited)"),
)}


# ----------------------------------------------------------------------------- reading
def find_pyproject(start: str) -> Optional[str]:
    """Nearest ``pyproject.toml`` at or above ``start`` (a file or directory) that has [tool.initlint]."""
    directory = os.path.abspath(start if os.path.isdir(start) else os.path.dirname(os.path.abspath(start)) or ".")
    while True:
        candidate = os.path.join(directory, "pyproject.toml")
        if os.path.isfile(candidate) and _has_section(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def _has_section(path: str) -> bool:
    try:
        tool = _read(path).get("tool", {})
    except ConfigError:
        return True  # let load_config report the broken file
    return isinstance(tool, dict) and "initlint" in tool


def _read(path: str) -> Dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]

    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: it is not UTF-8 text (byte {exc.start})") from None


def load_config(explicit: Optional[str], target: str) -> Config:
    """Read and check ``[tool.initlint]`` from ``explicit`` or the nearest pyproject.toml above ``target``."""
    path = explicit
    if path is None:
        start = target_file(target)
        path = find_pyproject(start if os.path.exists(start) else os.getcwd())
    if path is None:
        return Config()
    if not os.path.exists(path):
        raise ConfigError(f"--config {path}: no such file")
    if not os.path.isfile(path):
        raise ConfigError(f"--config {path} is not a file")
    tool = _read(path).get("tool", {})
    cfg = Config(path=path)
    if not isinstance(tool, dict) or "initlint" not in tool:
        cfg.warnings.append(f"{_display(path)} has no [tool.initlint] table; using the defaults")
        return cfg
    section = tool["initlint"]
    if not isinstance(section, dict):
        raise ConfigError(f"{_display(path)}: tool.initlint must be a table, such as [tool.initlint]")
    for key, value in section.items():
        spec = KEYS.get(key)
        if spec is None:
            cfg.warnings.append(_unknown_key(path, key))
            continue
        try:
            cfg.values[spec.dest] = spec.check(value)
        except _Invalid as exc:
            where = f"{_display(path)}: [tool.initlint] "
            raise ConfigError(where + (str(exc) if exc.whole else f"{key} must be {exc}, not {value!r}")) from None
    return cfg


def _display(path: str) -> str:
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return path if rel.startswith("..") else rel


def _unknown_key(path: str, key: str) -> str:
    close = difflib.get_close_matches(key.replace("_", "-"), list(KEYS), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"{_display(path)}: unknown key '{key}' in [tool.initlint] (ignored{hint})"


def merge_cli(config: Config, opts: Dict[str, Any]) -> Dict[str, Any]:
    """CLI flags win over the file (a clipping flag over the file's clipping either way); list flags given as
    comma-separated strings are split.

    ``select`` and ``ignore`` of the result are resolved codes: the file's selection, then the
    command line's, each applied in turn as ruff does (see :func:`initlint.rules.resolve_selection`).
    """
    merged = dict(config.values)
    cli: Dict[str, Any] = {}
    for key, value in opts.items():
        if key in ("select", "ignore", "extend_select", "input_shapes"):
            value = [c.strip() for v in value or () for c in (v.split(",") if key != "input_shapes" else [v])
                     if c.strip()] or None
        if key == "fmt":
            key = "format"
        if value is not None and value is not False or (key == "logits" and value is False):
            cli[key] = value
    merged.update(cli)
    for given, other in (("clip_grad_norm", "clip_grad_value"), ("clip_grad_value", "clip_grad_norm")):
        if given in cli and other not in cli:
            merged.pop(other, None)  # the command line's way of clipping replaces the file's other way
    merged["select"], merged["ignore"] = _resolve_rules(config.values, cli)
    merged.pop("extend_select", None)
    return merged


def _resolve_rules(file: Dict[str, Any], cli: Dict[str, Any]) -> Any:
    from ..rules import NoRulesLeft, Selection, resolve_selection

    layers = [Selection(v.get("select") or None, v.get("ignore") or (), v.get("extend_select") or ())
              for v in (file, cli)]
    enabled, ignored = resolve_selection(layers)
    if not enabled:
        raise NoRulesLeft("the selection leaves no rule to run (select, extend-select and ignore of the "
                          "configuration file, then of the command line)")
    return enabled, ignored


FLAGS = {"seed": "--seed", "batch_size": "--batch-size", "import_timeout": "--import-timeout", "device": "--device",
         "optimizer": "--optimizer", "precision": "--precision", "clip_grad_norm": "--clip-grad-norm",
         "clip_grad_value": "--clip-grad-value", "batches_per_step": "--batches-per-step"}
"""Command-line options checked like the keys of the same name in the file."""


def check_flags(opts: Dict[str, Any]) -> None:
    """Refuse an out-of-range ``--seed``, ``--batch-size`` or ``--import-timeout``, or a ``--device`` that is
    not a device name, with one sentence."""
    checks = {k.dest: k.check for k in KEYS.values()}
    for dest, flag in FLAGS.items():
        value = opts.get(dest)
        if value is None:
            continue
        try:
            checks[dest](value)
        except _Invalid as exc:
            raise ConfigError(str(exc) if exc.whole else f"{flag} must be {exc}, not {value}") from None


def show_progress() -> bool:
    """Progress lines on stderr: when it is a terminal, unless ``INITLINT_NO_PROGRESS`` is set; anywhere with
    ``INITLINT_PROGRESS=1``."""
    if os.environ.get("INITLINT_PROGRESS", "").strip() not in ("", "0"):
        return True
    return sys.stderr.isatty() and not os.environ.get("INITLINT_NO_PROGRESS")


def check_choices(settings: Dict[str, Any]) -> None:
    """Refuse an unknown output ``format`` or ``fail-on`` severity, or two ways of clipping, with one sentence."""
    fmt = settings.get("format") or "text"
    if fmt not in _formats():
        raise UsageError(f"unknown format '{fmt}' (choose from {', '.join(_formats())})")
    if settings.get("clip_grad_norm") is not None and settings.get("clip_grad_value") is not None:
        raise UsageError("clip-grad-norm and clip-grad-value were both given; training clips one way: give one")
    fail_on = settings.get("fail_on") or "warning"
    if fail_on not in _severities():
        raise UsageError(f"--fail-on takes one of {', '.join(_severities())}, not '{fail_on}'")


def _api_shapes(value: Any) -> List[Tuple[int, ...]]:
    flat = isinstance(value, (list, tuple)) and value and all(isinstance(s, int) for s in value)
    given = [value] if flat or not isinstance(value, (list, tuple)) else value
    return [_checked_shape(shape, "a list of shapes such as [(8, 3, 32, 32)]",
                           lambda parsed: f"input_shapes {tuple(parsed)}") for shape in given]


_API_CHECKS: Dict[str, Callable[[Any], Any]] = {
    "select": _api_codes, "ignore": _api_codes, "extend_select": _api_codes,
    "seed": _seed, "batch_size": _integer(1, MAX_BATCH), "fail_on": _one_of(_severities),
    "rule_options": lambda v: _rule_options(v, "rule_options."), "input_shapes": _api_shapes,
}


def apply_settings(base: Dict[str, Any], extra: Dict[str, Any]) -> Dict[str, Any]:
    """Merge extra keyword settings into ``base`` and check every value; a bad one is a usage error.

    CLI flags and file values reach :func:`initlint.audit` through here too, so the same
    checks hold for every way of giving a setting.
    """
    out = dict(base)
    for key, value in extra.items():
        norm = key.replace("-", "_")
        if norm not in KNOWN:
            raise UsageError(f"unknown setting '{key}' (known: {', '.join(KNOWN)})")
        out[norm] = value
    for key, check in _API_CHECKS.items():
        if out.get(key) is None:
            continue
        try:
            out[key] = check(out[key])
        except _Invalid as exc:
            raise UsageError(str(exc) if exc.whole else f"{key} must be {exc}, not {_short(out[key])}") from None
    out["seed"] = 0 if out.get("seed") is None else out["seed"]
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
