"""Third-party rules through the ``initlint.rules`` entry-point group: one file makes a rule
that is run, listed, explained and tested like the built-in ones; a broken plugin is an IL000
finding that names it, and the built-in rules still run."""
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def install(tmp_path, entry: str, files: dict) -> dict:
    """An installed distribution in ``tmp_path`` (a dist-info with one entry point); the environment to use it."""
    info = tmp_path / "initlint_example_rules-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: initlint-example-rules\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[initlint.rules]\n{entry}\n")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT, os.environ.get("PYTHONPATH", "")]))
    return env


def run(env, *args, **kwargs):
    return subprocess.run(list(args), capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, **kwargs)


@pytest.mark.slow  # four processes, one a pytest run
def test_a_rule_in_one_file_is_registered_documented_and_tested(tmp_path):
    with open(os.path.join(HERE, "plugin_example", "initlint_example_rules.py")) as fh:
        env = install(tmp_path, "huge-weight = initlint_example_rules:HugeWeight", {"initlint_example_rules.py": fh.read()})
    listed = run(env, sys.executable, "-m", "initlint", "rules")
    assert "XA001" in listed.stdout and "huge-weight" in listed.stdout
    explained = run(env, sys.executable, "-m", "initlint", "explain", "XA001")
    assert explained.returncode == 0 and "## Example" in explained.stdout and "layer_with_a_huge_weight" in explained.stdout
    audited = run(env, sys.executable, "-c", textwrap.dedent("""
        import initlint, initlint_example_rules as p
        model, _ = p.HugeWeight.bad[0].model()
        print(sorted(initlint.audit(model, select=["XA001"]).codes()))
        print(sorted(initlint.audit(model, ignore=["huge-weight"]).codes()))
    """))
    lines = audited.stdout.splitlines()
    assert lines[0] == "[('XA001', '2')]" and "XA001" not in lines[1], audited.stderr
    generated = run(env, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    os.path.join(HERE, "test_rule_examples.py"), "-k", "XA001")
    assert "5 passed" in generated.stdout, generated.stdout  # bad, good, "has examples", its repair, "repair shown"


def test_a_broken_plugin_is_reported_and_the_built_in_rules_still_run(tmp_path):
    env = install(tmp_path, "broken = initlint_broken_rules:Rule", {"initlint_broken_rules.py": "raise ImportError('no module named foo')\n"})
    out = run(env, sys.executable, "-c", textwrap.dedent("""
        import torch.nn as nn, initlint
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
        for f in initlint.audit(model).findings:
            print(f.code, '|', f.message)
    """))
    lines = out.stdout.splitlines()
    assert any(line.startswith("IL002 |") for line in lines), out.stderr
    errors = [line for line in lines if line.startswith("IL000 |")]
    assert len(errors) == 1 and "broken = initlint_broken_rules:Rule" in errors[0] and "ImportError" in errors[0]
