"""Stage 4, rules: one rule per module, discovered here; third-party rules come from the
``initlint.rules`` entry-point group (each entry point names a :class:`Rule` subclass)."""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Type

from ..errors import UnknownCode
from .base import ROLES, Audit, AuditContext, Example, RepairPlan, Rule, order_by_uses

__all__ = ["Audit", "AuditContext", "Example", "RepairPlan", "Rule", "all_rules", "get_rule", "select_rules", "resolve_selection",
           "Selection", "with_uses", "plugin_errors", "UnknownCode"]

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


class NoRulesLeft(UnknownCode):
    """The layers of selection switch every rule off."""


@dataclass(frozen=True)
class Selection:
    """One layer of rule selection: the configuration file's, or the command line's.

    ``select`` (when given) replaces what earlier layers chose, ``extend_select`` adds to it and
    ``ignore`` removes from it; patterns are codes, code prefixes, rule names or ``ALL``.
    """

    select: Optional[Sequence[str]] = None
    ignore: Sequence[str] = ()
    extend_select: Sequence[str] = ()


def _specificity(pattern: str, code: str, name: str) -> Optional[int]:
    """How precisely ``pattern`` names the rule (None: not at all); ``ALL`` < prefixes by length < code or name."""
    key = pattern.strip()
    if key.upper() == "ALL":
        return 0
    if key.upper() == code or key.lower() == name:
        return 1000
    return len(key) if code.startswith(key.upper()) else None


def _check_patterns(patterns: Iterable[str]) -> None:
    for pattern in patterns:
        if pattern.strip().upper() != "ALL" and not any(_matches(c, r.name, [pattern.strip()])
                                                        for c, r in all_rules().items()):
            raise UnknownCode(f"unknown rule code '{pattern}' (known: {', '.join(all_rules())})")


def _layer_decisions(layer: Selection) -> Dict[str, bool]:
    """Code -> on/off for the rules this layer names: the most specific pattern wins, an ignore on a tie."""
    decisions: Dict[str, bool] = {}
    for code, rule in all_rules().items():
        best: Optional[Tuple[int, bool]] = None
        for patterns, on in ((list(layer.select or []) + list(layer.extend_select), True), (layer.ignore, False)):
            for pattern in patterns:
                spec = _specificity(pattern, code, rule.name)
                if spec is not None and (best is None or spec > best[0] or (spec == best[0] and not on)):
                    best = (spec, on)
        if best is not None:
            decisions[code] = best[1]
    return decisions


def resolve_selection(layers: Sequence[Selection]) -> Tuple[List[str], List[str]]:
    """Apply ``layers`` in order, as ruff does; return (enabled codes, codes last switched off by an ignore).

    Starting from every rule, a layer with ``select`` replaces the enabled set with what it
    selects; a layer without it adds its ``extend_select`` and removes its ``ignore``. Within a
    layer the more specific pattern wins (a code or name over a prefix, a longer prefix over a
    shorter one, any of them over ``ALL``), and an ignore wins a tie. So configuration
    ``ignore = ["IL002"]`` followed by ``--select IL002`` on the command line runs IL002.
    """
    enabled = set(all_rules())
    ignored: set = set()
    for layer in layers:
        _check_patterns([*(layer.select or []), *layer.ignore, *layer.extend_select])
        decisions = _layer_decisions(layer)
        if layer.select:
            enabled = set()
        for code, on in decisions.items():
            (enabled.add if on else enabled.discard)(code)
            (ignored.discard if on else ignored.add)(code)
    order = list(all_rules())
    return [c for c in order if c in enabled], [c for c in order if c in ignored]


def select_rules(select: Optional[Iterable[str]] = None, ignore: Optional[Iterable[str]] = None,
                 extend_select: Optional[Iterable[str]] = None) -> List[str]:
    """Codes enabled by one layer of ``select`` (prefixes or names; default all), ``extend_select`` and ``ignore``."""
    layer = Selection([s for s in (select or []) if s] or None, [s for s in (ignore or []) if s],
                      [s for s in (extend_select or []) if s])
    return resolve_selection([layer])[0]
