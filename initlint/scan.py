"""Torch-free pre-scan: does a Python file define an ``nn.Module`` subclass?

Used by ``initlint check`` (and so by the pre-commit hook) to skip ordinary Python
files without importing torch or the file itself.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional

_MODULE_BASES = ("Module", "PreTrainedModel", "LightningModule")


def _base_name(node: ast.expr) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _base_name(node.value)
    return None


def defines_module(source: str) -> Optional[bool]:
    """True if a class in ``source`` derives (within the file) from a ``*Module`` base.

    Returns None when the source does not parse (the caller then imports it to report the error).
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    bases: Dict[str, List[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases[node.name] = [b for b in (_base_name(x) for x in node.bases) if b]

    def base_is_module(name: str, depth: int) -> bool:
        if name in bases:  # defined in this file: a module if one of its own bases is
            return depth < 20 and any(base_is_module(b, depth + 1) for b in bases[name])
        if name.endswith("DataModule"):  # Lightning's data modules hold no network
            return False
        return name.endswith(_MODULE_BASES) or name in ("Sequential", "ModuleList", "ModuleDict")

    return any(base_is_module(b, 0) for own in bases.values() for b in own)


def file_defines_module(path: str) -> Optional[bool]:
    """:func:`defines_module` for a file; None when it cannot be read or parsed."""
    try:
        with open(path, "rb") as fh:
            return defines_module(fh.read().decode("utf-8", errors="replace"))
    except OSError:
        return None
