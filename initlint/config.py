"""Settings: defaults, ``[tool.initlint]`` in pyproject.toml, CLI flags, ``audit()`` keywords.

Precedence: command-line flags, then the configuration file, then defaults.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

KNOWN = ("select", "ignore", "logits", "seed", "batch_size", "rule_options", "device", "fail_on",
         "per_module_ignores", "input_shapes")
FILE_KEYS = {"select", "ignore", "fail-on", "device", "seed", "batch-size", "logits", "rules",
             "per-module-ignores", "input-shape", "format"}


class ConfigError(ValueError):
    """The configuration file cannot be used."""


@dataclass
class Config:
    """Settings read from a file, with the warnings it produced."""

    path: Optional[str] = None
    values: Dict[str, Any] = field(default_factory=dict)
    warnings: List[str] = field(default_factory=list)


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
        return "initlint" in _read(path).get("tool", {})
    except ConfigError:
        return True  # let load_config report the broken file


def _read(path: str) -> Dict[str, Any]:
    import tomllib

    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None


def load_config(explicit: Optional[str], target: str) -> Config:
    """Read ``[tool.initlint]`` from ``explicit`` or the nearest pyproject.toml above ``target``."""
    path = explicit
    if path is None:
        start = target.split(":")[0] if ":" in target and not os.path.exists(target) else target
        path = find_pyproject(start if os.path.exists(start) else os.getcwd())
    if path is None:
        return Config()
    if not os.path.isfile(path):
        raise ConfigError(f"--config {path}: no such file")
    section = _read(path).get("tool", {}).get("initlint", {})
    cfg = Config(path=path)
    for key, value in section.items():
        if key not in FILE_KEYS:
            cfg.warnings.append(f"{path}: unknown key '{key}' in [tool.initlint] (ignored)")
            continue
        cfg.values[key.replace("-", "_")] = value
    if "rules" in cfg.values:
        cfg.values["rule_options"] = cfg.values.pop("rules")
    if "input_shape" in cfg.values:
        shapes = cfg.values.pop("input_shape")
        cfg.values["input_shapes"] = [shapes] if isinstance(shapes, str) else list(shapes)
    return cfg


def merge_cli(config: Config, opts: Dict[str, Any]) -> Dict[str, Any]:
    """CLI flags win over the file; list flags given as comma-separated strings are split."""
    merged = dict(config.values)
    for key in ("select", "ignore"):
        if isinstance(merged.get(key), str):
            merged[key] = [merged[key]]
    for key, value in opts.items():
        if key in ("select", "ignore", "input_shapes"):
            value = [c.strip() for v in value for c in (v.split(",") if key != "input_shapes" else [v]) if c.strip()] or None
        if key == "fmt":
            key = "format"
        if value is not None and value is not False or (key == "logits" and value is False):
            merged[key] = value
    return merged


def apply_settings(base: Dict[str, Any], extra: Dict[str, Any]) -> Dict[str, Any]:
    """Merge extra keyword settings into ``base``; unknown names are a usage error."""
    from .api import UsageError

    out = dict(base)
    for key, value in extra.items():
        norm = key.replace("-", "_")
        if norm not in KNOWN:
            raise UsageError(f"unknown setting '{key}' (known: {', '.join(KNOWN)})")
        out[norm] = value
    out["seed"] = 0 if out.get("seed") is None else out["seed"]
    return out
