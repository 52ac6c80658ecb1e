"""[tool.initlint] in pyproject.toml: discovery, every key, CLI precedence, warnings and errors."""
import json
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from initlint.cli import main
from initlint.inputs.config import KEYS, ConfigError, load_config

NET = '''
import torch.nn as nn


class Net(nn.Module):
    """IL002 at conv and IL001 at mlp.0 .. mlp.14 with the default thresholds."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3)
        self.bn = nn.BatchNorm2d(32)
        self.mlp = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(32, 32), nn.ReLU())])

    def forward(self, x):
        h = self.bn(self.conv(x)).relu().mean(dim=(2, 3))
        return self.mlp(h)
'''


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """A project with pyproject.toml at its root and the model two directories below."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("INITLINT_NO_PROGRESS", "1")
    (tmp_path / "src" / "models").mkdir(parents=True)
    (tmp_path / "src" / "models" / "net.py").write_text(NET)
    return tmp_path


def write_config(root: Path, body: str) -> None:
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n\n" + body)


def run(*args):
    torch.manual_seed(0)  # the CLI runs in this process: the model's init must not depend on earlier tests
    return CliRunner().invoke(main, ["check", "src/models/net.py", "--format", "json", *args])


def codes(result):
    doc = json.loads(result.stdout)
    return {(f["code"], m) for r in doc["results"] for f in r["findings"] for m in (f["members"] or [f["module"]])}


def test_defaults_without_a_config(project):
    result = run()
    assert result.exit_code == 1
    assert {("IL002", "conv"), ("IL001", "mlp.0"), ("IL001", "mlp.14")} <= codes(result)


def test_nearest_pyproject_with_the_table_is_used(project):
    write_config(project, '[tool.initlint]\nselect = ["IL002"]\n')
    (project / "src" / "pyproject.toml").write_text("[project]\nname = 'inner, without initlint'\n")
    result = run()
    assert codes(result) == {("IL002", "conv")}


def test_cli_flags_override_the_file(project):
    write_config(project, '[tool.initlint]\nselect = ["IL002"]\nfail-on = "error"\n')
    assert run().exit_code == 0  # warnings only, and the file says fail on errors
    result = run("--select", "IL001", "--fail-on", "warning")
    assert result.exit_code == 1
    assert {code for code, _ in codes(result)} == {"IL001"}


def test_select_as_a_comma_separated_string_and_ignore(project):
    write_config(project, '[tool.initlint]\nselect = "IL001,IL002"\nignore = ["IL001"]\n')
    assert codes(run()) == {("IL002", "conv")}


def test_format_key(project):
    write_config(project, '[tool.initlint]\nformat = "concise"\nselect = ["IL002"]\n')
    result = CliRunner().invoke(main, ["check", "src/models/net.py"])
    assert re.match(r"src/models/net\.py:\d+:1: IL002 \[conv\]", result.stdout)


@pytest.mark.parametrize("key", ["init-scale", "IL001"])
def test_per_rule_options_by_name_and_code(project, key):
    write_config(project, f'[tool.initlint]\nselect = ["IL001", "IL002"]\n\n'
                          f'[tool.initlint.rules.{key}]\nmax-variance-drift = 1e12\n')
    assert codes(run()) == {("IL002", "conv")}  # the 1.6e6x drift of the MLP is within 1e12


def test_per_module_ignores(project):
    write_config(project, '[tool.initlint]\nselect = ["IL001", "IL002", "IL010"]\n\n'
                          '[tool.initlint.per-module-ignores]\n"conv" = ["IL002"]\n"mlp.*" = ["IL0"]\n'
                          '"decoder.*" = ["IL001"]\n')
    found = codes(run())
    assert found == {("IL010", "")}  # everything silenced; the decoder pattern matched nothing


def test_explicit_config_path(project, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("shared") / "initlint.toml"
    elsewhere.write_text('[tool.initlint]\nselect = ["IL002"]\n')
    write_config(project, '[tool.initlint]\nselect = ["IL001"]\n')
    assert codes(run("--config", str(elsewhere))) == {("IL002", "conv")}


def test_unknown_keys_warn_and_name_the_key(project):
    write_config(project, '[tool.initlint]\nfail_on = "error"\ncolour = true\nselect = ["IL002"]\n')
    result = run()
    assert result.exit_code == 1  # fail_on was not understood, so the default (warning) applies
    assert "unknown key 'fail_on' in [tool.initlint] (ignored; did you mean 'fail-on'?)" in result.stderr
    assert "unknown key 'colour'" in result.stderr
    assert codes(result) == {("IL002", "conv")}


@pytest.mark.parametrize("body, words", [
    ('seed = "abc"', ["seed must be an integer", "'abc'"]),
    ('batch-size = 0', ["batch-size must be an integer of at least 1"]),
    ('logits = "yes"', ["logits must be true or false"]),
    ('fail-on = "fatal"', ["fail-on must be one of info, warning, error", "'fatal'"]),
    ('format = "xml"', ["format must be one of text, concise, json, sarif, github"]),
    ('select = 3', ["select must be a list of rule codes"]),
    ('device = 0', ["device must be a string"]),
    ('input-shape = [0, 3]', ["input-shape must be a shape"]),
    ('rules = 1', ["rules must be a table"]),
    ('[tool.initlint.rules.dead-relu]\nbogus = 1', ["rules.dead-relu: IL003 (dead-relu) has no option 'bogus'",
                                                   "max-dead-fraction"]),
    ('[tool.initlint.rules.dead-relu]\nmax-dead-fraction = "half"', ["rules.dead-relu.max-dead-fraction must be a "
                                                                      "number"]),
    ('[tool.initlint.rules.no-such-rule]\nx = 1', ["rules.no-such-rule: unknown rule"]),
    ('[tool.initlint.per-module-ignores]\n"conv" = ["IL999"]', ["'IL999' (for 'conv') is not a known rule"]),
    ('[tool.initlint.per-module-ignores]\n"conv" = 2', ["per-module-ignores must be a table of module patterns"]),
])
def test_invalid_values_exit_2_with_one_sentence(project, body, words):
    section = body if body.startswith("[") else "[tool.initlint]\n" + body
    write_config(project, section + "\n")
    result = run()
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("initlint: error: pyproject.toml: [tool.initlint] ")
    for word in words:
        assert word in lines[0]


def test_broken_toml_and_missing_config_file_exit_2(project):
    write_config(project, "[tool.initlint\nselect = 1\n")
    result = run()
    assert result.exit_code == 2 and "is not valid TOML" in result.stderr
    result = run("--config", "nowhere.toml")
    assert result.exit_code == 2 and "--config nowhere.toml: no such file" in result.stderr


def test_values_are_normalised(project):
    write_config(project, '[tool.initlint]\ninput-shape = [16, 3, 8, 8]\nseed = 3\nlogits = true\n'
                          'per-module-ignores = { "conv" = "IL002" }\n'
                          '[tool.initlint.rules.dead-relu]\nmax_dead_fraction = 1\n')
    values = load_config(None, "src/models/net.py").values
    assert values["input_shapes"] == ["16,3,8,8"]
    assert (values["seed"], values["logits"]) == (3, True)
    assert values["per_module_ignores"] == {"conv": ["IL002"]}
    assert values["rule_options"] == {"IL003": {"max-dead-fraction": 1.0}}
    write_config(project, '[tool.initlint]\ninput-shape = ["16,3,8,8", [16, 4]]\n')
    assert load_config(None, "src/models/net.py").values["input_shapes"] == ["16,3,8,8", "16,4"]


def test_config_without_the_table_warns(project):
    (project / "other.toml").write_text("[tool.black]\nline-length = 100\n")
    cfg = load_config("other.toml", "src/models/net.py")
    assert cfg.values == {} and "has no [tool.initlint] table" in cfg.warnings[0]
    with pytest.raises(ConfigError):
        load_config("missing.toml", "src/models/net.py")


def test_every_key_is_documented():
    doc = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for key in KEYS:
        assert f"`{key}`" in doc, key


def test_every_numeric_option_of_a_built_in_rule_declares_its_range_and_its_default_lies_in_it():
    from initlint.rules import all_rules

    for code, rule in all_rules().items():
        for name, default in rule.options.items():
            if isinstance(default, bool) or not isinstance(default, (int, float)):
                continue
            assert name in rule.option_ranges, f"{code} {name}"
            low, high = rule.option_ranges[name]
            assert low <= default and (high is None or default <= high), f"{code} {name}"


def test_a_value_outside_a_rule_declared_range_is_refused_with_the_range(tmp_path):
    import initlint
    import pytest
    import torch.nn as nn

    with pytest.raises(initlint.UsageError, match=r"max-cosine must be a number from 0 to 1 \(default 0.95\), not 1.5"):
        initlint.audit(nn.Linear(4, 4), rule_options={"IL013": {"max-cosine": 1.5}})


def test_audit_takes_extend_select_and_codes_as_a_string_a_tuple_or_a_set():
    import initlint
    import pytest
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    for layer in model[::2]:
        nn.init.normal_(layer.weight)
    x = torch.randn(32, 256)
    everything = {code for code, _ in initlint.audit(model, x).codes()}
    assert {"IL001", "IL005"} <= everything
    assert {c for c, _ in initlint.audit(model, x, select="IL001").codes()} == {"IL001"}
    assert {c for c, _ in initlint.audit(model, x, select=("IL005",), extend_select={"IL001"}).codes()} == \
        {"IL001", "IL005"}
    assert "IL001" not in {c for c, _ in initlint.audit(model, x, ignore="init-scale").codes()}
    for bad in (dict(select=5), dict(extend_select=[3]), dict(ignore=[None])):
        with pytest.raises(initlint.UsageError, match="must be a list of rule codes or names"):
            initlint.audit(model, x, **bad)
