"""Which files ``initlint check PATH...`` audits: folders are walked, files are scanned, nothing imported.

A folder is walked recursively for ``*.py`` files that define a torch ``nn.Module`` subclass
(by :mod:`initlint.inputs.scan`). The walk skips the paths matched by ``exclude`` (which replaces
:data:`DEFAULT_EXCLUDE`) and ``extend-exclude`` (added to it) of the ``[tool.initlint]``
table nearest to each folder. A pattern without ``/`` matches a file or folder name at any
depth (``"*_legacy.py"``, ``"fixtures"``); one with ``/`` matches the path relative to the
folder of that ``pyproject.toml`` (``"tests/data/*"``). Inside a git work tree, the files git
ignores are skipped too (one ``git check-ignore`` per walked folder). Files named on the command line are
always checked, except under ``--skip-files-without-models`` (the pre-commit hook), where
the exclusions apply to them too, as ruff's ``--force-exclude`` does.

This module is read before torch is imported; it must not import it.
"""
from __future__ import annotations

import fnmatch
import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set

from .scan import MAYBE, MODEL, UNPARSABLE, scan_file
from .config import target_file

DEFAULT_EXCLUDE = (".*", "venv", "build", "dist", "site-packages", "__pycache__", "node_modules")
"""Folder and file names a walk skips unless ``exclude`` replaces them (``.*``: hidden folders and files)."""


class TargetError(Exception):
    """A target cannot be used; the message is one sentence for the user."""


@dataclass
class Collected:
    """The targets to audit, in order, and what was said about the others."""

    targets: List[str] = field(default_factory=list)
    implicit: Set[str] = field(default_factory=set)
    """Files found in a folder: passed over quietly when they turn out to hold no model that can be built."""
    notes: List[str] = field(default_factory=list)
    nothing: str = ""
    """Why nothing is left to audit (set when ``targets`` is empty)."""
    plain: List[str] = field(default_factory=list)
    """Files named on the command line that define no torch module."""


# ----------------------------------------------------------------------------- exclusions
class Exclusions:
    """Glob patterns and the folder that patterns with ``/`` are relative to."""

    def __init__(self, patterns: Sequence[str], base: str) -> None:
        self.patterns = tuple(patterns)
        self.base = base
        names, paths = [], []
        for raw in self.patterns:
            pattern = raw.strip().rstrip("/")
            pattern = pattern[2:] if pattern.startswith("./") else pattern
            if "/" not in pattern:
                names.append(fnmatch.translate(pattern))
            else:
                paths.append(fnmatch.translate(pattern))
                if pattern.startswith("**/"):
                    paths.append(fnmatch.translate(pattern[3:]))
        self._names = re.compile("|".join(names)) if names else None
        self._paths = re.compile("|".join(paths)) if paths else None

    def matches_entry(self, rel_dir: str, name: str) -> bool:
        """Is ``name`` in the folder ``rel_dir`` (relative to :attr:`base`, posix) excluded? Its parents
        are taken as checked already, as a walk does."""
        if self._names is not None and self._names.match(name):
            return True
        return self._paths is not None and bool(self._paths.match(f"{rel_dir}/{name}" if rel_dir else name))

    def relative(self, path: str) -> str:
        """``path`` relative to :attr:`base` in posix form (``""`` for the base itself)."""
        rel = os.path.relpath(os.path.abspath(path), self.base).replace(os.sep, "/")
        return "" if rel == "." else rel

    def matches(self, path: str) -> bool:
        """Is ``path`` (a file or folder) excluded, by its own name or a folder above it (below ``base``)?"""
        rel = self.relative(path)
        parts = rel.split("/") if rel and not rel.startswith("..") else [os.path.basename(os.path.abspath(path))]
        return any(self.matches_entry("/".join(parts[:i]), part) for i, part in enumerate(parts))


