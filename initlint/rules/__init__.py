"""Stage 4, rules: one rule per module, discovered here; third-party rules come from the
``initlint.rules`` entry-point group (each entry point names a :class:`Rule` subclass)."""
from __future__ import annotations

import importlib
import pkgutil
from typing import Dict, Iterable, List, Optional, Type

from ..errors import UnknownCode
from .base import Audit, Rule

__all__ = ["Audit", "Rule", "all_rules", "get_rule", "select_rules", "UnknownCode"]


def _discover() -> Dict[str, Type[Rule]]:
    found: Dict[str, Type[Rule]] = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("il"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Rule) and value is not Rule and value.code:
                found[value.code] = value
    try:
        from importlib.metadata import entry_points

        for ep in entry_points(group="initlint.rules"):
            cls = ep.load()
            if isinstance(cls, type) and issubclass(cls, Rule) and cls.code:
                found.setdefault(cls.code, cls)
    except Exception:  # a broken plugin must not break the linter
        pass
    return dict(sorted(found.items()))


_RULES: Optional[Dict[str, Type[Rule]]] = None


def all_rules() -> Dict[str, Type[Rule]]:
    """Code -> rule class, sorted by code."""
    global _RULES
    if _RULES is None:
        _RULES = _discover()
    return _RULES


def get_rule(code_or_name: str) -> Type[Rule]:
    """Look a rule up by code (``IL003``) or name (``dead-relu``)."""
    key = code_or_name.strip()
    for code, cls in all_rules().items():
        if key.upper() == code or key.lower() == cls.name:
            return cls
    raise UnknownCode(f"unknown rule '{code_or_name}' (known: {', '.join(all_rules())})")


def _matches(code: str, name: str, patterns: Iterable[str]) -> bool:
    return any(code.startswith(p.upper()) or name == p.lower() for p in patterns)


def select_rules(select: Optional[Iterable[str]] = None, ignore: Optional[Iterable[str]] = None) -> List[str]:
    """Codes enabled by ``select`` (prefixes or names; default all) minus ``ignore``."""
    select = [s for s in (select or []) if s]
    ignore = [s for s in (ignore or []) if s]
    for pattern in select + ignore:
        if pattern.upper() != "ALL" and not any(_matches(c, r.name, [pattern]) for c, r in all_rules().items()):
            raise UnknownCode(f"unknown rule code '{pattern}' (known: {', '.join(all_rules())})")
    chosen = [c for c, r in all_rules().items()
              if not select or "ALL" in (s.upper() for s in select) or _matches(c, r.name, select)]
    return [c for c in chosen if not _matches(c, all_rules()[c].name, ignore)]
