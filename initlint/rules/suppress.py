"""Suppressions: ``per-module-ignores`` from the configuration and ``initlint.ignore`` in code.

Both kinds are applied after the rules ran and before findings are grouped. A suppression
that silenced nothing is itself reported, as ``unused-suppression`` (the rule class in
``rules/il010_unused_suppression.py``), so stale ignores do not pile up.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..capture.locate import class_location
from ..errors import UsageError
from ..report.findings import Finding

ATTRIBUTE = "__initlint_ignore__"


def ignore(*codes: str, reason: str = "") -> Any:
    """Class decorator: silence ``codes`` for this module class and everything under it.

    ``@initlint.ignore("IL001", reason="zero-init output layer, on purpose")`` sets
    ``cls.__initlint_ignore__ = {"IL001": reason}``; writing that attribute by hand works too.
    """
    def decorate(cls: Any) -> Any:
        existing = dict(getattr(cls, ATTRIBUTE, {}) or {})
        for code in codes:
            existing[code] = reason
        setattr(cls, ATTRIBUTE, existing)
        return cls
    return decorate


@dataclass
class Suppression:
    """One source of silence: a configuration pattern or a class carrying ``__initlint_ignore__``."""

    origin: str
    """How the user wrote it: ``per-module-ignores 'encoder.*'`` or ``initlint.ignore on class Block``."""
    codes: List[str]
    """Code prefixes or rule names."""
    pattern: Optional[str] = None
    """fnmatch pattern on module paths (configuration)."""
    roots: List[str] = field(default_factory=list)
    """Module paths silenced with everything below them (in code)."""
    location: Optional[Tuple[str, int]] = None
    used: Dict[str, int] = field(default_factory=dict)
    """Code pattern -> number of findings it silenced."""

    def covers_module(self, module: str) -> bool:
        """Does this suppression apply at module path ``module``?"""
        if self.pattern is not None:
            return any(fnmatch.fnmatchcase(path, self.pattern) for path in _self_and_ancestors(module))
        return any(not root or module == root or module.startswith(root + ".") for root in self.roots)

    def code_pattern(self, finding: Finding) -> Optional[str]:
        """The first of :attr:`codes` that names ``finding``'s rule, if any."""
        return next((c for c in self.codes if code_matches(finding.code, finding.name, c)), None)


def code_matches(code: str, name: str, pattern: str) -> bool:
    """``pattern`` is ``ALL``, a prefix of ``code`` (``IL00``) or the rule's name (``dead-relu``)."""
    pattern = pattern.strip()
    return pattern.upper() == "ALL" or code.startswith(pattern.upper()) or name == pattern.lower()


def _self_and_ancestors(module: str) -> List[str]:
    parts = module.split(".") if module else []
    return [module] + [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def normalise_ignores(value: Any, where: str = "per_module_ignores") -> Dict[str, List[str]]:
    """Check the shape ``{pattern: [codes]}`` (a single code string is accepted); raise ``TypeError``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{where} must be a table of module patterns to lists of codes, not {type(value).__name__}")
    out: Dict[str, List[str]] = {}
    for pattern, codes in value.items():
        if isinstance(codes, str):
            codes = [codes]
        if not isinstance(pattern, str) or not isinstance(codes, (list, tuple)) or \
                not all(isinstance(c, str) and c.strip() for c in codes):
            raise TypeError(f"{where}: '{pattern}' must map to a list of rule codes such as [\"IL001\"]")
        out[pattern] = [c.strip() for c in codes]
    return out


def unknown_code(per_module_ignores: Mapping[str, Sequence[str]]) -> Optional[Tuple[str, str]]:
    """The first ``(code, pattern)`` whose code matches no registered rule, if any."""
    from . import rule_info

    registry = rule_info()
    for pattern, codes in per_module_ignores.items():
        for code in codes:
            if not any(code_matches(c, r.name, code) for c, r in registry.items()):
                return code, pattern
    return None


def config_suppressions(per_module_ignores: Mapping[str, Sequence[str]]) -> List[Suppression]:
    """One suppression per ``per-module-ignores`` entry."""
    return [Suppression(origin=f"per-module-ignores '{pattern}'", codes=list(codes), pattern=pattern)
            for pattern, codes in per_module_ignores.items()]


def code_suppressions(model: Any) -> List[Suppression]:
    """One suppression per class (or root instance) carrying ``__initlint_ignore__``, with every path it sits at."""
    found: Dict[Any, Suppression] = {}
    named = model.named_modules(remove_duplicate=False) if hasattr(model, "named_modules") else [("", model)]
    for path, module in named:
        codes = _declared_codes(getattr(module, ATTRIBUTE, None))
        if not codes:
            continue
        on_instance = ATTRIBUTE in vars(module)
        key: Any = ("instance", id(module)) if on_instance else type(module)
        if key not in found:
            cls = type(module)
            origin = (f"__initlint_ignore__ on {'the model' if not path else path}" if on_instance
                      else f"initlint.ignore on class {cls.__qualname__}")
            found[key] = Suppression(origin=origin, codes=codes, location=class_location(cls))
        found[key].roots.append(path)
    return list(found.values())


def _declared_codes(value: Any) -> List[str]:
    if not value:
        return []
    if isinstance(value, str):
        return [value]
    return [str(c) for c in value]  # a dict {code: reason} or any collection of codes


def apply_suppressions(findings: List[Finding], model: Any, per_module_ignores: Optional[Mapping[str, Sequence[str]]],
                       selected: Sequence[str]) -> List[Finding]:
    """Drop suppressed findings and append an unused-suppression finding for each suppression that silenced nothing.

    ``selected`` are the codes that ran: a suppression is only judged unused when it names
    one of them, and an unused suppression is only reported when its rule is selected itself.
    """
    try:
        ignores = normalise_ignores(per_module_ignores)
    except TypeError as exc:
        raise UsageError(str(exc)) from None
    unknown = unknown_code(ignores)
    if unknown:
        raise UsageError(f"per_module_ignores: '{unknown[0]}' (for '{unknown[1]}') is not a known rule code or name")
    suppressions = config_suppressions(ignores) + code_suppressions(model)
    kept = [f for f in findings if not _silence(f, suppressions)]
    from .il010_unused_suppression import UnusedSuppression

    if UnusedSuppression.code in selected:
        kept.extend(unused_findings(suppressions, selected))
    return kept


def _silence(finding: Finding, suppressions: Iterable[Suppression]) -> bool:
    silenced = False
    for s in suppressions:
        pattern = s.code_pattern(finding)
        if pattern is not None and any(s.covers_module(m) for m in finding.members or [finding.module]):
            s.used[pattern] = s.used.get(pattern, 0) + 1
            silenced = True  # keep going: every suppression that applies counts as used
    return silenced


def unused_findings(suppressions: Iterable[Suppression], selected: Sequence[str]) -> List[Finding]:
    """Unused-suppression findings for suppressions whose codes (among ``selected``) silenced nothing."""
    from . import all_rules
    from .il010_unused_suppression import UnusedSuppression

    registry = all_rules()
    out = []
    for s in suppressions:
        unused = [c for c in s.codes if not s.used.get(c) and
                  any(code_matches(code, registry[code].name, c) for code in selected if code in registry)]
        if not unused:
            continue
        where = s.roots[0] if s.roots else ""
        out.append(UnusedSuppression.make(
            where, f"{s.origin} silenced no finding of {', '.join(unused)} (0 findings; at least 1 expected)",
            f"remove {', '.join(unused)} from {s.origin}, or re-check whether the problem it hid is fixed",
            value=0.0, threshold=1.0, location=s.location))
    return out
