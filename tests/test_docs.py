"""Rule documentation lives in the docstrings; rules/*.md and `initlint explain` are generated."""
import os
import subprocess
import sys

import pytest
from cli_server import run_initlint

from initlint.output.docs import pages, readme_with_table, render
from initlint.rules import all_rules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = ("## What it does", "## Why is this bad?", "## Example", "## Fix", "## Options")


@pytest.mark.parametrize("code", list(all_rules()))
def test_every_rule_documents_every_section(code):
    page = render(all_rules()[code])  # the Example section comes from the rule's first bad example
    for section in SECTIONS:
        assert section in page, f"{code} lacks {section}"


def test_readme_rule_table_is_up_to_date():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    assert readme_with_table(readme) == readme, "run: python -m initlint.output.docs"
    for code, rule in all_rules().items():
        assert f"| {code} | [{rule.name}](rules/{code}-{rule.name}.md) |" in readme


def test_rule_pages_are_up_to_date():
    directory = os.path.join(ROOT, "rules")
    present = {n for n in os.listdir(directory) if n.startswith("IL") and n.endswith(".md")}
    wanted = pages()
    assert present == set(wanted), "run: python -m initlint.output.docs rules"
    for name, text in wanted.items():
        with open(os.path.join(directory, name), encoding="utf-8") as fh:
            assert fh.read() == text, f"rules/{name} is stale; run: python -m initlint.output.docs rules"


def test_explain_prints_the_same_text():
    rule = all_rules()["IL003"]
    out = run_initlint(["explain", "dead-relu"])
    assert out.returncode == 0
    assert out.stdout.strip() == render(rule).strip()


def test_options_in_docs_match_declared_options():
    for code, rule in all_rules().items():
        for option in rule.options:
            assert f"``{option}``" in rule.doc(), f"{code} does not document option {option}"
