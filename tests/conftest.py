"""Suite-wide settings: the slow tier and a hard time limit on every test.

- ``@pytest.mark.slow`` marks real-size and training tests, and those that start several processes
  (the sharded audit, an installed plugin, command-line runs in turn). They are deselected unless
  ``--runslow`` is given (``python -m pytest -q --runslow -m slow`` runs that tier alone).
- Every test runs under a hard limit (``faulthandler.dump_traceback_later`` with ``exit=True``):
  a test that loops forever prints every thread's traceback and ends the run with an error
  instead of hanging it. The limit is a watchdog thread, so it works whatever the signal
  dispositions are (SIGINT is ignored in processes a script starts in the background) and
  does not touch SIGALRM, which initlint's own time limits use. ``@pytest.mark.hard_limit(s)``
  sets another limit for one test.
"""
from __future__ import annotations

import faulthandler
import os
import sys

import pytest

FAST_LIMIT = 300.0  # seconds; the slowest fast test takes about 8 s on an idle 2-core machine
SLOW_LIMIT = 1800.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run the tests marked slow (real-size models, training runs, multi-process tests)")


_REAL_STDERR: dict = {}


def pytest_configure(config: pytest.Config) -> None:
    # pytest's capture is suspended while plugins configure, so fd 2 is the real stderr here;
    # while a test runs it is a capture file, which a process ended by the limit never shows.
    _REAL_STDERR["stream"] = os.fdopen(os.dup(2), "w")
    config.addinivalue_line("markers", "slow: a real-size, training or multi-process test; runs with --runslow")
    config.addinivalue_line("markers", "hard_limit(seconds): this test's hard time limit")


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    if config.getoption("--runslow"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: object):
    """Set-up (shared fixtures included), call and teardown all run under the limit."""
    marker = item.get_closest_marker("hard_limit")
    if marker is not None:
        limit = float(marker.args[0])
    else:
        limit = SLOW_LIMIT if item.get_closest_marker("slow") else FAST_LIMIT
    faulthandler.dump_traceback_later(limit, exit=True, file=_REAL_STDERR.get("stream") or sys.__stderr__)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
