"""Rule codes are written only in ``initlint/rules/``: the pipeline refers to a rule by its class
(``RuleError.code``) or its role, so a rule is renumbered or added in one file."""
import ast
import os
import re

import initlint

PACKAGE_DIR = os.path.dirname(initlint.__file__)
CODE = re.compile(r"\bIL\d{3}\b")

USAGE_EXAMPLES = {
    ("cli.py", "The model output is logits: check its softmax (IL004)."),
    ("cli.py", "Codes or prefixes to run (comma-separated), e.g. IL00,IL010."),
    ("inputs/config.py", "a list of rule codes or names such as [\"IL001\", \"dead-relu\"]"),
    ("inputs/config.py", "a table of module patterns to lists of codes, such as \"encoder.*\" = [\"IL004\"]"),
    ("inputs/config.py", "the model output is logits (check its softmax, IL004)"),
    ("integrations/pytest_plugin.py", "(select=['IL001'])"),
}
"""Help and error texts that show the user the syntax of a selection with a code as the example; the
pipeline never acts on them."""


def _docstrings(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                yield body[0].value
        if isinstance(node, (ast.Module, ast.ClassDef)):  # attribute docstrings: a string after an assignment
            for before, after in zip(node.body, node.body[1:]):
                if isinstance(before, (ast.Assign, ast.AnnAssign)) and isinstance(after, ast.Expr) \
                        and isinstance(after.value, ast.Constant):
                    yield after.value


def code_literals(package_dir: str = PACKAGE_DIR):
    """``(file, string)`` for every string in the code (not a docstring) outside ``rules/`` naming a rule code."""
    found = []
    for folder, _, files in os.walk(package_dir):
        if os.path.relpath(folder, package_dir).split(os.sep)[0] == "rules":
            continue
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            tree = ast.parse(open(path, encoding="utf-8").read())
            docs = {id(d) for d in _docstrings(tree)}
            rel = os.path.relpath(path, package_dir)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                        and CODE.search(node.value):
                    found.append((rel, node.value))
    return found


def test_no_rule_code_is_written_outside_the_rules():
    assert set(code_literals()) - USAGE_EXAMPLES == set()


def test_the_usage_examples_are_still_there():
    assert USAGE_EXAMPLES <= set(code_literals())  # an example that went away leaves the list


def test_the_search_sees_a_code_in_the_pipeline(tmp_path):
    (tmp_path / "api.py").write_text('"""Mentions IL000 in a docstring."""\nRULE_ERROR = "IL000"\n')
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "il000.py").write_text('code = "IL000"\n')
    assert code_literals(str(tmp_path)) == [("api.py", "IL000")]
