"""Torch-free static scan: does a Python file define a torch ``nn.Module`` subclass?

``initlint check`` (and so the pre-commit hook and folder targets) uses it to decide which
files to import, without importing torch or the file itself. A class counts when one of its
bases resolves, by reading import statements and assignments, to a torch module class:

* ``import torch.nn as nn`` / ``from torch import nn`` / ``from torch.nn import Module`` /
  ``import torch`` followed by ``nn.Module``, ``Module``, ``torch.nn.Module`` (or any other
  class of ``torch.nn``, such as ``nn.Sequential``);
* an alias (``Base = nn.Module``) or a class of the same file that is itself one;
* a class of the project, imported from a sibling module (``from .base import Base``) or
  from a package found above the file: that file is read the same way;
* a model class of a known torch library: ``transformers`` (not its ``TF``/``Flax``
  classes), ``lightning``'s ``LightningModule``, ``diffusers``, ``timm``, ``torchvision``,
  ``torch_geometric``.

Bases from Flax, JAX, TensorFlow/Keras, Ansible and the standard library are not torch
modules. A base the scan cannot follow (a third-party package it does not know, a base
built by a call) is judged conservatively: the file is a candidate ("maybe") only if it
imports torch itself; it is then imported and audited if it does define an ``nn.Module``
subclass, and passed over quietly if it does not. Files without such a class, and files
that do not parse (Python 2, newer syntax, a bad encoding), are never imported.

To stay well under a millisecond per file, the scan does not parse whole files: it reads
their skeleton, the statements that decide what a module-level class derives from (imports
at module level or in module-level ``if``/``try``/``with`` blocks, ``class`` headers,
one-line assignments), outside triple-quoted strings. A candidate file is then parsed
whole, since it is about to be imported.
"""
from __future__ import annotations

import ast
import bisect
import builtins
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple, Union

MODEL, MAYBE, NONE, UNPARSABLE = "model", "maybe", "none", "unparsable"
"""Verdicts of :func:`scan_file`."""

TORCH, UNKNOWN, OTHER = 2, 1, 0
"""What a base class is, strongest first: combining several possibilities keeps the strongest."""

_CLASS_WITH_BASES = re.compile(rb"^[ \t]*class[ \t]+\w+[ \t]*\(", re.M)


@dataclass
class ScanResult:
    """What the scan concluded about one file."""

    verdict: str
    models: List[str] = field(default_factory=list)
    """Public classes that derive from a torch module."""
    unresolved: List[str] = field(default_factory=list)
    """``Net (base keras.Model)``: public classes whose base the scan could not follow."""
    reason: str = ""
    """Why the file does not parse (for :data:`UNPARSABLE`)."""


# ----------------------------------------------------------------------------- what a dotted name is
_TORCH_NON_MODULES = {"Parameter", "UninitializedParameter", "UninitializedBuffer", "Buffer"}
_TORCH_NON_MODULE_PARTS = {"utils", "init", "functional", "parameter", "attention", "grad", "common_types"}
_TORCH_OTHER_MODULES = {"torch.jit.ScriptModule", "torch.jit.RecursiveScriptModule", "torch.fx.GraphModule"}


def _torch_kind(parts: List[str]) -> int:
    dotted, last = ".".join(parts), parts[-1]
    if dotted in _TORCH_OTHER_MODULES:
        return TORCH
    in_nn = parts[1:2] == ["nn"] or parts[1:3] == ["ao", "nn"]
    if in_nn and last[:1].isupper() and last not in _TORCH_NON_MODULES \
            and not _TORCH_NON_MODULE_PARTS.intersection(parts[:-1]):
        return TORCH
    return OTHER


def _transformers_kind(parts: List[str]) -> int:
    last = parts[-1]
    if last.startswith(("TF", "Flax")) or any(p.startswith(("modeling_tf", "modeling_flax")) for p in parts):
        return OTHER
    modelish = last.endswith("Model") or "For" in last or any(p.startswith("modeling_") for p in parts[:-1])
    return TORCH if modelish and last[:1].isupper() else OTHER


def _diffusers_kind(parts: List[str]) -> int:
    last = parts[-1]
    if last.startswith("Flax") or last.endswith(("Pipeline", "Scheduler", "Config", "Output")):
        return OTHER
    modelish = last in ("ModelMixin", "AutoencoderKL") or last.endswith("Model") or "models" in parts[:-1]
    return TORCH if modelish else OTHER


