"""The pre-commit hooks: files without torch models are skipped without importing them, and the real hook
fails only on real findings.

The ``initlint`` hook (``language: python``) builds its own environment with torch the
first time it runs (about three minutes here, from a local wheel, and it needs the package
index); that is pre-commit's business, so the end-to-end tests run ``initlint-system``, the
same entry with the initlint of this environment, offline: through the real ``pre-commit
try-repo``, and as the README's own configuration snippets.
"""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = os.path.dirname(sys.executable)

GOOD = '''
import torch.nn as nn


class Good(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)
        nn.init.kaiming_normal_(self.fc.weight, nonlinearity="relu")
        nn.init.zeros_(self.fc.bias)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(self.fc(x).relu())
'''

BAD = '''
import torch.nn as nn


class Bad(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x)).relu()
'''

PLAIN = '''
import json


class Config:
    """Not a model."""


print(json.dumps({"a": 1}))
'''


def _env() -> dict:
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), INITLINT_NO_PROGRESS="1")
    for key in [k for k in env if k.startswith(("PRE_COMMIT", "GIT_"))]:
        del env[key]  # a surrounding git hook's settings must not leak into the temporary repository
    return env


def test_hooks_manifest():
    yaml = pytest.importorskip("yaml")  # PyYAML, which pre-commit brings
    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"initlint", "initlint-system"}
    assert hooks["initlint"]["language"] == "python" and hooks["initlint-system"]["language"] == "system"
    for hook in hooks.values():
        assert hook["entry"] == "initlint check --skip-files-without-models"
        assert hook["types"] == ["python"]


def test_plain_files_are_skipped_without_importing_torch(tmp_path):
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(PLAIN)
    script = textwrap.dedent(f"""
        import sys
        from initlint.cli import main
        try:
            main(["check", "--skip-files-without-models", {str(tmp_path / 'a.py')!r}, {str(tmp_path / 'b.py')!r}])
        except SystemExit as exc:
            print("exit", exc.code)
        print("torch imported:", "torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=_env())
    assert out.stdout.split("\n")[:2] == ["exit 0", "torch imported: False"], out.stderr


# a statement of a Python newer than the running one: a type alias (3.12), a template string (3.14),
# a lazy import (3.15)
NEWER_SYNTAX = ("type Width = int" if sys.version_info < (3, 12) else
                'greeting = t"hello {name}"' if sys.version_info < (3, 14) else "lazy import json")

FOREIGN = {
    # files the hook must pass over without importing them: each writes a marker if it is imported
    "flax_net.py": "import flax.linen as nn\n\n\nclass Net(nn.Module):\n    features: int = 8\n",
    "tf_net.py": "import tensorflow as tf\n\n\nclass Net(tf.Module):\n    pass\n",
    "ansible_module.py": "from ansible.module_utils.basic import AnsibleModule\n\n\nclass Mod(AnsibleModule):\n    pass\n",
    # torch models the running Python cannot parse: skipped with a note, not an error
    "py2.py": 'import torch.nn as nn\nprint "hello from Python 2"\n\n\nclass Old(nn.Module):\n    pass\n',
    "newer.py": f"import torch.nn as nn\n{NEWER_SYNTAX}\n\n\nclass New(nn.Module):\n    pass\n",
}

ALIASED_BAD = BAD.replace("import torch.nn as nn\n", "import torch.nn as nn\n\nBase = nn.Module\n").replace(
    "class Bad(nn.Module)", "class Bad(Base)")


def _git_repo(path: Path) -> None:
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True, env=_env())
    (path / "good.py").write_text(GOOD)
    (path / "bad.py").write_text(ALIASED_BAD)
    (path / "plain.py").write_text(PLAIN)
    for name, body in FOREIGN.items():
        (path / name).write_text(f"open('IMPORTED-{name}', 'w').close()\n" + body)


def _try_repo(repo: Path, *files: str) -> subprocess.CompletedProcess:
    pytest.importorskip("pre_commit")
    cmd = [sys.executable, "-m", "pre_commit", "try-repo", str(ROOT), "initlint-system", "--verbose", "--files", *files]
    return subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=300, env=_env())


@pytest.mark.slow  # pre-commit runs the hook in processes of its own
def test_pre_commit_hook_fails_only_on_real_findings(tmp_path):
    """One run of the real hook over a good model, a bad one (nn.Module through an alias), a plain file, and
    Flax, TensorFlow, Ansible, Python 2 and newer-Python files: it fails on the bad model alone, imports none of
    the foreign files, and says why it skipped the two it cannot parse."""
    repo = tmp_path / "project"
    _git_repo(repo)
    out = _try_repo(repo, "good.py", "bad.py", "plain.py", *FOREIGN)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Failed" in out.stdout and "bad.py:Bad" in out.stdout and "IL002" in out.stdout
    assert "good.py:Good" in out.stdout  # audited, and clean
    assert "IL0" not in out.stdout.split("good.py:Good")[1].split("\n\n")[0]
    assert [p.name for p in repo.glob("IMPORTED-*")] == []
    for name in ("py2.py", "newer.py"):
        assert f"initlint: note: {name} skipped: Python {sys.version_info[0]}.{sys.version_info[1]} cannot parse it" \
            in out.stdout
    assert "error" not in out.stdout.lower().replace("severity", "")


README_URL = "https://github.com/ORG/initlint"


def _readme_snippets() -> list:
    """The YAML blocks of the README's pre-commit section, as written there."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## pre-commit\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)


@pytest.mark.slow  # pre-commit runs the hook in processes of its own
@pytest.mark.parametrize("which", ["remote", "local"])
def test_readme_snippet_runs_offline(tmp_path, which):
    """The README's configuration, copied into a project holding a model with a finding and a plain file,
    runs with ``pre-commit run`` offline (git may only read local repositories, pip may not reach an
    index): the remote snippet pins a commit this repository holds, and only its URL is replaced by
    this checkout's path."""
    pytest.importorskip("pre_commit")
    yaml = pytest.importorskip("yaml")
    remote, local = _readme_snippets()[:2]
    snippet = remote if which == "remote" else local
    config = yaml.safe_load(snippet)["repos"][0]
    if which == "remote":
        assert config["repo"] == README_URL and re.fullmatch(r"[0-9a-f]{40}", config["rev"]), config
        held = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", config["rev"] + "^{commit}"], env=_env())
        assert held.returncode == 0, f"README.md pins {config['rev']}, which this repository does not hold"
        snippet = snippet.replace(README_URL, str(ROOT))
    assert [h["id"] for h in config["hooks"]] == ["initlint-system" if which == "remote" else "initlint"]
    repo = tmp_path / "project"
    _git_repo(repo)
    (repo / ".pre-commit-config.yaml").write_text(snippet)
    env = dict(_env(), PRE_COMMIT_HOME=str(tmp_path / "cache"), GIT_ALLOW_PROTOCOL="file", PIP_NO_INDEX="1")
    subprocess.run(["git", "add", "."], cwd=repo, check=True, env=env)
    out = subprocess.run([sys.executable, "-m", "pre_commit", "run", "--files", "good.py", "bad.py", "plain.py"],
                         cwd=repo, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Failed" in out.stdout and "bad.py:Bad" in out.stdout and "IL002" in out.stdout
    assert "good.py:Good" in out.stdout and "1 finding(s) in 2 model(s)" in out.stdout  # plain.py: not a model