class ExclusionFinder:
    """The exclusions in force in each folder: from ``--config``, or the nearest ``[tool.initlint]``."""

    def __init__(self, explicit: Optional[str] = None) -> None:
        self.explicit = explicit
        self._by_dir: Dict[str, Exclusions] = {}
        self._by_file: Dict[str, Exclusions] = {}

    def for_dir(self, directory: str) -> Exclusions:
        directory = os.path.abspath(directory)
        if directory not in self._by_dir:
            if self.explicit:
                self._by_dir[directory] = self._read(os.path.abspath(self.explicit))
            else:
                own = os.path.join(directory, "pyproject.toml")
                parent = os.path.dirname(directory)
                if os.path.isfile(own) and _has_section(own):
                    self._by_dir[directory] = self._read(own)
                elif parent == directory:
                    self._by_dir[directory] = Exclusions(DEFAULT_EXCLUDE, directory)
                else:
                    self._by_dir[directory] = self.for_dir(parent)
        return self._by_dir[directory]

    def _read(self, path: str) -> Exclusions:
        if path not in self._by_file:
            self._by_file[path] = _read_exclusions(path)
        return self._by_file[path]


def _has_section(path: str) -> bool:
    from .config import _has_section as has

    return has(path)


def _read_exclusions(path: str) -> Exclusions:
    """``exclude`` / ``extend-exclude`` of the file's ``[tool.initlint]`` (only these keys: no torch needed)."""
    from .config import KEYS, ConfigError, _display, _Invalid, _read

    base = os.path.dirname(path)
    if not os.path.isfile(path):
        raise TargetError(f"--config {path}: no such file")
    try:
        tool = _read(path).get("tool", {})
    except ConfigError as exc:
        raise TargetError(str(exc)) from None
    section = tool.get("initlint", {}) if isinstance(tool, dict) else {}
    section = section if isinstance(section, dict) else {}  # the loader reports a table of the wrong type
    values: Dict[str, Any] = {}
    for key in ("exclude", "extend-exclude"):
        if key in section:
            try:
                values[key] = KEYS[key].check(section[key])
            except _Invalid as exc:
                raise TargetError(f"{_display(path)}: [tool.initlint] {key} must be {exc}, "
                                  f"not {section[key]!r}") from None
    patterns = list(values.get("exclude", DEFAULT_EXCLUDE)) + list(values.get("extend-exclude", []))
    return Exclusions(tuple(patterns), base)


# ----------------------------------------------------------------------------- walking
def walk(folder: str, finder: ExclusionFinder) -> List[str]:
    """``*.py`` files below ``folder`` (sorted, excluded and git-ignored paths skipped; symlinked
    folders not followed)."""
    found: List[str] = []
    for directory, dirs, files in os.walk(folder):
        rules = finder.for_dir(directory)
        rel = rules.relative(directory)
        dirs[:] = sorted(d for d in dirs if not rules.matches_entry(rel, d))
        found.extend(os.path.normpath(os.path.join(directory, f)) for f in sorted(files)
                     if f.endswith(".py") and not rules.matches_entry(rel, f))
    ignored = git_ignored(folder, found)
    return [p for p in found if p not in ignored]


