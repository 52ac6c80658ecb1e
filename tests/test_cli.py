"""The command line, run as a real process: exit codes, output, the installed entry point."""
import json
import re
import os
import shutil
import subprocess
import sys

import pytest
from cli_server import run_initlint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
ENV = dict(os.environ, INITLINT_NO_PROGRESS="1", NO_COLOR="1")


def run(*args, cwd=ROOT):
    return run_initlint(list(args), cwd=cwd, env=ENV)


def test_clean_model_exits_0():
    out = run("check", "examples/kaiming_mlp.py", "--logits")
    assert out.returncode == 0, out.stderr
    assert "no findings" in out.stdout


def test_findings_exit_1_with_location_code_and_fix():
    out = run("check", "examples/conv_bias_bn.py")
    assert out.returncode == 1
    assert "examples/conv_bias_bn.py:9:1" in out.stdout and "IL002" in out.stdout
    assert "bias=False" in out.stdout


@pytest.mark.slow  # two processes
def test_installed_entry_point():
    exe = shutil.which("initlint", path=os.path.dirname(sys.executable)) or shutil.which("initlint")
    assert exe, "the initlint console script must be installed"
    out = subprocess.run([exe, "check", "examples/naive_mlp.py", "--logits", "--format", "concise"],
                         capture_output=True, text=True, cwd=ROOT, env=ENV)
    assert out.returncode == 1
    lines = out.stdout.strip().splitlines()
    assert any(line.startswith("examples/naive_mlp.py:14:1: IL001 [fc1]") for line in lines)


JSON_FINDING_KEYS = {"code", "name", "severity", "module", "message", "fix", "value", "threshold", "location"}


def test_json_document_schema():
    out = run("check", "examples/naive_mlp.py", "examples/kaiming_mlp.py", "--logits", "--format", "json")
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    assert set(doc) == {"initlint", "results", "notes"} and doc["notes"] == []
    assert [r["model"] for r in doc["results"]] == ["NaiveMLP", "KaimingMLP"]
    for result in doc["results"]:
        assert {"target", "model", "device", "capture", "findings", "error"} <= set(result)
        assert result["capture"] in ("fx", "runtime") and result["error"] is None
        for f in result["findings"]:
            assert JSON_FINDING_KEYS <= set(f)
            assert isinstance(f["value"], (int, float)) and isinstance(f["threshold"], (int, float))
    codes = {(f["code"], f["module"]) for f in doc["results"][0]["findings"]}
    assert ("IL004", "fc3") in codes


def test_select_ignore_and_seed():
    out = run("check", "examples/naive_mlp.py", "--logits", "--select", "IL004", "--format", "json")
    codes = {f["code"] for f in json.loads(out.stdout)["results"][0]["findings"]}
    assert codes == {"IL004"}
    out = run("check", "examples/naive_mlp.py", "--ignore", "IL001,IL005", "--format", "json")
    codes = {f["code"] for f in json.loads(out.stdout)["results"][0]["findings"]}
    assert not codes & {"IL001", "IL005"}


def test_named_target_and_factory(tmp_path):
    src = tmp_path / "factory.py"
    src.write_text("import torch.nn as nn\n\ndef build():\n    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))\n")
    out = run("check", f"{src}:build")
    assert out.returncode == 0, out.stderr
    out = run("check", "examples/linear_stack.py:ScaledStack")
    assert out.returncode == 0, out.stdout + out.stderr


def test_input_shape_option():
    out = run("check", "examples/kaiming_mlp.py", "--input-shape", "4,200", "--logits")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("args,message", [
    (("check", "no/such/file.py"), "no such file"),
    (("check", "examples/kaiming_mlp.py", "--select", "IL999"), "unknown rule"),
    (("check", "examples/kaiming_mlp.py", "--input-shape", "4,x"), "--input-shape"),
    (("explain", "IL999"), "unknown rule"),
])
def test_usage_errors_exit_2_with_one_line(args, message):
    out = run(*args)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr


