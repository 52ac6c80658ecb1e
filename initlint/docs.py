"""Rule reference pages, generated from each rule's docstring (the one place they are written)."""
from __future__ import annotations

import os
from typing import Dict, Type

from .rules import Rule, all_rules


def render(rule: Type[Rule]) -> str:
    """The Markdown page of one rule: a title line, then its docstring."""
    title = f"# {rule.code} `{rule.name}`\n\n"
    meta = f"Severity: **{rule.severity}**. Needs: {', '.join(sorted(rule.needs))}.\n\n"
    return title + meta + rule.doc().strip() + "\n"


def pages() -> Dict[str, str]:
    """File name -> content for every rule."""
    return {f"{code}-{rule.name}.md": render(rule) for code, rule in all_rules().items()}


def write(directory: str) -> int:
    """Regenerate ``rules/*.md``; returns the number of pages written."""
    os.makedirs(directory, exist_ok=True)
    wanted = pages()
    for name in os.listdir(directory):
        if name.endswith(".md") and name.startswith("IL") and name not in wanted:
            os.remove(os.path.join(directory, name))
    for name, text in wanted.items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    return len(wanted)


if __name__ == "__main__":  # python -m initlint.docs rules/
    import sys

    print(f"wrote {write(sys.argv[1] if len(sys.argv) > 1 else 'rules')} rule pages")
