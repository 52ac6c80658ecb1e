"""``initlint check FOLDER``: the walk, exclusions, each file's own configuration, selection precedence
as in ruff, and every error or note printed once."""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from initlint.cli import main
from initlint.inputs.targets import DEFAULT_EXCLUDE, ExclusionFinder, collect, walk

CONV_BN = '''
import torch.nn as nn
class ConvBN(nn.Module):
    """IL002 at conv: its bias is cancelled by the BatchNorm."""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
    def forward(self, x):
        return self.bn(self.conv(x)).relu()
'''

BLOCK = '''
import torch.nn as nn
class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
    def forward(self, x):
        return self.fc(x)
'''


def tree(root: Path, files: dict) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def check(*args: str):
    torch.manual_seed(0)
    return CliRunner().invoke(main, ["check", *args])


def audited(result) -> dict:
    """target -> {(code, module)} from the JSON output."""
    doc = json.loads(result.stdout)
    return {r["target"]: {(f["code"], f["module"]) for f in r["findings"]} for r in doc["results"]}


@pytest.fixture()
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("INITLINT_NO_PROGRESS", "1")
    return tmp_path


def test_a_folder_is_walked_for_model_files_only(project):
    tree(project, {
        "models/net.py": CONV_BN,
        "models/deep/more.py": CONV_BN,
        "models/utils.py": "def helper():\n    return 1\n",
        "models/flax_net.py": "import flax.linen as nn\nclass Net(nn.Module):\n    pass\n",
        "models/legacy.py": 'import torch.nn as nn\nprint "python 2"\nclass Old(nn.Module):\n    pass\n',
        "models/blocks.py": BLOCK,  # needs arguments: passed over with a note, not an error
        **{f"models/{skip}/net.py": CONV_BN for skip in (".venv", "venv", "build", "dist", "site-packages",
                                                           "__pycache__", "node_modules", ".hidden")},
    })
    result = check("models", "--format", "json")
    assert result.exit_code == 1, result.output
    assert audited(result) == {"models/deep/more.py:ConvBN": {("IL002", "conv")},
                               "models/net.py:ConvBN": {("IL002", "conv")}}
    assert result.stderr.splitlines() == [  # each said once
        f"initlint: note: models/legacy.py skipped: Python {sys.version_info[0]}.{sys.version_info[1]} cannot parse "
        "it (line 2: Missing parentheses in "
        "call to 'print'. Did you mean print(...)?)",
        "initlint: note: models/blocks.py:Block skipped: it needs constructor arguments (dim)"]


def test_exclude_and_extend_exclude(project):
    files = {"src/a.py": CONV_BN, "src/legacy/b.py": CONV_BN, "src/tests/fixtures/c.py": CONV_BN,
             "src/build/d.py": CONV_BN, "src/e_old.py": CONV_BN}
    tree(project, files)
    (project / "pyproject.toml").write_text('[tool.initlint]\nextend-exclude = ["legacy", "src/tests/fixtures", '
                                            '"*_old.py"]\n')
    assert walk("src", ExclusionFinder()) == ["src/a.py"]
    (project / "pyproject.toml").write_text('[tool.initlint]\nexclude = ["legacy"]\n')  # replaces the defaults
    assert sorted(walk("src", ExclusionFinder())) == ["src/a.py", "src/build/d.py", "src/e_old.py",
                                                      "src/tests/fixtures/c.py"]
    (project / "pyproject.toml").write_text('[tool.initlint]\nexclude = 3\n')
    result = check("src")
    assert result.exit_code == 2
    assert result.stderr == "initlint: error: pyproject.toml: [tool.initlint] exclude must be a list of glob " \
                            "patterns such as [\"tests/fixtures\", \"*_legacy.py\"], not 3\n"
    assert ".*" in DEFAULT_EXCLUDE


def test_the_hook_applies_exclusions_to_named_files_too(project):
    tree(project, {"gen/net.py": CONV_BN, "pyproject.toml": '[tool.initlint]\nextend-exclude = ["gen"]\n'})
    assert collect(["gen/net.py"], hook=True).targets == []
    assert collect(["gen/net.py"]).targets == ["gen/net.py"]  # named without the hook: checked, as ruff does


def test_each_file_uses_its_own_configuration(project):
    tree(project, {
        "pyproject.toml": '[tool.initlint]\nselect = ["IL001"]\n',
        "a/net.py": CONV_BN,
        "b/pyproject.toml": '[tool.initlint]\nselect = ["IL002"]\nfail-on = "error"\n',
        "b/net.py": CONV_BN,
    })
    result = check("a/net.py", "b/net.py", "--format", "json")
    assert audited(result) == {"a/net.py:ConvBN": set(), "b/net.py:ConvBN": {("IL002", "conv")}}
    assert result.exit_code == 0  # b's IL002 is a warning, and b's configuration fails on errors only
    result = check("b/net.py", "a/net.py", "--format", "json", "--fail-on", "warning")
    assert result.exit_code == 1  # the command line wins over both files