def _parts_rule(*markers: str) -> Callable[[List[str]], int]:
    return lambda parts: TORCH if set(markers).intersection(parts[1:-1]) and parts[-1][:1].isupper() else OTHER


_FRAMEWORKS: Dict[str, Callable[[List[str]], int]] = {
    "torch": _torch_kind,
    "transformers": _transformers_kind,
    "diffusers": _diffusers_kind,
    "lightning": lambda parts: TORCH if parts[-1] == "LightningModule" else OTHER,
    "pytorch_lightning": lambda parts: TORCH if parts[-1] == "LightningModule" else OTHER,
    "timm": _parts_rule("models", "layers"),
    "torchvision": _parts_rule("models", "ops"),
    "torch_geometric": _parts_rule("nn"),
}
"""Top-level package -> how to judge a class imported from it, without reading the package."""

_NOT_TORCH = {"flax", "jax", "jaxlib", "haiku", "equinox", "optax", "tensorflow", "tf_keras", "keras", "ansible",
              "mxnet", "paddle", "mindspore", "numpy", "pandas", "sklearn", "scipy", "pydantic", "attr", "attrs",
              "django", "flask", "fastapi", "sqlalchemy", "click", "typer", "pytest", "setuptools"}
"""Packages whose classes are never torch modules."""

_STDLIB = set(getattr(sys, "stdlib_module_names", ())) | {"builtins", "typing_extensions"}
_BUILTINS = set(dir(builtins))
_TORCH_IMPORTS = {"torch", "transformers", "diffusers", "lightning", "pytorch_lightning", "timm", "torchvision",
                  "torch_geometric"}


# ----------------------------------------------------------------------------- one file's names
Ref = Union[None, Tuple[str, str, "_Module"], Tuple[str, "_Module", str]]
"""``None`` (unknown), ``("q", dotted, where)`` (an absolute name seen from a file) or ``("c", module, class)``."""