def git_ignored(folder: str, paths: List[str]) -> Set[str]:
    """The ``paths`` that git ignores (``.gitignore``, ``.git/info/exclude``, the global excludes file),
    asked in one ``git check-ignore`` call. Files git tracks are never ignored; outside a git
    work tree, or without git, nothing is."""
    if not paths:
        return set()
    try:
        done = subprocess.run(["git", "-C", folder, "check-ignore", "--stdin", "-z"],
                              input="\0".join(os.path.abspath(p) for p in paths) + "\0",
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return set()
    if done.returncode not in (0, 1):  # 128: not a git work tree
        return set()
    listed = {os.path.normcase(os.path.abspath(p)) for p in done.stdout.split("\0") if p}
    return {p for p in paths if os.path.normcase(os.path.abspath(p)) in listed}


def _file_of(target: str) -> Optional[str]:
    """The .py file a target names without ``:NAME``, else None (module paths, FILE:NAME)."""
    if os.path.exists(target):
        return target if target.endswith(".py") and os.path.isfile(target) else None
    return None


def collect(targets: Sequence[str], *, hook: bool = False, config_path: Optional[str] = None) -> Collected:
    """Expand folders, scan files, drop what holds no model; raise :class:`TargetError` on bad configuration."""
    out = Collected()
    finder = ExclusionFinder(config_path)
    empty: List[str] = []
    for target in targets:
        if os.path.isdir(target):
            before = len(out.targets)
            for path in walk(target, finder):
                _add_scanned(out, path, implicit=True)
            if len(out.targets) == before:
                empty.append(target)
            continue
        path = _file_of(target)
        if hook and path is None and os.path.isfile(target):
            out.notes.append(f"{_shown(target)} skipped: not a .py file")  # pre-commit passes scripts by shebang
            continue
        if path is None:
            out.targets.append(target)  # FILE:NAME, package.module:NAME, missing files: the loader says
            continue
        if hook and finder.for_dir(os.path.dirname(os.path.abspath(path))).matches(path):
            continue
        _add_scanned(out, path, implicit=hook, explicit=not hook)
    if not out.targets:
        out.nothing = _nothing(targets, empty)
    out.notes.extend(f"{_shown(p)} skipped: it defines no torch nn.Module subclass" for p in out.plain if out.targets)
    return out


def _add_scanned(out: Collected, path: str, *, implicit: bool, explicit: bool = False) -> None:
    result = scan_file(path)
    if result.verdict in (MODEL, MAYBE) or (explicit and result.verdict == UNPARSABLE):
        out.targets.append(path)  # an explicit file that does not parse gets the loader's syntax error
        if implicit:
            out.implicit.add(path)
    elif result.verdict == UNPARSABLE:
        out.notes.append(f"{_shown(path)} skipped: {result.reason}")
    elif explicit:
        out.plain.append(path)


def _nothing(targets: Sequence[str], empty: List[str]) -> str:
    if len(targets) == 1 and empty:
        return f"{targets[0]}: no Python file below it defines a torch nn.Module subclass"
    if len(targets) == 1:
        path = targets[0]
        return f"{path} defines no nn.Module subclass; name a factory with {path}:NAME"
    return "none of the targets defines an nn.Module subclass"


def _shown(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


# ----------------------------------------------------------------------------- settings per file
class FileSettings:
    """The settings of each target: its own ``[tool.initlint]`` (or ``--config``) merged with the command line.

    Each configuration file is read once; its warnings are handed out once by :meth:`take_warnings`.
    """

    def __init__(self, opts: Dict[str, Any], first: str, config: Any, settings: Dict[str, Any]) -> None:
        self.opts = opts
        self.base = settings
        """The settings of the first target (output format, plot, default --fail-on)."""
        self._merged: Dict[Optional[str], Dict[str, Any]] = {self._key(first): settings}
        self._warnings: List[str] = []
        self._failed: Set[Optional[str]] = set()

    def _key(self, target: str) -> Optional[str]:
        from .config import find_pyproject

        explicit = self.opts.get("config_path")
        if explicit:
            return os.path.abspath(explicit)
        start = target_file(target)
        found = find_pyproject(start if os.path.exists(start) else os.getcwd())
        return os.path.abspath(found) if found else None

    def __call__(self, target: str) -> Optional[Dict[str, Any]]:
        """Merged settings for ``target``; raises ``ConfigError``/``UnknownCode`` for a bad file the first
        time, and returns None for the other targets under that file (its error is reported once)."""
        from .config import load_config, merge_cli

        key = self._key(target)
        if key in self._failed:
            return None
        if key not in self._merged:
            try:
                config = load_config(self.opts.get("config_path"), target)
                self._merged[key] = merge_cli(config, self.opts)
            except Exception:
                self._failed.add(key)
                raise
            self._warnings.extend(config.warnings)
        return self._merged[key]

    def take_warnings(self) -> List[str]:
        """Warnings of the files read since the last call."""
        out, self._warnings = self._warnings, []
        return out
