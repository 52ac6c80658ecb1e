"""IL000 rule-error: a rule that raises is reported, and the other rules still report."""
from __future__ import annotations

import torch
import torch.nn as nn
from click.testing import CliRunner

import initlint
import initlint.rules as rules_pkg
from initlint.cli import main
from initlint.output.docs import render
from initlint.rules import Rule, all_rules, get_rule


class BrokenRule(Rule):
    """## What it does
    Raises, to test the pipeline.
    """

    code = "IL990"
    name = "broken-rule"
    severity = "warning"
    needs = frozenset({"graph"})

    def check(self, audit):
        raise ValueError("synthetic failure")
        yield  # pragma: no cover - makes this a generator like real rules


def _with_broken_rule(monkeypatch) -> None:
    registry = dict(all_rules())
    registry[BrokenRule.code] = BrokenRule
    monkeypatch.setattr(rules_pkg, "_RULES", dict(sorted(registry.items())))


def _bias_before_norm_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())


def _codes(report) -> set:
    return {f.code for f in report.findings}


def test_broken_rule_becomes_info_finding_and_others_still_report(monkeypatch):
    _with_broken_rule(monkeypatch)
    report = initlint.audit(_bias_before_norm_model(), torch.randn(4, 3, 8, 8))
    errors = [f for f in report.findings if f.code == "IL000"]
    assert len(errors) == 1
    assert errors[0].severity == "info" and errors[0].name == "rule-error"
    assert "IL990" in errors[0].message and "broken-rule" in errors[0].message
    assert "ValueError: synthetic failure" in errors[0].message
    assert "IL002" in _codes(report)
    assert report.clean is False  # IL002 is a warning; the info finding alone would not fail


def test_rule_error_shows_when_only_the_broken_rule_is_selected(monkeypatch):
    _with_broken_rule(monkeypatch)
    report = initlint.audit(_bias_before_norm_model(), torch.randn(4, 3, 8, 8), select=["IL990"])
    assert _codes(report) == {"IL000"}


def test_ignoring_il000_hides_rule_errors_but_not_other_findings(monkeypatch):
    _with_broken_rule(monkeypatch)
    for ignore in (["IL000"], ["rule-error"]):
        report = initlint.audit(_bias_before_norm_model(), torch.randn(4, 3, 8, 8), ignore=ignore)
        assert "IL000" not in _codes(report)
        assert "IL002" in _codes(report)


def test_selecting_only_il000_runs_no_checks(monkeypatch):
    _with_broken_rule(monkeypatch)
    report = initlint.audit(_bias_before_norm_model(), torch.randn(4, 3, 8, 8), select=["IL000"])
    assert report.findings == []


def test_rule_error_is_info_so_the_cli_exits_clean(monkeypatch, tmp_path):
    _with_broken_rule(monkeypatch)
    target = tmp_path / "model.py"
    target.write_text("import torch.nn as nn\n\n"
                      "class M(nn.Module):\n"
                      "    def __init__(self):\n"
                      "        super().__init__()\n"
                      "        self.fc = nn.Linear(8, 8)\n\n"
                      "    def forward(self, x):\n"
                      "        return self.fc(x)\n")
    monkeypatch.setenv("INITLINT_NO_PROGRESS", "1")
    result = CliRunner().invoke(main, ["check", str(target), "--select", "IL990", "--format", "concise"])
    assert result.exit_code == 0, result.output
    assert "IL000" in result.output and "IL990 (broken-rule) could not run" in result.output


def test_il000_is_documented_like_every_rule():
    cls = get_rule("IL000")
    assert (cls.code, cls.name, cls.severity) == ("IL000", "rule-error", "info")
    assert get_rule("rule-error") is cls
    page = render(cls)
    for heading in ("## What it does", "## Why is this bad?", "## Example", "## Fix", "## Options"):
        assert heading in page
    assert list(cls().check(None)) == []


class _TruncatedNormalInit(nn.Module):
    """A declared init whose replay takes IL014's tiled path (``trunc_normal_``'s in-place ops on a large
    weight); ``catch``: the init swallows any error itself."""

    def __init__(self, catch: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(1024, 512)
        self.catch = catch
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            try:
                nn.init.trunc_normal_(module.weight, std=0.02)
            except Exception:
                if not self.catch:
                    raise

    def forward(self, x):
        return self.fc(x)


def _tag_missing(op):
    raise AttributeError("type object 'torch._C.Tag' has no attribute 'inplace'")


def test_an_attribute_error_inside_a_rule_gives_il000_not_a_clean_result(monkeypatch):
    import initlint.probe.declared as declared

    torch.manual_seed(0)
    model = _TruncatedNormalInit()
    clean = initlint.audit(model, torch.randn(4, 1024), select=["IL014"])
    assert _codes(clean) == set()
    monkeypatch.setattr(declared, "is_inplace", _tag_missing)  # as torch.Tag.inplace is missing before torch 2.13
    for catch in (False, True):  # also when the model's own init catches the error
        model.catch = catch
        report = initlint.audit(model, torch.randn(4, 1024), select=["IL014"])
        errors = [f for f in report.findings if f.code == "IL000"]
        assert len(errors) == 1, report.findings
        assert "IL014" in errors[0].message and "AttributeError" in errors[0].message


class _InitThatFailsLater(nn.Module):
    """A declared init that runs when the model is built and raises when called again."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.built = False
        self.apply(self._init_weights)
        self.built = True

    def _init_weights(self, module: nn.Module) -> None:
        if self.built:
            raise RuntimeError("called twice")
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.weight)

    def forward(self, x):
        return self.fc(x)


def test_a_declared_init_that_raises_on_the_copy_declares_nothing_and_is_no_rule_error():
    report = initlint.audit(_InitThatFailsLater(), torch.randn(4, 64), select=["IL014"])
    assert _codes(report) == set()