class _Module:
    """The module-level names of one parsed file: imports, assignments, classes."""

    def __init__(self, path: str, tree: ast.Module) -> None:
        self.path = path
        self.package = _package_of(path)
        self.bindings: Dict[str, List[Union[str, ast.expr, None]]] = {}
        self.classes: Dict[str, List[ast.expr]] = {}
        self.order: List[str] = []
        self.star: List[str] = []
        self.imports_torch = False
        self._collect(tree.body)

    def _bind(self, name: str, value: Union[str, ast.expr, None]) -> None:
        self.bindings.setdefault(name, []).append(value)

    def _collect(self, body: List[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    top = alias.name.split(".")[0]
                    self._bind(alias.asname or top, alias.name if alias.asname else top)
                    self.imports_torch |= top in _TORCH_IMPORTS
            elif isinstance(node, ast.ImportFrom):
                self._import_from(node)
            elif isinstance(node, ast.ClassDef):
                if node.name not in self.classes:
                    self.order.append(node.name)
                self.classes.setdefault(node.name, []).extend(node.bases)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self._bind(target.id, node.value)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self._bind(node.target.id, node.value)
            else:  # module-level if/try/with blocks define module names too
                for block in ("body", "orelse", "finalbody"):
                    self._collect(getattr(node, block, None) or [])
                for handler in getattr(node, "handlers", None) or []:
                    self._collect(handler.body)

    def _import_from(self, node: ast.ImportFrom) -> None:
        base = _absolute(node.module, node.level, self.package)
        if base is not None:
            self.imports_torch |= base.split(".")[0] in _TORCH_IMPORTS
        for alias in node.names:
            if alias.name == "*":
                if base is not None:
                    self.star.append(base)
                continue
            self._bind(alias.asname or alias.name, f"{base}.{alias.name}" if base else None)


def _absolute(module: Optional[str], level: int, package: str) -> Optional[str]:
    """The absolute dotted name of ``from <level dots><module> import``; None when it leaves the package."""
    if level == 0:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts) or (not parts and level > 1):
        return None
    base = parts[:len(parts) - (level - 1)] + (module.split(".") if module else [])
    return ".".join(base) or None


def _package_of(path: str) -> str:
    """``pkg.sub`` for ``.../pkg/sub/file.py`` when both folders hold an ``__init__.py``."""
    parts: List[str] = []
    directory = os.path.dirname(os.path.abspath(path))
    while os.path.isfile(os.path.join(directory, "__init__.py")):
        parts.insert(0, os.path.basename(directory))
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return ".".join(parts)


_PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


def _roots(path: str) -> List[str]:
    """Folders an absolute import of the file's project is looked up in: the package root, the file's
    folder and its parents up to the project root (a folder with pyproject.toml, setup.py or .git), and its src/."""
    directory = os.path.dirname(os.path.abspath(path))
    package = _package_of(path)
    top = directory
    for _ in package.split(".") if package else ():
        top = os.path.dirname(top)
    roots = [top, directory]
    current = directory
    for _ in range(8):
        if current not in roots:
            roots.append(current)
        if any(os.path.exists(os.path.join(current, m)) for m in _PROJECT_MARKERS):
            roots.append(os.path.join(current, "src"))
            break
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return roots


# ----------------------------------------------------------------------------- the module skeleton
_STATEMENT = re.compile(  # anchored on "\n" rather than "^": a literal prefix the regex engine jumps between
    r"\n(?:(?P<cls>class[ \t]+\w+[ \t]*[(:])"
    r"|(?P<body>(?:async[ \t]+)?def\b|class\b|@)"
    r"|(?P<block>(?:if|elif|else|try|except|finally|with|for|while)\b)"
    r"|(?P<imp>[ \t]*(?:import[ \t]+[\w.]|from[ \t]+[\w.]+[ \t]+import\b))"
    r"|(?P<asg>[A-Za-z_]\w*[ \t]*(?::[^=\n]*)?=(?!=)[^\n]*))")
_OPEN, _CLOSE = "([{", ")]}"
_CLASS_NAME = re.compile(r"class[ \t]+\w+[ \t]*")


def _triple_quoted(text: str) -> List[Tuple[int, int]]:
    """Spans of triple-quoted strings (docstrings), pairing each opening quote with the next one like it."""
    spans: List[Tuple[int, int]] = []
    following = {q: text.find(q) for q in ('"""', "'''")}
    while True:
        live = [(i, q) for q, i in following.items() if i >= 0]
        if not live:
            return spans
        begin, quote = min(live)
        close = text.find(quote, begin + 3)
        end = len(text) if close < 0 else close + 3
        spans.append((begin, end))
        for q, i in following.items():
            if 0 <= i < end:
                following[q] = text.find(q, end)


def _statement(text: str, start: int, limit: int = 100) -> Tuple[str, bool]:
    """The logical line starting at ``start`` (continued while brackets are open or a line ends in a
    backslash), and whether it ended balanced within ``limit`` lines."""
    depth, pos, lines = 0, start, 0
    while pos < len(text) and lines < limit:
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        line = text[pos:end].split("#", 1)[0]
        depth += sum(line.count(c) for c in _OPEN) - sum(line.count(c) for c in _CLOSE)
        lines += 1
        if depth <= 0 and not line.rstrip().endswith("\\"):
            return text[start:end], depth == 0
        pos = end + 1
    return text[start:pos], False


def _class_header(text: str, start: int) -> Optional[str]:
    """``class Name(bases): pass`` for the class statement at ``start``, or None when its bases do not close."""
    name_end = _CLASS_NAME.match(text, start).end()  # type: ignore[union-attr]
    if text[name_end] == ":":
        return text[start:name_end] + ": pass"
    open_at = name_end
    depth = 0
    for pos in range(open_at, min(len(text), open_at + 4000)):
        char = text[pos]
        depth += (char in _OPEN) - (char in _CLOSE)
        if depth == 0:
            return text[start:pos + 1] + ": pass"
    return None


def _skeleton(text: str) -> str:
    """The statements that decide what a module-level class derives from: imports (module level, and in
    module-level if/try/with blocks), class headers and one-line assignments. Function and class bodies,
    and everything else, are left out: parsing this is much cheaper than parsing the file."""
    out: List[str] = []
    context = "module"
    text = "\n" + text  # every statement now starts after a "\n", the first one too
    strings = _triple_quoted(text)
    starts = [a for a, _ in strings]
    for match in _STATEMENT.finditer(text):
        begin, head = match.start() + 1, match.group(0)[1:]
        at = bisect.bisect_right(starts, begin) - 1
        if at >= 0 and begin < strings[at][1]:
            continue  # inside a docstring or other triple-quoted string
        kind = match.lastgroup
        if kind == "cls":
            context = "body"
            header = _class_header(text, begin)
            if header:
                out.append(header)
        elif kind in ("body", "block"):
            context = kind
        elif kind == "imp":
            indented = head[:1] in " \t"
            if indented and context == "body":
                continue  # an import inside a function or class is not a module name
            stmt, ok = _statement(text, begin + len(head) - len(head.lstrip()))
            if ok:
                out.append(stmt)
            context = context if indented else "module"
        else:
            stmt, ok = _statement(text, begin, limit=1)
            if ok:
                out.append(stmt)
            context = "module"
    return "\n".join(out)


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")  # the default source encoding (a BOM allowed): a coding cookie matters only when this fails
    except UnicodeDecodeError:
        pass
    import io
    import tokenize

    try:
        encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
    except SyntaxError:
        encoding = "utf-8"
    return data.decode(encoding, errors="replace")


def _parse_module(data: bytes) -> ast.Module:
    """The skeleton's tree; the whole file's when the skeleton does not parse. Raises what ``ast.parse`` raises."""
    try:
        return ast.parse(_skeleton(_decode(data)))
    except (SyntaxError, ValueError, LookupError):
        return ast.parse(data)


# ----------------------------------------------------------------------------- resolution
class _Resolver:
    """Judges base classes across the files of one run; parsed files are cached."""

    def __init__(self) -> None:
        self.modules: Dict[str, Optional[_Module]] = {}
        self.class_kinds: Dict[Tuple[_Module, str], int] = {}
        self.roots: Dict[str, List[str]] = {}

    def module(self, path: str) -> Optional[_Module]:
        path = os.path.abspath(path)
        if path not in self.modules:
            self.modules[path] = None  # a cycle of imports reads as unknown
            try:
                with open(path, "rb") as fh:
                    self.modules[path] = _Module(path, _parse_module(fh.read()))
            except (OSError, SyntaxError, ValueError, RecursionError):
                pass
        return self.modules[path]

    def refs(self, expr: ast.expr, mod: _Module, depth: int = 0) -> List[Ref]:
        """Everything ``expr`` may name, seen from ``mod``."""
        if depth > 30:
            return [None]
        if isinstance(expr, ast.Name):
            return self._name_refs(expr.id, mod, depth)
        if isinstance(expr, ast.Attribute):
            return [("q", f"{r[1]}.{expr.attr}", r[2]) if r and r[0] == "q" else None
                    for r in self.refs(expr.value, mod, depth + 1)]
        if isinstance(expr, ast.Subscript):  # Generic[T], Base[int]
            return self.refs(expr.value, mod, depth + 1)
        if isinstance(expr, ast.IfExp):
            return self.refs(expr.body, mod, depth + 1) + self.refs(expr.orelse, mod, depth + 1)
        return [None]

    def _name_refs(self, name: str, mod: _Module, depth: int) -> List[Ref]:
        out: List[Ref] = [("c", mod, name)] if name in mod.classes else []
        for value in mod.bindings.get(name, []):
            if value is None or isinstance(value, str):
                out.append(("q", value, mod) if value else None)
            elif not (isinstance(value, ast.Name) and value.id == name):
                out.extend(self.refs(value, mod, depth + 1))
        if not out:
            if mod.star:
                out = [("q", f"{star}.{name}", mod) for star in mod.star]
            else:
                out = [("q", f"builtins.{name}", mod) if name in _BUILTINS else None]
        return out

    def kind(self, ref: Ref, depth: int = 0) -> int:
        """TORCH, UNKNOWN or OTHER for one reference."""
        if ref is None or depth > 30:
            return UNKNOWN
        if ref[0] == "c":
            return self.class_kind(ref[1], ref[2], depth)
        return self.dotted_kind(ref[1], ref[2], depth)

    def class_kind(self, mod: _Module, name: str, depth: int = 0) -> int:
        key = (mod, name)
        if key not in self.class_kinds:
            self.class_kinds[key] = OTHER  # a class deriving from itself is not a module
            kinds = [self.kind(r, depth + 1) for base in mod.classes[name] for r in self.refs(base, mod)]
            self.class_kinds[key] = max(kinds, default=OTHER)
        return self.class_kinds[key]

    def dotted_kind(self, dotted: str, seen_from: _Module, depth: int) -> int:
        parts = dotted.split(".")
        top = parts[0]
        if top in _FRAMEWORKS:
            return _FRAMEWORKS[top](parts)
        if top in _NOT_TORCH or top in _STDLIB:
            return OTHER
        found = self._locate(parts, seen_from.path)
        if found is None:
            return UNKNOWN
        path, rest = found
        target = self.module(path)
        if target is None or not rest:
            return UNKNOWN
        expr: ast.expr = ast.Name(rest[0])
        for attr in rest[1:]:
            expr = ast.Attribute(expr, attr)
        return max((self.kind(r, depth + 1) for r in self.refs(expr, target)), default=UNKNOWN)

    def _locate(self, parts: List[str], from_path: str) -> Optional[Tuple[str, List[str]]]:
        """The project file defining the longest module prefix of ``parts``, and the names after it."""
        directory = os.path.dirname(os.path.abspath(from_path))
        if directory not in self.roots:
            self.roots[directory] = _roots(from_path)
        for cut in range(len(parts) - 1, 0, -1):
            for root in self.roots[directory]:
                base = os.path.join(root, *parts[:cut])
                for candidate in (base + ".py", os.path.join(base, "__init__.py")):
                    if os.path.isfile(candidate):
                        return candidate, parts[cut:]
        return None


_RESOLVER = _Resolver()


# ----------------------------------------------------------------------------- entry points
def scan_source(source: Union[bytes, str], path: str = "<source>") -> ScanResult:
    """Judge ``source`` (the text of the file at ``path``; ``path`` locates its sibling modules)."""
    data = source.encode("utf-8", "surrogateescape") if isinstance(source, str) else source
    if not _CLASS_WITH_BASES.search(data):  # no class with bases: nothing to parse
        return ScanResult(NONE)
    try:
        tree = _parse_module(data)
    except (SyntaxError, ValueError, RecursionError) as exc:
        return ScanResult(UNPARSABLE, reason=_parse_error(exc))
    mod = _Module(os.path.abspath(path), tree)
    _RESOLVER.modules[mod.path] = mod
    result = ScanResult(NONE)
    for name in mod.order:
        if name.startswith("_"):  # private helpers are not audited (initlint.inputs.load skips them too)
            continue
        kind = _RESOLVER.class_kind(mod, name)
        if kind == TORCH:
            result.models.append(name)
        elif kind == UNKNOWN:
            result.unresolved.append(f"{name} ({_describe_bases(mod, name)})")
    if result.models:
        result.verdict = MODEL
    elif result.unresolved and mod.imports_torch:
        result.verdict = MAYBE
    if result.verdict != NONE:
        try:  # it will be imported: the whole file must parse, not only its skeleton
            ast.parse(data)
        except (SyntaxError, ValueError, RecursionError) as exc:
            return ScanResult(UNPARSABLE, models=result.models, reason=_parse_error(exc))
    return result


def _describe_bases(mod: _Module, name: str) -> str:
    return "base " + ", ".join(ast.unparse(b) for b in mod.classes[name])


def _parse_error(exc: BaseException) -> str:
    version = f"Python {sys.version_info[0]}.{sys.version_info[1]}"
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f"{version} cannot parse it (line {exc.lineno}: {exc.msg})"
    message = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    return f"{version} cannot parse it ({message})"


def scan_file(path: str) -> ScanResult:
    """Judge the file at ``path`` without importing it (or torch); unreadable files are UNPARSABLE."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return ScanResult(UNPARSABLE, reason=f"cannot be read ({exc.strerror})")
    return scan_source(data, path)


def defines_module(source: str) -> Optional[bool]:
    """True if a class in ``source`` (may) derive from a torch ``nn.Module``; None when it does not parse."""
    verdict = scan_source(source).verdict
    return None if verdict == UNPARSABLE else verdict in (MODEL, MAYBE)


def file_defines_module(path: str) -> Optional[bool]:
    """:func:`defines_module` for a file; None when it cannot be read or parsed."""
    verdict = scan_file(path).verdict
    return None if verdict == UNPARSABLE else verdict in (MODEL, MAYBE)
