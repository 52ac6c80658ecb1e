"""Suppressions: per-module-ignores patterns, initlint.ignore in code, and IL010 unused-suppression."""
import os

import pytest
import torch.nn as nn

import initlint
from initlint.api import UsageError
from initlint.report.findings import Finding
from initlint.rules import get_rule, select_rules
from initlint.rules.suppress import apply_suppressions


def conv_bn():
    """IL002 at its conv: the conv's bias is cancelled by the BatchNorm."""
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([conv_bn(), conv_bn()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x) if layer[0].in_channels == x.shape[1] else x
        return x


class Net(nn.Module):
    """IL002 at stem.0 and encoder.layers.0.0 (encoder.layers.1 never runs: 8 != 3 channels)."""

    def __init__(self):
        super().__init__()
        self.stem = conv_bn()
        self.encoder = Encoder()

    def forward(self, x):
        return self.encoder(x) + self.stem(x)


def il002(report):
    return sorted(m for code, m in report.codes() if code == "IL002")


def il010(report):
    return [f for f in report.findings if f.code == "IL010"]


def test_unsuppressed_baseline():
    report = initlint.audit(Net(), select=["IL002", "IL010"])
    assert il002(report) == ["encoder.layers.0.0", "stem.0"]
    assert il010(report) == []


def test_exact_path_pattern():
    report = initlint.audit(conv_bn(), select=["IL002", "IL010"], per_module_ignores={"0": ["IL002"]})
    assert report.codes() == []


def test_glob_matches_the_path_or_an_ancestor():
    for pattern in ("encoder.*", "encoder", "encoder.layers.?", "*.layers.*"):
        report = initlint.audit(Net(), select=["IL002", "IL010"], per_module_ignores={pattern: ["IL002"]})
        assert report.codes() == [("IL002", "stem.0")], pattern


def test_code_prefix_and_rule_name():
    for codes in (["IL00"], ["IL0"], ["bias-before-norm"], ["ALL"]):
        report = initlint.audit(conv_bn(), select=["IL002", "IL010"], per_module_ignores={"*": codes})
        assert report.codes() == [], codes


def test_other_codes_are_not_silenced():
    report = initlint.audit(conv_bn(), select=["IL002", "IL003", "IL010"], per_module_ignores={"0": ["IL003"]})
    assert ("IL002", "0") in report.codes()


def test_unused_pattern_is_reported_as_il010():
    report = initlint.audit(Net(), select=["IL002", "IL010"], per_module_ignores={"decoder.*": ["IL002"]})
    assert il002(report) == ["encoder.layers.0.0", "stem.0"]
    (unused,) = il010(report)
    assert (unused.code, unused.name, unused.severity, unused.module) == ("IL010", "unused-suppression", "info", "")
    assert "'decoder.*'" in unused.message and "IL002" in unused.message
    assert (unused.value, unused.threshold) == (0.0, 1.0)
    assert report.clean is False  # the IL002 findings, not the informational IL010


def test_unused_only_judged_for_selected_rules():
    # IL003 did not run, so an IL003 ignore cannot be judged unused
    report = initlint.audit(conv_bn(), select=["IL002", "IL010"], per_module_ignores={"*": ["IL003"]})
    assert report.codes() == [("IL002", "0")]
    # and IL010 itself can be switched off
    report = initlint.audit(conv_bn(), ignore=["IL010"], per_module_ignores={"decoder": ["IL002"]})
    assert "IL010" not in {code for code, _ in report.codes()}


def test_partly_used_suppression_reports_only_the_unused_code():
    report = initlint.audit(conv_bn(), select=["IL002", "IL003", "IL010"],
                            per_module_ignores={"0": ["IL002", "IL003"]})
    (unused,) = il010(report)
    assert "IL003" in unused.message and "IL002" not in unused.message.split("silenced")[1]


@initlint.ignore("IL002", reason="the bias is re-used by an export path")
class QuietBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = conv_bn()

    def forward(self, x):
        return self.body(x)


class QuietByAttribute(QuietBlock):
    __initlint_ignore__ = {"IL002": "written by hand"}


class TwoBlocks(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.quiet = block()
        self.loud = conv_bn()

    def forward(self, x):
        return self.quiet(x) + self.loud(x)


@pytest.mark.parametrize("block", [QuietBlock, QuietByAttribute])
def test_in_code_suppression_covers_the_class_and_everything_under_it(block):
    report = initlint.audit(TwoBlocks(block), select=["IL002", "IL010"])
    assert report.codes() == [("IL002", "loud.0")]


def test_in_code_suppression_on_the_root_model():
    model = QuietBlock()
    assert initlint.audit(model, select=["IL002", "IL010"]).codes() == []
    plain = conv_bn()
    plain.__initlint_ignore__ = {"IL002": "instance attribute"}
    assert initlint.audit(plain, select=["IL002", "IL010"]).codes() == []


@initlint.ignore("IL002")
class NeedlesslyQuiet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, bias=False)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x))


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = NeedlesslyQuiet()
        self.second = NeedlesslyQuiet()

    def forward(self, x):
        return self.second(self.first(x)[:, :3])


def test_unused_in_code_suppression_points_at_the_class():
    report = initlint.audit(Holder(), select=["IL002", "IL010"])
    assert report.codes() == [("IL010", "first")]  # one finding per class, at its first instance
    (unused,) = il010(report)
    assert "NeedlesslyQuiet" in unused.message
    path, line = unused.location
    assert os.path.samefile(path, __file__)
    with open(__file__) as fh:
        assert fh.read().splitlines()[line - 1].startswith("@initlint.ignore(\"IL002\")")


def test_grouped_finding_is_silenced_through_its_members():
    grouped = Finding(code="IL001", name="init-scale", severity="warning", module="layers.{0..3}", message="m",
                      fix="f", members=["layers.0", "layers.1", "layers.2", "layers.3"])
    kept = apply_suppressions([grouped], nn.Module(), {"layers.2": ["IL001"]}, ["IL001", "IL010"])
    assert kept == []


def test_malformed_per_module_ignores_is_a_usage_error():
    with pytest.raises(UsageError, match="list of rule codes"):
        initlint.audit(conv_bn(), per_module_ignores={"0": [1]})
    with pytest.raises(UsageError, match="table of module patterns"):
        initlint.audit(conv_bn(), per_module_ignores=["0"])
    with pytest.raises(UsageError, match="'IL999' .* not a known rule"):
        initlint.audit(conv_bn(), per_module_ignores={"0": ["IL999"]})


def test_il010_is_a_documented_rule():
    rule = get_rule("unused-suppression")
    assert (rule.code, rule.severity, rule.needs) == ("IL010", "info", frozenset({"graph"}))
    for heading in ("## What it does", "## Why is this bad?", "## Example", "## Fix", "## Options"):
        assert heading in rule.doc()
    assert list(rule().check(None)) == []
    assert select_rules(["IL010"]) == ["IL010"]
    assert "IL010" not in select_rules(None, ["IL010"])
