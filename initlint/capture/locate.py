"""Where each module was constructed: the ``self.conv1 = nn.Conv2d(...)`` line in the user's source.

Found statically from the parent module's class source, so it works for models built
anywhere. A child of a container (``nn.Sequential``, ``nn.ModuleList``) takes the line
where the container was assigned. A line inside an installed library is no place to edit:
a finding there moves to the user's line that built the enclosing module
(:func:`user_location`) or the line of the user's factory that built the model
(:func:`construction_site`). :func:`shown_path` is how every output format names a file.
"""
from __future__ import annotations

import ast
import inspect
import os
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Dict, Iterator, Mapping, Optional, Tuple

if TYPE_CHECKING:  # torch is imported by the caller; the path helpers serve the formats without it
    import torch.nn as nn

Location = Tuple[str, int]


@lru_cache(maxsize=256)
def _class_source(cls: type) -> Optional[Tuple[str, int, Tuple[str, ...]]]:
    if cls.__module__.startswith("torch."):
        return None
    try:
        lines, start = inspect.getsourcelines(cls)
        path = inspect.getsourcefile(cls)
    except (OSError, TypeError):
        return None
    if not path:
        return None
    return path, start, tuple(lines)


_ASSIGNED = re.compile(r"(?=\bself\.(\w+)\s*(?::[^=]*)?=(?!=)|add_module\(\s*['\"]([^'\"]+)['\"])")
"""An assignment of an attribute, found at every position (a lookahead), so one match never hides another
on the same line (``if self.a: self.b = x`` names both)."""

_ADDERS = ("add_module", "register_module")


@lru_cache(maxsize=256)
def _assignments(cls: type) -> Dict[str, int]:
    """Attribute -> the first line of ``cls``'s own source that assigns it (``self.attr = ...``,
    ``self.attr: T = ...``, ``self.a, self.b = ...``, ``add_module("attr", ...)``), from the syntax
    tree, so that neither a comment nor a docstring's example counts: the class read once, not once per
    module. A source that does not parse on its own is searched line by line (:data:`_ASSIGNED`)."""
    src = _class_source(cls)
    if src is None:
        return {}
    _, start, lines = src
    text = "".join(lines)
    nested = text[:1].isspace()  # a class defined in a function or another class: parsed inside a block
    try:
        tree = ast.parse("if 1:\n" + text if nested else text)
    except (SyntaxError, ValueError):
        return _assignments_by_line(start, lines)
    shift = start - (2 if nested else 1)
    found: Dict[str, int] = {}
    for node in ast.walk(tree):
        for attr in _assigned_names(node):
            found[attr] = min(found.get(attr, node.lineno + shift), node.lineno + shift)
    return found


def _assigned_names(node: ast.AST) -> Iterator[str]:
    """Attributes of ``self`` that ``node`` assigns, and the names it registers with ``add_module``."""
    if isinstance(node, ast.Assign) or isinstance(node, ast.AnnAssign) and node.value is not None:
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id == "self" \
                        and isinstance(part.ctx, ast.Store):
                    yield part.attr
    elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) and node.args \
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) in _ADDERS \
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        yield node.args[0].value


def _assignments_by_line(start: int, lines: Tuple[str, ...]) -> Dict[str, int]:
    """:func:`_assignments` from the text alone, line by line (a commented-out line skipped)."""
    found: Dict[str, int] = {}
    for offset, line in enumerate(lines):
        if "self." not in line and "add_module" not in line or line.lstrip().startswith("#"):
            continue  # no assignment, or commented-out code
        for match in _ASSIGNED.finditer(line):
            found.setdefault(match.group(1) or match.group(2), start + offset)
    return found


def _assignment_line(cls: type, attr: str) -> Optional[Location]:
    for klass in cls.__mro__:
        if klass is object or klass.__module__.startswith("torch."):  # nn.Module and its kin hold no user lines
            break
        line = _assignments(klass).get(attr)
        if line is not None:
            return (_class_source(klass)[0], line)  # type: ignore[index]
    return None


def class_location(cls: type) -> Optional[Location]:
    """The first line of ``cls``'s definition (its first decorator's), None for torch's classes and
    classes without source."""
    src = _class_source(cls)
    return None if src is None else (src[0], src[1])


