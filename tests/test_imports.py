"""The package's modules import each other without cycles (every import statement counts,
also those inside functions), so each stage can be read and loaded on its own."""
import ast
import os

import initlint

PACKAGE_DIR = os.path.dirname(initlint.__file__)


def _modules():
    found = {}
    for folder, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE_DIR))[:-3].replace(os.sep, ".")
                found[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return found


def _imports(module, path, known):
    package = module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names = [target] + [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        yield from (n for n in names if n in known and n != module)


def import_cycles():
    """Strongly connected components of more than one module in the import graph (Tarjan)."""
    modules = _modules()
    edges = {m: set(_imports(m, p, modules)) for m, p in modules.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in modules:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles():
    assert import_cycles() == []


def test_the_cycle_finder_sees_a_cycle(tmp_path, monkeypatch):
    pkg = tmp_path / "initlint"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text("from . import a\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE_DIR", str(pkg))
    assert import_cycles() == [["initlint.a", "initlint.b"]]
