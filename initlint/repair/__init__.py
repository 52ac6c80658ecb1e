"""``initlint fix``: the planner that applies the rules' repairs and proves them by re-auditing."""
from .planner import fix, FixReport

__all__ = ['fix', 'FixReport']
