"""One test per example of every registered rule, plugins included: a rule's ``bad`` examples
must be flagged at exactly the modules they name, its ``good`` examples must pass, and a rule
with a repair must leave none of its findings on its bad examples after ``initlint.fix``."""
import pytest
import torch

import initlint
from initlint.rules import Rule, all_rules

EXAMPLES = [(code, kind, i, example) for code, rule in all_rules().items()
            for kind, examples in (("bad", rule.bad), ("good", rule.good)) for i, example in enumerate(examples)]


@pytest.mark.parametrize("code, kind, index, example", EXAMPLES,
                         ids=[f"{code}-{kind}{i}-{ex.build.__name__}" for code, kind, i, ex in EXAMPLES])
def test_example(code, kind, index, example):
    if "sweep" in all_rules()[code].needs:  # a rule judging a sweep: its example is a factory and the sweep's sizes
        report = initlint.sweep(example.build, **dict(example.options))
        assert {module for c, module in report.codes() if c == code} == set(example.expect)
        return
    model, inputs = example.model()
    report = initlint.audit(model, inputs, **dict(example.options))
    assert report.error is None
    found = {module for c, module in report.codes() if c == code}
    assert found == set(example.expect)


@pytest.mark.parametrize("code", list(all_rules()))
def test_every_rule_has_examples(code):
    rule = all_rules()[code]
    if rule.role == "meta" and code != "IL010":
        return  # IL000 reports crashes of other rules: no model triggers it on purpose
    assert rule.bad and all(ex.expect for ex in rule.bad), f"{code} needs a bad example naming where it reports"
    assert rule.good, f"{code} needs a good example"


REPAIRS = [(code, i, example) for code, rule in all_rules().items() if rule.repair is not Rule.repair
           for i, example in enumerate(rule.bad)]


@pytest.mark.parametrize("code, index, example", REPAIRS,
                         ids=[f"{code}-repair{i}-{ex.build.__name__}" for code, i, ex in REPAIRS])
def test_repair(code, index, example):
    """``initlint.fix`` on a bad example of a rule with a repair leaves no finding of the rule (but those
    the rule declares no init repairs), and its code reproduces the repaired weights on a fresh build."""
    rule = all_rules()[code]
    model, inputs = example.model()
    rep = initlint.fix(model, inputs, **dict(example.options))
    before = [f for f in rep.before.findings if f.code == code]
    after = [f for f in rep.after.findings if f.code == code]
    assert before and rep.after.error is None
    if any(rule.repairs(f) for f in before):
        assert after == [] and rep.changes
    else:
        assert [f.module for f in after] == [f.module for f in before] and not any(rule.repairs(f) for f in after)
    fresh, _ = example.model()
    namespace = {}
    exec(rep.code(), namespace)
    namespace["apply_initlint_fixes"](fresh)
    for name, param in model.state_dict().items():
        assert torch.equal(param, fresh.state_dict()[name]), name


@pytest.mark.parametrize("code", [c for c, r in all_rules().items() if r.repair is not Rule.repair])
def test_every_repair_is_shown_on_a_bad_example(code):
    rule = all_rules()[code]
    shown = False
    for example in rule.bad:
        model, inputs = example.model()
        report = initlint.audit(model, inputs, **dict(example.options))
        shown = shown or any(f.code == code and rule.repairs(f) for f in report.findings)
    assert shown, f"{code} has a repair but no bad example it can act on"
