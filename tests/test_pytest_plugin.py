"""The pytest plugin, loaded through its pytest11 entry point, run on generated test files with pytester."""
from importlib.metadata import entry_points

import pytest
import torch.nn as nn

import initlint

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module", autouse=True)
def torch_loaded_once():
    """Inline pytester runs forget the modules they imported; torch cannot be imported twice in one
    process, so the whole pipeline is imported here, before the first inner run."""
    initlint.audit(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()))


def run(pytester, *args):
    """An inline pytest run; hypothesis' plugin is left out because it re-imports itself every run (1.5 s)."""
    return pytester.runpytest("-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args)

MODELS = '''
import pytest
import torch
import torch.nn as nn


def conv_bn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())


def clean_mlp():
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        linear = nn.Linear(32, 32)
        nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
        nn.init.zeros_(linear.bias)
        layers += [linear, nn.ReLU()]
    return nn.Sequential(*layers)
'''


def test_entry_point_is_declared():
    assert "initlint.integrations.pytest_plugin" in {ep.value for ep in entry_points(group="pytest11")}


def test_clean_model_passes_and_returns_the_report(pytester):
    pytester.makepyfile(MODELS + '''
def test_clean(initlint_audit):
    report = initlint_audit(clean_mlp(), torch.randn(16, 32))
    assert report.codes() == []
    assert report.clean
''')
    run(pytester).assert_outcomes(passed=1)


def test_findings_fail_the_test_with_the_table(pytester):
    pytester.makepyfile(MODELS + '''
def test_bias_before_norm(initlint_audit):
    initlint_audit(conv_bn(), select=["IL002"])
''')
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*initlint found 1 problem(s) in Sequential*",
                                 "*location*code*severity*module*message*",
                                 "*IL002*warning*0*bias 0.bias feeds nn.BatchNorm2d*",
                                 "*help: construct 0 with bias=False*"])
    assert "During handling" not in result.stdout.str()
    assert "pytest_plugin.py" not in result.stdout.str()  # no plugin internals in the failure


def test_marker_configures_the_fixture(pytester):
    pytester.makepyfile(MODELS + '''
@pytest.mark.initlint(select=["IL002", "IL003"], ignore=["IL002"])
def test_ignored(initlint_audit):
    assert initlint_audit(conv_bn()).codes() == []


@pytest.mark.initlint(select=["IL002"], fail_on="error")
def test_reported_but_not_failing(initlint_audit):
    assert initlint_audit(conv_bn()).codes() == [("IL002", "0")]


@pytest.mark.initlint(select=["IL003"])
def test_call_keywords_win(initlint_audit):
    initlint_audit(conv_bn(), select=["IL002"])
''')
    result = run(pytester, "--strict-markers")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_call_keywords_win*", "*IL002*"])


def test_module_level_marker_and_closest_wins(pytester):
    pytester.makepyfile(MODELS + '''
pytestmark = pytest.mark.initlint(select=["IL002"], fail_on="error")


@pytest.mark.initlint(fail_on="warning")
def test_fails(initlint_audit):
    initlint_audit(conv_bn())


def test_passes(initlint_audit):
    assert initlint_audit(conv_bn()).codes() == [("IL002", "0")]
''')
    run(pytester).assert_outcomes(passed=1, failed=1)


def test_marker_with_positional_arguments_is_a_usage_error(pytester):
    pytester.makepyfile(MODELS + '''
@pytest.mark.initlint("IL002")
def test_bad_marker(initlint_audit):
    initlint_audit(conv_bn())
''')
    result = run(pytester)
    result.stdout.fnmatch_lines(["*keyword arguments only*"])
    assert result.ret != 0
