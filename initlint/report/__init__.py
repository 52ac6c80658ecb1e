"""The report: findings, the report object and the ways it is drawn (table, plot, notebook)."""
from .findings import SEVERITIES, Finding, Report

__all__ = ['SEVERITIES', 'Finding', 'Report']
