"""Fuzzing the command line's numeric options and the configuration's values.

Whatever the value, ``initlint check`` ends with exit code 0, 1 or 2, never a traceback, and
an error is exactly one ``initlint: error:`` line on stderr; a run that succeeds prints a
parseable report. The CLI runs in this process (``CliRunner``) for speed; the subprocess
behaviour (exit codes, stdout separation) is tested in ``test_bad_inputs.py``.

Valid sizes are kept small, invalid ones far out of range: a valid batch of 2**28 would
allocate gigabytes, which tests nothing but the machine.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict

import pytest
from click.testing import CliRunner
pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from initlint.cli import main
from initlint.inputs.config import KEYS
from initlint.rules import all_rules

MODEL = """
import torch.nn as nn


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))
"""

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "model.py").write_text(MODEL)
    (root / "empty.toml").write_text("[tool.initlint]\n")
    return root


def check_outcome(result: Any) -> None:
    """The CLI's promise for any input."""
    text = result.stdout + result.stderr
    assert result.exit_code in (0, 1, 2), (result.exit_code, text, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in text and "bug in initlint" not in text, text
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if result.exit_code == 2:
        assert len(lines) == 1 and lines[0].startswith("initlint: error: "), result.stderr
    else:
        assert lines == [], result.stderr
        assert json.loads(result.stdout)["results"][0]["error"] is None


def invoke(project: Path, *args: str, config: str = "empty.toml") -> Any:
    return CliRunner().invoke(main, ["check", str(project / "model.py"), "--format", "json",
                                     "--config", str(project / config), *args])


# ------------------------------------------------------------------ command-line options
JUNK = st.one_of(st.sampled_from(["", " ", "abc", "1e3", "0x10", "-0", "+3", "1_000", "nan", "inf", "-inf", "١٢",
                                  "9" * 30, "-" + "9" * 30, "1.5", "--", "8,8"]),
                 st.text(max_size=6))
SEED = st.one_of(st.integers(-(2 ** 70), 2 ** 70).map(str), JUNK)
BATCH = st.one_of(st.integers(1, 32), st.integers(max_value=0), st.integers(min_value=2 ** 31)).map(str) | JUNK
TIMEOUT = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10 ** 7)).map(str) | JUNK
DIM = st.one_of(st.integers(1, 16), st.integers(max_value=0), st.integers(min_value=10 ** 13))
SHAPE = st.one_of(st.lists(DIM, min_size=1, max_size=4).map(lambda d: ",".join(map(str, d))),
                  st.lists(st.integers(1, 16), min_size=1, max_size=3).map(lambda d: "x".join(map(str, d))),
                  st.just("4,8"), JUNK)
FLAG = st.one_of(st.tuples(st.just("--seed"), SEED), st.tuples(st.just("--batch-size"), BATCH),
                 st.tuples(st.just("--import-timeout"), TIMEOUT), st.tuples(st.just("--input-shape"), SHAPE))


@FUZZ
@given(flags=st.lists(FLAG, min_size=1, max_size=3))
def test_numeric_options_never_crash(project, flags):
    # --seed=-5: a value starting with a dash must not be read as an option
    result = invoke(project, *[f"{flag}={value}" for flag, value in flags])
    check_outcome(result)
    event(f"exit {result.exit_code}")


# ------------------------------------------------------------------ configuration values
def toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml(v)}" for k, v in value.items()) + " }"
    return "[" + ", ".join(toml(v) for v in value) + "]"


NOT_INT = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=8),
                    st.sampled_from(["IL001", "dead-relu", "IL0", "cpu", "meta", "json", "warning", "4,8", "0,8"]))
SCALAR = st.one_of(st.integers(-(2 ** 70), 2 ** 70), st.sampled_from([0, 1, 2, -1, 0.5, 1.0, 1e4]), NOT_INT)
SMALL = st.one_of(st.integers(-3, 16), st.integers(min_value=2 ** 31), st.integers(max_value=-1))
VALUE = st.one_of(SCALAR, st.lists(SCALAR, max_size=3), st.dictionaries(st.sampled_from(["fc1", "*", "IL003"]),
                                                                           SCALAR, max_size=2))
PER_KEY = {"batch-size": st.one_of(SMALL, NOT_INT),
           "input-shape": st.one_of(st.lists(DIM, min_size=1, max_size=3), st.just("4,8"), NOT_INT,
                                    st.lists(st.lists(DIM, max_size=3), max_size=2))}
PLAUSIBLE = {"select": ["IL001", "IL0"], "ignore": ["IL010"], "fail-on": "error", "device": "cpu", "seed": 7,
             "batch-size": 4, "logits": True, "format": "concise", "input-shape": [4, 8], "import-timeout": 30,
             "per-module-ignores": {"fc1": ["IL001"]}, "extend-select": ["IL010"], "exclude": ["build"],
             "extend-exclude": ["*_legacy.py"], "optimizer": "SGD(lr=0.01)", "precision": "bf16", "grad-scaler": False,
             "clip-grad-norm": 1.0, "clip-grad-value": 0.5, "batches-per-step": 4}
"""A valid value of each key, drawn often so that many examples reach the audit."""
RULE_VALUE = st.one_of(SCALAR, st.floats(0, 2), st.integers(0, 20))
RULE_OPTIONS = [(rule.name if i % 2 else code, option) for i, (code, rule) in enumerate(all_rules().items())
                for option in rule.options]
TOP_KEYS = [k for k in KEYS if k != "rules"]


@st.composite
def config_body(draw) -> str:
    top: Dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(TOP_KEYS), max_size=4, unique=True)):
        top[key] = PLAUSIBLE[key] if draw(st.booleans()) else draw(PER_KEY.get(key, VALUE))
    rules: Dict[str, Dict[str, Any]] = {}
    for rule, option in draw(st.lists(st.sampled_from(RULE_OPTIONS), max_size=3, unique=True)):
        rules.setdefault(rule, {})[option] = draw(RULE_VALUE)
    lines = ["[tool.initlint]"] + [f"{k} = {toml(v)}" for k, v in top.items()]
    for rule, options in rules.items():
        lines += [f"[tool.initlint.rules.{rule}]"] + [f"{k} = {toml(v)}" for k, v in options.items()]
    return "\n".join(lines) + "\n"


@FUZZ
@given(body=config_body())
def test_config_values_never_crash(project, body):
    (project / "fuzz.toml").write_text(body)
    result = invoke(project, config="fuzz.toml")
    check_outcome(result)
    event(f"exit {result.exit_code}")
    if result.exit_code == 2 and "fuzz.toml" in result.stderr:
        assert "[tool.initlint]" in result.stderr or "is not valid TOML" in result.stderr  # names the key
