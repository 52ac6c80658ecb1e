"""Stage 4, rules: one rule per module, discovered here; third-party rules come from the
``initlint.rules`` entry-point group (each entry point names a :class:`Rule` subclass)."""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Dict, Iterable, List, Optional, Tuple, Type

from ..errors import UnknownCode
from .base import ROLES, Audit, AuditContext, Example, Rule, order_by_uses

__all__ = ["Audit", "AuditContext", "Example", "Rule", "all_rules", "get_rule", "select_rules", "with_uses",
           "plugin_errors", "UnknownCode"]

ENTRY_POINT_GROUP = "initlint.rules"


def _discover() -> Dict[str, Type[Rule]]:
    found: Dict[str, Type[Rule]] = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("il"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Rule) and value is not Rule and value.code:
                found[value.code] = value
    _PLUGIN_ERRORS.clear()
    for name, cls in _plugins():
        problem = _plugin_problem(cls, found)
        if problem:
            _PLUGIN_ERRORS.append(f"rule plugin '{name}' {problem}")
        else:
            found[cls.code] = cls
    return dict(sorted(found.items()))


def _plugins() -> List[Tuple[str, Any]]:
    """``(entry point, loaded object or the exception loading it raised)`` for each plugin."""
    from importlib.metadata import entry_points

    out = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            out.append((f"{ep.name} = {ep.value}", ep.load()))
        except Exception as exc:  # reported as an IL000 finding, not swallowed
            out.append((f"{ep.name} = {ep.value}", exc))
    return out


def _plugin_problem(obj: Any, found: Dict[str, Type[Rule]]) -> Optional[str]:
    if isinstance(obj, BaseException):
        return f"could not be loaded: {type(obj).__name__}: {obj}"
    if not (isinstance(obj, type) and issubclass(obj, Rule) and obj.code and obj.name):
        return "does not name a Rule subclass with a code and a name"
    if obj.code in found:
        return f"uses the code {obj.code}, which {found[obj.code].name} already has"
    if obj.role not in ROLES:
        return f"has role '{obj.role}'; a rule's role is one of {', '.join(ROLES)}"
    return None


_RULES: Optional[Dict[str, Type[Rule]]] = None
_PLUGIN_ERRORS: List[str] = []


def all_rules() -> Dict[str, Type[Rule]]:
    """Code -> rule class, sorted by code."""
    global _RULES
    if _RULES is None:
        _RULES = _discover()
    return _RULES


def plugin_errors() -> List[str]:
    """One sentence per rule plugin that could not be registered (reported as IL000 findings)."""
    all_rules()
    return list(_PLUGIN_ERRORS)


def with_uses(codes: Iterable[str]) -> List[Type[Rule]]:
    """The rules ``codes`` name plus every rule they use, directly or not, in the order to run them."""
    registry = all_rules()
    wanted: Dict[str, Type[Rule]] = {}
    todo = [c for c in codes if c in registry]
    while todo:
        code = todo.pop()
        if code not in wanted:
            wanted[code] = registry[code]
            todo.extend(c for c in registry[code].uses if c in registry)
    return order_by_uses(wanted.values())


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