class ModuleLocations(Mapping[str, Location]):
    """Module path -> (file, line) for every module whose construction line can be found, each looked up
    when first asked for: an audit with no finding reads no source (reading a large library's classes
    is a parse of each of their files, most of a second for a diffusers UNet). Read-only; it holds the
    module tree's classes and attribute names, never the model."""

    def __init__(self, model: nn.Module) -> None:
        self._root = type(model)
        modules = dict(model.named_modules())
        self._parents: Dict[str, Tuple[str, type, str]] = {}
        for path in modules:
            if path:
                parent_path, _, attr = path.rpartition(".")
                self._parents[path] = (parent_path, type(modules.get(parent_path, model)), attr)
        self._found: Dict[str, Optional[Location]] = {}

    def _locate(self, path: str) -> Optional[Location]:
        """The module's own assignment line, else its parent's location (a container's children share it)."""
        if path in self._found:
            return self._found[path]
        if not path:
            loc = class_location(self._root)
        elif path in self._parents:
            parent_path, cls, attr = self._parents[path]
            loc = _assignment_line(cls, attr) or self._locate(parent_path)
        else:
            loc = None
        self._found[path] = loc
        return loc

    def __getitem__(self, path: str) -> Location:
        loc = self._locate(path)
        if loc is None:
            raise KeyError(path)
        return loc

    def __iter__(self) -> Iterator[str]:
        return (p for p in ["", *self._parents] if self._locate(p) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __reduce__(self) -> Any:
        return dict, (dict(self),)


# ----------------------------------------------------------------------------- user code and libraries
@lru_cache(maxsize=1)
def _library_roots() -> Tuple[str, ...]:
    """Folders of installed packages and of the standard library, longest first."""
    import site
    import sysconfig

    roots = {sysconfig.get_paths().get(key) for key in ("purelib", "platlib", "stdlib", "platstdlib")}
    try:
        roots.update(site.getsitepackages())
        roots.add(site.getusersitepackages())
    except AttributeError:  # an embedded or virtualenv `site` without these helpers
        pass
    return tuple(sorted({os.path.abspath(r) for r in roots if r}, key=len, reverse=True))


_INSTALLED = re.compile(r"[\\/](site|dist)-packages[\\/]")


def library_root(path: str) -> Optional[str]:
    """The folder of installed packages (or the standard library) holding ``path``; None for the user's code."""
    full = os.path.abspath(path)
    match = _INSTALLED.search(full)
    if match:
        return full[:match.end() - 1]
    for root in _library_roots():
        if full.startswith(root + os.sep):
            return root
    return None


def is_library(path: str) -> bool:
    """True for a file of an installed package or the standard library: not a line the user can edit."""
    return library_root(path) is not None


def shown_path(path: str) -> str:
    """How every output format names a file: relative to the working directory when it lies below it,
    relative to its package folder for an installed library (``transformers/models/gpt2/modeling_gpt2.py``),
    else absolute."""
    root = library_root(path)
    if root is not None:  # even inside the project (a .venv below it): the package path is what one looks up
        return os.path.relpath(os.path.abspath(path), root)
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return os.path.abspath(path)
    return os.path.abspath(path) if rel == ".." or rel.startswith(".." + os.sep) else rel


def user_location(location: Optional[Location], module: str,
                  locations: Dict[str, Location]) -> Optional[Location]:
    """``location`` unless it lies in an installed library; then the user's line that built the nearest
    enclosing module (``self.backbone = GPT2Model(config)``), when there is one."""
    if location is None or not is_library(location[0]):
        return location
    path = module
    while True:
        found = locations.get(path)
        if found is not None and not is_library(found[0]):
            return found
        if not path:
            return location
        path = path.rpartition(".")[0]


def construction_site(path: str, name: str, model: nn.Module) -> Optional[Location]:
    """The line of the user's file ``path`` that builds the model named ``name``: inside a factory
    ``def name():``, the line that calls the model's class; else the line that binds ``name``."""
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None
    calls_class = re.compile(rf"\b{re.escape(type(model).__name__)}\b")
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            calls = [n.lineno for n in ast.walk(node)
                     if isinstance(n, ast.Call) and calls_class.search(ast.unparse(n.func))]
            return (os.path.abspath(path), min(calls) if calls else node.lineno)
        if _binds(node, name):
            return (os.path.abspath(path), node.lineno)
    return None


def _binds(node: ast.stmt, name: str) -> bool:
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t))
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == name for a in node.names)
    return False