def test_rules_table_and_python_dash_m():
    out = run("rules")
    assert out.returncode == 0
    for code in ("IL001", "IL002", "IL003", "IL004", "IL005", "IL006", "IL007", "IL008", "IL009"):
        assert code in out.stdout


BLOCKS = '''import torch.nn as nn
class Block(nn.Module):
    def __init__(self, dim):
        super().__init__(); self.fc = nn.Linear(dim, dim); self.act = nn.ReLU()
    def forward(self, x): return self.act(self.fc(x))
'''


def test_building_blocks_needing_arguments_are_skipped_beside_a_buildable_model(tmp_path):
    src = tmp_path / "net.py"
    src.write_text(BLOCKS + '''class Net(nn.Module):
    def __init__(self):
        super().__init__(); self.blocks = nn.Sequential(Block(32), Block(32)); self.head = nn.Linear(32, 2)
    def forward(self, x): return self.head(self.blocks(x))
''')
    out = run("check", str(src), "--format", "json")
    assert out.returncode == 0, out.stderr
    assert [r["model"] for r in json.loads(out.stdout)["results"]] == ["Net"]
    assert "Block skipped: it needs constructor arguments (dim)" in out.stderr


def test_a_file_of_blocks_only_is_an_error_unless_skipping_for_pre_commit(tmp_path):
    src = tmp_path / "blocks.py"
    src.write_text(BLOCKS + BLOCKS.split("\n", 1)[1].replace("class Block", "class Other"))
    out = run("check", str(src))
    assert out.returncode == 2 and "can be built without arguments" in out.stderr
    out = run("check", "--skip-files-without-models", str(src))
    assert out.returncode == 0, out.stderr


def test_scan_counts_only_real_module_subclasses():
    from initlint.inputs.scan import defines_module

    assert defines_module("class DataModule:\n    pass\n") is False
    assert defines_module("import lightning as pl\nclass Data(pl.LightningDataModule):\n    pass\n") is False
    assert defines_module("import torch.nn as nn\nclass B(A):\n    pass\nclass A(nn.Module):\n    pass\n") is True
    assert defines_module("from transformers import PreTrainedModel\nclass M(PreTrainedModel):\n    pass\n") is True
    assert defines_module("import torch.nn as nn\nclass A(nn.Module):\n    def f(:\n") is None
    assert defines_module("def f(:\n") is False  # no class with bases: nothing to parse, not a model


RNG_MODEL = '''import random

import numpy as np
import torch.nn as nn


class ThreeRngs(nn.Module):
    """Weights drawn from torch, scaled by Python's random and NumPy: unseeded, each run would differ."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Sequential(*[m for _ in range(3) for m in (nn.Linear(64, 64), nn.ReLU())])
        for layer in self.fc[::2]:
            nn.init.normal_(layer.weight)
            layer.weight.data.mul_(random.uniform(0.5, 2.0) * (1.0 + abs(float(np.random.randn()))))

    def forward(self, x):
        return self.fc(x)
'''


def test_the_same_command_gives_the_same_numbers(tmp_path):
    """Every RNG is seeded before the import and the build: two processes print the same report."""
    pytest.importorskip("numpy")  # the model draws from NumPy's generator too
    model = tmp_path / "rngs.py"
    model.write_text(RNG_MODEL)
    command = ("check", "examples/naive_mlp.py", str(model), "--format", "json")
    first, second, other_seed = run(*command), run(*command), run(*command, "--seed", "1")
    assert first.returncode == 1, first.stderr
    assert first.stdout == second.stdout

    def weight_stds(out):
        return [[f["value"] for f in r["findings"] if f["code"] == "IL001"] for r in json.loads(out.stdout)["results"]]

    naive, rngs = weight_stds(first)
    assert len(naive) == 3 and rngs, first.stdout  # IL001 on fc1, fc2, fc3 of NaiveMLP; on ThreeRngs' layers
    for a, b in zip(naive + rngs, sum(weight_stds(other_seed), [])):
        assert a != b  # the seed reaches the build of both models


