"""IL010 unused-suppression."""
from __future__ import annotations

from typing import Iterator

from ..report.findings import Finding
import torch.nn as nn

from .base import AuditContext, Example, Rule


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def suppression_that_silences_nothing():
    from initlint import ignore

    @ignore("IL001", reason="written for an init that was fixed since")
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            return self.fc(x)

    return Net()


def suppression_that_silences_a_finding():
    from initlint import ignore

    @ignore("IL008", reason="the constant weight is restored from a checkpoint")
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)
            nn.init.constant_(self.fc.weight, 0.5)

        def forward(self, x):
            return self.fc(x).relu()

    return Net()


class UnusedSuppression(Rule):
    """## What it does
    Reports a suppression that silenced nothing: a ``per-module-ignores`` entry of the
    configuration, or an ``@initlint.ignore(...)`` decorator (or a ``__initlint_ignore__``
    attribute) on a module class or on the model, whose codes matched no finding. The
    pipeline emits this finding itself, after the other rules ran and their findings were
    filtered (``initlint.rules.suppress``); this class only documents the code, and its own check
    finds nothing.

    A suppression is only judged when the rules it names ran: ignoring ``IL003`` while
    ``--select IL001`` is in force is not reported. The finding names the pattern or the
    class and the codes that went unused, and points at the class definition for in-code
    suppressions.

    ## Why is this bad?
    Suppressions outlive the problems they hid. Once the init is fixed, or the module is
    renamed so that the pattern no longer matches, the ignore does nothing except hide the
    *next* problem of that kind at that place, and a pattern with a typo never worked at
    all. Reporting unused suppressions keeps the list honest, as ruff's ``RUF100`` does
    for ``# noqa`` comments.

    ## Example
    ```toml
    [tool.initlint.per-module-ignores]
    "decoder.*" = ["IL004"]    # the model has no module called decoder
    ```
    ```python
    @initlint.ignore("IL001", reason="scaled later by the optimizer")
    class Block(nn.Module):     # ... whose layers are all initialised correctly
        ...
    ```

    ## Fix
    Delete the entry or the decorator (or drop the unused codes from it). If the pattern
    was meant to match, compare it with the module paths in the report: patterns are
    matched with ``fnmatch`` against the full dotted path of the module or any of its
    ancestors, so ``encoder.layers.*`` silences ``encoder.layers.3.attn.out_proj`` too.

    ## Options
    None. The finding is informational and does not fail ``initlint check`` at the default
    ``--fail-on warning``; ``--ignore IL010`` turns it off.
    """

    code = "IL010"
    name = "unused-suppression"
    severity = "info"
    needs = frozenset({"graph"})
    summary = "a suppression that silenced nothing"
    role = "meta"
    bad = (Example(suppression_that_silences_nothing, expect={""}),)
    good = (Example(suppression_that_silences_a_finding),)

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        return iter(())
