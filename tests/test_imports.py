"""The package's modules import each other without cycles (every import statement counts,
also those inside functions), and no stage imports a later one, so each stage can be read and
loaded on its own. The stages, in CONTRIBUTING.md's order: a module may import its own stage
and the ones before it."""
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
            submodules = [f"{target}.{alias.name}" for alias in node.names]
            # `from . import ops` imports the submodule; `from .x import f` imports module x
            names = submodules if all(n in known for n in submodules) else [target] + submodules
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


# The pipeline's stages, first to last (CONTRIBUTING.md, "The stages").
STAGES = ["errors", "version", "compat", "capture", "probe", "report", "rules", "output", "inputs", "attempts", "scale",
          "api", "coord", "repair", "integrations", "runner", "cli", "__main__", ""]


def stage(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports_running_back_up():
    modules = _modules()
    # the root package is every module's parent and the public facade (rule examples are user code)
    return sorted((m, t) for m, p in modules.items() for t in _imports(m, p, modules)
                  if t != "initlint" and STAGES.index(stage(t)) > STAGES.index(stage(m)))


def test_every_module_belongs_to_a_stage():
    assert sorted({stage(m) for m in _modules()} - set(STAGES)) == []


def test_no_stage_imports_a_later_one():
    assert imports_running_back_up() == []


def test_the_stage_check_sees_an_import_running_back_up(tmp_path, monkeypatch):
    pkg = tmp_path / "initlint"
    (pkg / "capture").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "capture" / "__init__.py").write_text("def f():\n    from ..rules import g\n")
    (pkg / "rules.py").write_text("def g():\n    pass\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE_DIR", str(pkg))
    assert imports_running_back_up() == [("initlint.capture", "initlint.rules")]