def test_rule_catalog_is_up_to_date():
    """The catalog ``initlint rules`` and ``explain`` read without torch is generated from the rule classes."""
    from initlint.output.docs import CATALOG, catalog_source, render
    from initlint.rules import _catalog

    with open(CATALOG, encoding="utf-8") as fh:
        assert fh.read() == catalog_source(), "initlint/rules/catalog.py is stale; run: python -m initlint.output.docs"
    from initlint.rules import all_rules

    rules = all_rules()
    assert list(_catalog()) == list(rules)
    for code, info in _catalog().items():
        rule = rules[code]
        assert (info.name, info.severity, info.role, info.summary) == (rule.name, rule.severity, rule.role, rule.summary)
        assert dict(info.options) == rule.options and info.page == render(rule)


NO_TORCH_SCRIPT = r'''
import contextlib, io, json, sys
from initlint.cli import main
results = []
for args in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code
    results.append({"args": args, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
                    "torch": "torch" in sys.modules})
print(json.dumps(results))
'''

BAD_ARGUMENTS = [
    (["check", "missing.py"], "missing.py: no such file"),
    (["check", "examples/kaiming_mlp.py", "nowhere/missing.py"], "nowhere/missing.py: no such file"),
    (["check", "examples/kaiming_mlp.py", "nowhere/"], "nowhere/: no such file or folder"),
    (["check", "examples/kaiming_mlp.py", "--format", "yaml"], "unknown format 'yaml'"),
    (["check", "examples/kaiming_mlp.py", "--select", "IL999"], "unknown rule code 'IL999'"),
    (["check", "examples/kaiming_mlp.py", "--ignore", "dead-relus"], "unknown rule code 'dead-relus'"),
    (["check", "examples/kaiming_mlp.py", "--input-shape", "4,x"], "--input-shape '4,x' is not a list"),
    (["check", "examples/kaiming_mlp.py", "--input-shape", "4;200"], "--input-shape '4;200' is not a list"),
    (["check", "examples/kaiming_mlp.py", "--device", "gpu"], "--device must be auto, cpu, cuda, cuda:N or mps"),
    (["check", "examples/kaiming_mlp.py", "--fail-on", "never"], "--fail-on takes one of"),
    (["check", "examples/kaiming_mlp.py", "--seed", "-1", "--batch-size", "0"], "--batch-size must be"),
    (["check", "--skip-files-without-models", "README.md", "--format", "yaml"], "unknown format 'yaml'"),
    (["explain", "IL999"], "unknown rule 'IL999'"),
    (["fix", "missing.py"], "missing.py: no such file"),
    (["fix", "examples/naive_mlp.py", "--select", "IL999"], "unknown rule code 'IL999'"),
    (["fix", "examples/naive_mlp.py", "--input-shape", "4,x"], "--input-shape '4,x' is not a list"),
    (["fix", "examples/naive_mlp.py", "--device", "tpu"], "--device must be auto, cpu, cuda, cuda:N or mps"),
]


