"""Stage 4, rules: one rule per module, discovered here; third-party rules come from the
``initlint.rules`` entry-point group (each entry point names a :class:`Rule` subclass).

Importing this package does not import torch: :func:`rule_info`, :func:`find_rule` and rule
selection read the generated :mod:`initlint.rules.catalog` (the built-in rules' metadata and
pages, written by ``python -m initlint.output.docs`` from the rule classes) until the rule classes
are needed, torch is imported or a rule plugin is installed. ``Rule``, ``Audit`` and the other names of
:mod:`initlint.rules.base` are loaded on first use.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Type

from ..errors import UnknownCode

if TYPE_CHECKING:
    from .base import Audit, AuditContext, Example, RepairPlan, Rule

__all__ = ["Audit", "AuditContext", "Example", "RepairPlan", "Rule", "all_rules", "get_rule", "select_rules",
           "resolve_selection", "Selection", "with_uses", "plugin_errors", "UnknownCode", "RuleInfo", "rule_info",
           "find_rule", "check_patterns"]

ENTRY_POINT_GROUP = "initlint.rules"
_FROM_BASE = ("Audit", "AuditContext", "Example", "RepairPlan", "Rule", "order_by_uses", "ROLES")


def __getattr__(name: str) -> Any:
    """The names of :mod:`initlint.rules.base` (which imports torch), loaded when first asked for."""
    if name in _FROM_BASE:
        from . import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _discover_builtin() -> Dict[str, Type[Rule]]:
    """The rule classes of this package's ``ilNNN_*.py`` modules, sorted by code."""
    from .base import Rule

    found: Dict[str, Type[Rule]] = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("il"):  # base, catalog
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Rule) and value is not Rule and value.code:
                found[value.code] = value
    return dict(sorted(found.items()))


def _discover() -> Dict[str, Type[Rule]]:
    found = _discover_builtin()
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
    from .base import ROLES, Rule

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
    from .base import order_by_uses

    return order_by_uses(wanted.values())


def get_rule(code_or_name: str) -> Type[Rule]:
    """Look a rule class up by code (``IL003``) or name (``dead-relu``); imports the rules (and torch)."""
    found = _lookup(all_rules(), code_or_name)
    if found is None:
        raise _unknown_rule(code_or_name)
    return found


@dataclass(frozen=True)
class RuleInfo:
    """What is known of a rule without importing it: what ``initlint rules`` lists, ``initlint explain``
    prints and the checks of ``--select`` and ``[tool.initlint.rules]`` read."""

    code: str
    name: str
    severity: str
    role: str
    summary: str
    options: Mapping[str, Any] = field(default_factory=dict)
    option_ranges: Mapping[str, Tuple[Optional[float], Optional[float]]] = field(default_factory=dict)
    needs: Tuple[str, ...] = ()
    uses: Tuple[str, ...] = ()
    page: str = ""
    """The rule's Markdown documentation, as ``initlint explain`` prints it."""



_CATALOG: Optional[Dict[str, RuleInfo]] = None
_HAS_PLUGINS: Optional[bool] = None


def _catalog() -> Dict[str, RuleInfo]:
    """The built-in rules from the generated catalog: no rule module (and no torch) is imported."""
    global _CATALOG
    if _CATALOG is None:
        from .catalog import RULES

        _CATALOG = {code: RuleInfo(**fields) for code, fields in RULES.items()}
    return _CATALOG


def _plugins_installed() -> bool:
    global _HAS_PLUGINS
    if _HAS_PLUGINS is None:
        from importlib.metadata import entry_points

        _HAS_PLUGINS = bool(list(entry_points(group=ENTRY_POINT_GROUP)))
    return _HAS_PLUGINS


def rule_info() -> Mapping[str, Any]:
    """Code -> each rule's code, name, severity, role, summary, options and option ranges, sorted by code.

    These are the rule classes once they are loaded, or when a rule plugin is installed (its
    metadata lives in its class) or torch is imported already (the classes then cost little to load,
    and a rule added since the catalog was generated still counts); before that, the built-in
    catalog, so that listing rules and checking a selection or a rule option never import torch."""
    if _RULES is None and "torch" not in sys.modules and not _plugins_installed():
        return _catalog()
    return all_rules()


def find_rule(code_or_name: str) -> Any:
    """Look a rule up by code or name, as :func:`get_rule` does, without importing torch for a built-in rule:
    its :class:`RuleInfo`, or its class once the rules are loaded. Rule plugins are loaded only for a
    code or name the catalog does not know."""
    found = _lookup(_RULES if _RULES is not None else _catalog(), code_or_name)
    if found is None and _RULES is None and ("torch" in sys.modules or _plugins_installed()):
        found = _lookup(all_rules(), code_or_name)
    if found is None:
        raise _unknown_rule(code_or_name)
    return found


def _lookup(registry: Mapping[str, Any], code_or_name: str) -> Any:
    key = code_or_name.strip()
    for code, rule in registry.items():
        if key.upper() == code or key.lower() == rule.name:
            return rule
    return None


def _unknown_rule(code_or_name: str) -> UnknownCode:
    return UnknownCode(f"unknown rule '{code_or_name}' (known: {', '.join(rule_info())})")


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


def check_patterns(patterns: Iterable[str]) -> None:
    """Raise :class:`UnknownCode` for a code, prefix or name that matches no rule; the rule plugins (and
    torch) are loaded only for one that no built-in rule matches."""
    def known(pattern: str, rules: Mapping[str, Any]) -> bool:
        return pattern.upper() == "ALL" or any(_matches(c, r.name, [pattern]) for c, r in rules.items())

    for pattern in patterns:
        if not known(pattern.strip(), _RULES if _RULES is not None else _catalog()) and \
                not known(pattern.strip(), rule_info()):
            raise UnknownCode(f"unknown rule code '{pattern}' (known: {', '.join(rule_info())})")


def _layer_decisions(layer: Selection) -> Dict[str, bool]:
    """Code -> on/off for the rules this layer names: the most specific pattern wins, an ignore on a tie."""
    decisions: Dict[str, bool] = {}
    for code, rule in rule_info().items():
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
    enabled = set(rule_info())
    ignored: set = set()
    for layer in layers:
        check_patterns([*(layer.select or []), *layer.ignore, *layer.extend_select])
        decisions = _layer_decisions(layer)
        if layer.select:
            enabled = set()
        for code, on in decisions.items():
            (enabled.add if on else enabled.discard)(code)
            (ignored.discard if on else ignored.add)(code)
    order = list(rule_info())
    return [c for c in order if c in enabled], [c for c in order if c in ignored]


def select_rules(select: Optional[Iterable[str]] = None, ignore: Optional[Iterable[str]] = None,
                 extend_select: Optional[Iterable[str]] = None) -> List[str]:
    """Codes enabled by one layer of ``select`` (prefixes or names; default all), ``extend_select`` and ``ignore``."""
    layer = Selection([s for s in (select or []) if s] or None, [s for s in (ignore or []) if s],
                      [s for s in (extend_select or []) if s])
    return resolve_selection([layer])[0]
