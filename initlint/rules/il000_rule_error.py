"""IL000 rule-error."""
from __future__ import annotations

from typing import Iterator

from ..report.findings import Finding
from .base import AuditContext, Rule


class RuleError(Rule):
    """## What it does
    Reports that another rule raised an exception while it checked the model. The audit
    pipeline emits this finding itself (``initlint.api``): the rule that failed is named in
    the message with the exception type and text, and every other rule still reports. This
    class only documents the code; its own check finds nothing.

    ## Why is this bad?
    A rule that crashed has not looked at the model, so the absence of its findings says
    nothing about the model. Hiding the crash would make a broken check look like a clean
    result; stopping the whole audit would throw away what the other rules found. The
    finding is informational: it does not fail ``initlint check`` at the default
    ``--fail-on warning``.

    ## Example
    ```text
    <model>  IL000  info  IL003 (dead-relu) could not run: KeyError: 'units'
    help: please report this with the model that triggers it
    ```

    ## Fix
    Report it, with the model (or a small one that triggers the same error). Until then,
    skip the failing rule with ``--ignore IL003`` (or whichever code is named); the
    IL000 finding goes away with it.

    ## Options
    None. It is reported whenever a rule that ran fails, also when ``--select`` does not
    name IL000 (a failure of a selected rule must stay visible); ``--ignore IL000`` hides it.
    """

    code = "IL000"
    name = "rule-error"
    severity = "info"
    needs = frozenset({"graph"})
    summary = "a rule crashed on this model, or a rule plugin could not be loaded; the others still ran"
    role = "meta"

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        return iter(())