def _without_torch(cases, env=None):
    out = subprocess.run([sys.executable, "-c", NO_TORCH_SCRIPT, json.dumps(cases)], capture_output=True, text=True,
                         cwd=ROOT, env=env or ENV, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_bad_arguments_answer_in_one_sentence_without_importing_torch():
    """Each bad argument is refused with exit 2 and one line, before torch is imported; a fresh interpreter
    runs them one after another and looks for torch in ``sys.modules`` after each."""
    results = _without_torch([args for args, _ in BAD_ARGUMENTS])
    for (args, message), result in zip(BAD_ARGUMENTS, results):
        assert result["code"] == 2, result
        lines = result["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("initlint: error: ") and message in lines[0], result
        assert result["stdout"] == "" and not result["torch"], result


def test_rules_and_explain_answer_without_importing_torch():
    from initlint.output.docs import render
    from initlint.rules import all_rules

    listed, explained, by_name = _without_torch([["rules"], ["explain", "IL003"], ["explain", "saturated-softmax"]])
    assert [r["code"] for r in (listed, explained, by_name)] == [0, 0, 0]
    assert not any(r["torch"] for r in (listed, explained, by_name))
    rows = [line.split()[:3] for line in listed["stdout"].splitlines()[2:]]
    assert rows == [[code, rule.name, rule.severity] for code, rule in all_rules().items()]
    assert explained["stdout"] == render(all_rules()["IL003"])
    assert by_name["stdout"] == render(all_rules()["IL004"])


@pytest.mark.slow  # three processes
def test_rule_plugins_are_loaded_only_for_what_the_catalog_does_not_know(tmp_path):
    """With a plugin installed, a built-in rule is still explained without torch; the plugin's own code
    loads the plugins (and torch) and is found; ``rules`` lists both."""
    info = tmp_path / "initlint_example_rules-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: initlint-example-rules\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[initlint.rules]\nhuge-weight = initlint_example_rules:HugeWeight\n")
    shutil.copy(os.path.join(ROOT, "tests", "plugin_example", "initlint_example_rules.py"), tmp_path)
    env = dict(ENV, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT, os.environ.get("PYTHONPATH", "")]))
    builtin, plugin = _without_torch([["explain", "IL003"], ["explain", "XA001"]], env)
    assert builtin["code"] == 0 and not builtin["torch"] and builtin["stdout"].startswith("# IL003 `dead-relu`")
    assert plugin["code"] == 0 and plugin["torch"] and plugin["stdout"].startswith("# XA001 `huge-weight`")
    listed, = _without_torch([["rules"]], env)
    assert "IL003" in listed["stdout"] and "XA001" in listed["stdout"]


@pytest.mark.slow  # three processes
def test_input_shape_forms_and_forced_progress_lines():
    """``8x3x32x32`` and ``(8,3,32,32)`` mean 8,3,32,32 (as --help says); INITLINT_PROGRESS=1 shows the
    progress lines when stderr is not a terminal."""
    from initlint.inputs.config import parse_shape

    assert parse_shape("8,3,32,32") == parse_shape("8x3x32x32") == parse_shape("(8, 3, 32, 32)") == (8, 3, 32, 32)
    helped = run("check", "--help")
    assert "8x3x32x32" in helped.stdout and "(8,3,32,32)" in helped.stdout and "INITLINT_PROGRESS=1" in helped.stdout
    quiet = dict(ENV)
    quiet.pop("INITLINT_NO_PROGRESS")
    for env, shown in ((quiet, False), (dict(quiet, INITLINT_PROGRESS="1"), True)):
        out = subprocess.run([sys.executable, "-m", "initlint", "check", "examples/kaiming_mlp.py", "--logits",
                              "--input-shape", "4x200"], capture_output=True, text=True, cwd=ROOT, env=env)
        assert out.returncode == 0, out.stderr
        assert ("initlint: loading examples/kaiming_mlp.py" in out.stderr) is shown, out.stderr
        assert ("initlint: reporting" in out.stderr) is shown
def test_fix_prints_a_module_that_reproduces_the_repair(tmp_path):
    """`initlint fix x.py > fixes.py`: stdout is Python (the summary as comments) that repairs a fresh build."""
    import torch

    import initlint
    from initlint.inputs.usercode import seed_everything

    out = run("fix", "examples/naive_mlp.py", "--logits")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("# NaiveMLP: initlint fix") and "# after: clean" in out.stdout
    namespace = {}
    exec(compile(out.stdout, "fixes.py", "exec"), namespace)
    sys.path.insert(0, EXAMPLES)
    try:
        from naive_mlp import NaiveMLP
    finally:
        sys.path.remove(EXAMPLES)
    seed_everything(0)  # as the CLI builds it
    model = namespace["apply_initlint_fixes"](NaiveMLP())
    assert [f.code for f in initlint.audit(model, logits=True).findings if f.severity != "info"] == []
    seed_everything(0)
    expected = NaiveMLP()
    initlint.fix(expected, logits=True)  # repairs in place
    assert expected.state_dict().keys() == model.state_dict().keys()
    for name, tensor in expected.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


