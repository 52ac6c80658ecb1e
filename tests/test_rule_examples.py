"""One test per example of every registered rule, plugins included: a rule's ``bad`` examples
must be flagged at exactly the modules they name, its ``good`` examples must pass."""
import pytest

import initlint
from initlint.rules import all_rules

EXAMPLES = [(code, kind, i, example) for code, rule in all_rules().items()
            for kind, examples in (("bad", rule.bad), ("good", rule.good)) for i, example in enumerate(examples)]


@pytest.mark.parametrize("code, kind, index, example", EXAMPLES,
                         ids=[f"{code}-{kind}{i}-{ex.build.__name__}" for code, kind, i, ex in EXAMPLES])
def test_example(code, kind, index, example):
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
