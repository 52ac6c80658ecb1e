"""pytest plugin (entry point ``pytest11``): the ``initlint_audit`` fixture and the ``initlint`` marker.

::

    @pytest.mark.initlint(select=["IL0"], ignore=["IL004"], logits=True)
    def test_model_init(initlint_audit):
        report = initlint_audit(MyModel(), torch.randn(8, 3, 32, 32))

The fixture audits the model and fails the test with the table of findings when any of
them is a warning or an error (``fail_on`` moves that line). torch and initlint's
pipeline are imported only when the fixture is used, so the plugin costs nothing in
test sessions that do not audit models.
"""
from __future__ import annotations

from typing import Any, Callable, Dict

import pytest

MARKER = "initlint"


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker so ``--strict-markers`` accepts it."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(**settings): settings for the initlint_audit fixture: select, ignore, logits, fail_on, and any "
        "other initlint.audit keyword (seed, batch_size, rule_options, per_module_ignores, device, ...)")


def marker_settings(node: Any) -> Dict[str, Any]:
    """Keyword settings of every ``initlint`` marker on ``node``; the closest marker wins."""
    settings: Dict[str, Any] = {}
    for mark in reversed(list(node.iter_markers(MARKER))):  # farthest (module) first, the test's own last
        if mark.args:
            raise pytest.UsageError(f"@pytest.mark.{MARKER} takes keyword arguments only, such as "
                                    f"@pytest.mark.{MARKER}(select=['IL001'])")
        settings.update(mark.kwargs)
    return settings


@pytest.fixture
def initlint_audit(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``initlint_audit(model, inputs=None, **settings)``: audit ``model`` and return the report.

    Fails the test, with the findings table, when a finding at or above ``fail_on``
    (default ``"warning"``) is present or the model cannot be audited. Settings come from
    ``@pytest.mark.initlint(...)`` and are overridden by keywords given to the call.
    """
    defaults = marker_settings(request.node)

    def run(model: Any, inputs: Any = None, **settings: Any) -> Any:
        from initlint import audit

        options = {**defaults, **settings}
        fail_on = options.pop("fail_on", "warning")
        report = audit(model, inputs, **options)
        try:
            report.assert_clean(fail_on=fail_on)
            problem = None
        except AssertionError as exc:
            problem = str(exc)
        if problem is not None:  # outside the except block: no "during handling" chain in the output
            pytest.fail(problem, pytrace=False)
        return report

    return run