FORWARD_ERRORS = '''
import torch.nn as nn


class NotWarmedUp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        raise ValueError("call warm_up() first")


class WrongWidth(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(9, 2)

    def forward(self, x):
        return self.head(self.fc(x))
'''


def test_the_input_shape_advice_comes_only_with_errors_about_the_inputs(tmp_path):
    (tmp_path / "errors.py").write_text(FORWARD_ERRORS)
    out = run("check", "errors.py", cwd=tmp_path)
    assert out.returncode == 2
    lines = dict(line.split(": ", 3)[2:] for line in out.stderr.strip().splitlines())
    assert set(lines) == {"errors.py:NotWarmedUp", "errors.py:WrongWidth"}
    assert "call warm_up() first" in lines["errors.py:NotWarmedUp"]
    assert "--input-shape" not in lines["errors.py:NotWarmedUp"]
    assert "(at errors.py:11)" in lines["errors.py:NotWarmedUp"]  # where the model's code raised, named as everywhere
    assert "mat1 and mat2 shapes cannot be multiplied" in lines["errors.py:WrongWidth"]
    assert "pass matching --input-shape" in lines["errors.py:WrongWidth"]


def _readme_section(title):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        return fh.read().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _numbers_masked(text: str) -> str:
    """``text`` with every number as ``#`` and whitespace as one space (a table wraps its messages by their width)."""
    return re.sub(r"\s+", " ", re.sub(r"\d+(\.\d+)?(e[+-]\d+)?", "#", text))


def test_readme_get_started_commands():
    """The newcomer's first command installs the runtime dependencies only and lints an example with the output
    the README opens with; the contributor's block installs the dev extra and runs what CI runs."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    first, contributor = [b.strip() for b in re.findall(r"```bash\n(.*?)```", _readme_section("Get started"), re.S)
                          if "pip install -e" in b or "initlint check" in b]
    install_torch, install, lint = [part.strip() for part in first.split("&&")]
    assert install_torch.startswith("pip install torch==") and install == "pip install ."
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        dependencies = tomllib.load(fh)["project"]["dependencies"]
    assert sorted(re.match(r"[a-z]+", d).group() for d in dependencies) == ["click", "tabulate", "tomli", "torch"]
    out = run(*lint.split()[1:])
    assert out.returncode == 1, out.stderr
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        shown = fh.read().split(f"```\n$ {lint}\n", 1)[1].split("```", 1)[0]
    # the header names the device the audit picked: cpu there, cuda on a machine with a GPU (README: Get started),
    # where the probe batch comes from CUDA's generator, so the measured values differ in their last digits
    got = re.sub(r"device: cuda(:\d+)?\)", "device: cpu)", out.stdout, count=1)
    if got != out.stdout:
        got, shown = _numbers_masked(got), _numbers_masked(shown)
    assert got == shown
    assert contributor.splitlines() == ['pip install -e ".[dev]"', "# run the tests", "python -m pytest -q"]


def test_forced_progress_reaches_the_block_by_block_audit(monkeypatch):
    """The meta-device audit's per-block lines follow the same switch as the command line's."""
    from initlint.scale.stream import _terminal_progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    monkeypatch.delenv("INITLINT_NO_PROGRESS", raising=False)
    monkeypatch.setenv("INITLINT_PROGRESS", "0")
    assert _terminal_progress() is None
    monkeypatch.setenv("INITLINT_PROGRESS", "1")
    assert callable(_terminal_progress())
