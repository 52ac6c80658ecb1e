"""The built wheel works on its own: installed (not editable) into a fresh environment and run
from a directory outside the checkout, its console script, rule documentation, pytest plugin
and pre-commit hook behave as they do from the source tree.

The fresh environment sees the running interpreter's site-packages through a ``.pth`` file
(torch, click and tabulate are not installed again), but not this checkout: every command
runs from a temporary directory, and the tests check that ``initlint`` is imported from the
environment's own site-packages.
"""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tarfile
import textwrap
import venv
import zipfile
from pathlib import Path
from typing import Dict, List, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
RULES = sorted(p.name for p in (ROOT / "initlint" / "rules").glob("il[0-9][0-9][0-9]_*.py"))

pytestmark = pytest.mark.slow  # builds the package and creates an environment (about a minute)


class Installed(NamedTuple):
    wheel: Path
    sdist: Path
    python: Path
    bin: Path
    site_packages: Path
    work: Path
    build_log: str


def _copy_source(dest: Path) -> Path:
    """The checkout without its caches and build output, so building writes nothing into it."""
    ignore = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                    ".hypothesis", "*.png", ".venv", "venv", ".ci-venv", ".ci-venv-torch-*")
    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


def _env(bin_dir: Path) -> Dict[str, str]:
    """The fresh environment's scripts first on PATH, nothing of this checkout on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PRE_COMMIT", "GIT_", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join([str(bin_dir), "/usr/local/bin", "/usr/bin", "/bin"])
    env["INITLINT_NO_PROGRESS"] = "1"
    return env


def _run(cmd: List[str], cwd: Path, env: Dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    source = _copy_source(base / "source")
    dist = base / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel, = dist.glob("initlint-*.whl")
    sdist, = dist.glob("initlint-*.tar.gz")

    env_dir = base / "env"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base,
                   _env(env_dir / "bin")).stdout.strip()
    parent = [p for p in site.getsitepackages() if os.path.isdir(p)]
    Path(purelib, "_parent_site.pth").write_text("\n".join(parent) + "\n")
    pip = _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], base, _env(env_dir / "bin"))
    assert pip.returncode == 0, pip.stdout + pip.stderr
    work = base / "work"
    work.mkdir()
    return Installed(wheel, sdist, python, env_dir / "bin", Path(purelib), work, built.stdout + built.stderr)


def test_build_warns_of_nothing_deprecated(installed: Installed) -> None:
    """The wheel's metadata carries the SPDX license and the supported Pythons; the sdist builds it."""
    assert "deprecated" not in installed.build_log.lower(), installed.build_log
    with zipfile.ZipFile(installed.wheel) as wheel:
        meta = next(wheel.read(n).decode() for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    assert "License-Expression: MIT" in meta.splitlines()
    assert "Requires-Python: >=3.10" in meta.splitlines()
    with tarfile.open(installed.sdist) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "initlint/py.typed", "initlint/rules/il003_dead_relu.py"} <= names


def test_wheel_contents(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        entry_points = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "initlint/py.typed" in names
    assert {"initlint/cli.py", "initlint/output/docs.py", "initlint/integrations/pytest_plugin.py", "initlint/rules/__init__.py",
            "initlint/rules/base.py"} <= names
    # `initlint explain` renders a rule's page from its module (docstring and examples): every rule is shipped
    assert len(RULES) >= 14 and {f"initlint/rules/{name}" for name in RULES} <= names
    assert {n.split("/")[0] for n in names} == {"initlint", next(n.split("/")[0] for n in names if ".dist-info/" in n)}
    sections = _entry_points(entry_points)
    assert sections["console_scripts"] == {"initlint": "initlint.cli:main"}
    assert sections["pytest11"] == {"initlint": "initlint.integrations.pytest_plugin"}
    assert "initlint.rules" not in sections  # that group is for other packages' rules; initlint's own are built in


def _entry_points(text: str) -> Dict[str, Dict[str, str]]:
    sections: Dict[str, Dict[str, str]] = {}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            current = line.strip("[]")
            sections[current] = {}
        elif "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            sections[current][key] = value
    return sections


def test_imports_the_installed_wheel(installed: Installed) -> None:
    out = _run([installed.python, "-c", "import initlint, initlint.rules; print(initlint.__file__)"],
               installed.work, _env(installed.bin))
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).parent == installed.site_packages / "initlint"


def test_check_an_example(installed: Installed) -> None:
    shutil.copy(ROOT / "examples" / "dead_relu.py", installed.work / "dead_relu.py")
    out = _run([installed.bin / "initlint", "check", "dead_relu.py", "--format", "concise"], installed.work,
               _env(installed.bin))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "IL003" in out.stdout and "act" in out.stdout


def test_explain_is_the_generated_page(installed: Installed) -> None:
    out = _run([installed.bin / "initlint", "explain", "IL003"], installed.work, _env(installed.bin))
    assert out.returncode == 0, out.stderr
    page, = (ROOT / "rules").glob("IL003-*.md")
    assert out.stdout.rstrip("\n") == page.read_text().rstrip("\n")  # click.echo ends with a newline of its own


PLUGIN_TESTS = '''
import pytest
import torch
import torch.nn as nn

import initlint.integrations.pytest_plugin


def test_plugin_is_the_installed_one():
    assert initlint.integrations.pytest_plugin.__file__.startswith({site!r})


@pytest.mark.initlint(select=["IL002"])
def test_clean_block(initlint_audit):
    block = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU())
    initlint_audit(block, torch.randn(4, 3, 16, 16))


@pytest.mark.initlint(select=["IL002"])
def test_bias_before_norm(initlint_audit):
    block = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    initlint_audit(block, torch.randn(4, 3, 16, 16))
'''


def test_pytest_plugin(installed: Installed) -> None:
    (installed.work / "test_models.py").write_text(PLUGIN_TESTS.format(site=str(installed.site_packages)))
    out = _run([installed.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_models.py"], installed.work,
               _env(installed.bin))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 failed, 2 passed" in out.stdout, out.stdout
    assert "FAILED test_models.py::test_bias_before_norm" in out.stdout and "IL002" in out.stdout


PLAIN = "import json\n\nprint(json.dumps({'a': 1}))\n"


def test_pre_commit_hook(installed: Installed) -> None:
    """The ``initlint-system`` hook through the real ``pre-commit try-repo``; the only ``initlint`` on PATH is
    the installed wheel's."""
    repo = installed.work / "project"
    repo.mkdir()
    env = _env(installed.bin)
    assert _run(["git", "init", "-q", "."], repo, env).returncode == 0
    shutil.copy(os.path.join(ROOT, "examples", "conv_bias_bn.py"), repo / "bad.py")  # IL002 on conv1
    (repo / "plain.py").write_text(PLAIN)
    assert shutil.which("initlint", path=env["PATH"]) == str(installed.bin / "initlint")
    cmd = [sys.executable, "-m", "pre_commit", "try-repo", ROOT, "initlint-system", "--verbose",
           "--files", "bad.py", "plain.py"]
    out = _run(cmd, repo, dict(env, PRE_COMMIT_HOME=str(installed.work / "pre-commit-cache")))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Failed" in out.stdout and "bad.py:ConvBlock" in out.stdout and "IL002" in out.stdout