@pytest.mark.parametrize("config, flags, expected", [
    ('ignore = ["IL002"]', ["--select", "IL002"], {("IL002", "conv")}),  # ruff's documented example
    ('ignore = ["IL002"]', ["--extend-select", "IL002"], {("IL002", "conv")}),
    ('ignore = ["IL002"]', [], set()),
    ('select = ["IL0"]\nignore = ["IL002"]', ["--select", "IL00"], {("IL002", "conv")}),
    ('select = ["IL002"]', ["--ignore", "IL0"], None),  # nothing left to run: an error
    ('select = ["IL001"]\nextend-select = ["IL002"]', [], {("IL002", "conv")}),
    ('select = ["IL002"]\nignore = ["IL0"]', [], {("IL002", "conv")}),  # a code is more specific than a prefix
    ('select = ["IL00"]\nignore = ["bias-before-norm"]', [], set()),  # a name beats a prefix
    ('select = ["ALL"]\nignore = ["bias-before-norm"]', ["--extend-select", "IL00"], {("IL002", "conv")}),  # later
])
def test_selection_precedence_as_in_ruff(project, config, flags, expected):
    tree(project, {"pyproject.toml": f"[tool.initlint]\n{config}\n", "net.py": CONV_BN})
    result = check("net.py", "--format", "json", *flags)
    if expected is None:
        assert result.exit_code == 2 and "leaves no rule to run" in result.stderr
        return
    assert audited(result) == {"net.py:ConvBN": expected}, result.output


def test_an_error_is_printed_once(project):
    tree(project, {"blocks.py": BLOCK})
    result = check("blocks.py")
    assert result.exit_code == 2
    message = "Block needs constructor arguments (dim)"
    assert (result.stdout + result.stderr).count(message) == 1
    assert result.stderr.startswith("initlint: error: blocks.py: " + message)
    assert "1 could not be audited" in result.stdout
    as_json = check("blocks.py", "--format", "json")
    assert json.loads(as_json.stdout)["results"][0]["error"].startswith(message)  # machine formats keep it


def test_a_folder_without_models(project):
    tree(project, {"empty/readme.py": "X = 1\n"})
    result = check("empty")
    assert result.exit_code == 2 and result.stderr == \
        "initlint: error: empty: no Python file below it defines a torch nn.Module subclass\n"


def test_a_candidate_that_holds_no_torch_module_after_import_is_passed_over(project):
    tree(project, {"pkg/net.py": CONV_BN,
                   "pkg/odd.py": "import torch\nBase = type('Base', (), {})\nclass Net(Base):\n    pass\n",
                   "pkg/act.py": "import torch\nimport torch.nn as nn\nclass Swish(nn.Module):\n"
                                 "    def forward(self, x):\n        return x * torch.sigmoid(x)\n"})
    assert collect(["pkg"]).targets == ["pkg/act.py", "pkg/net.py", "pkg/odd.py"]  # odd.py: base built by a call
    result = check("pkg", "--format", "json")
    assert result.exit_code == 1 and audited(result) == {"pkg/net.py:ConvBN": {("IL002", "conv")}}
    assert result.stderr.startswith("initlint: note: pkg/act.py:Swish skipped: cannot infer a probe input")
    assert len(result.stderr.splitlines()) == 1
    named = check("pkg/act.py")  # named on its own, the same model is an error
    assert named.exit_code == 2 and "cannot infer a probe input for Swish" in named.stderr


def test_a_walk_skips_what_git_ignores_but_never_a_tracked_or_named_file(tmp_path):
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.fail("git is needed for this test (the development setup has it)")
    for rel in ("generated/net.py", "src/net.py", "src/net_scratch.py", "src/kept_scratch.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(CONV_BN)
    (tmp_path / ".gitignore").write_text("generated/\n*_scratch.py\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "-f", "src/kept_scratch.py"], check=True)
    found = [Path(p).relative_to(tmp_path).as_posix() for p in walk(str(tmp_path), ExclusionFinder())]
    assert found == ["src/kept_scratch.py", "src/net.py"]
    named = collect([str(tmp_path / "src" / "net_scratch.py")])
    assert named.targets == [str(tmp_path / "src" / "net_scratch.py")]
    (tmp_path / ".git").rename(tmp_path / "not-git")  # outside a work tree nothing is ignored
    assert len(walk(str(tmp_path), ExclusionFinder())) == 4
