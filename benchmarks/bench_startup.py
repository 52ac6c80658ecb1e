"""CLI start-up: commands that need no model, files without models, and a folder of mostly plain files.

    python benchmarks/bench_startup.py [--files 100] [--folder-files 200] [--models 5] [--repeats 5] [--only-commands]

Part 0, answers without a model: ``initlint rules``, ``initlint explain IL003`` and the
refusal of bad arguments (a missing file, ``--format yaml``, ``--select IL999``, a malformed
``--input-shape``) through the installed ``initlint`` script, in fresh processes next to
``python -c pass`` and ``python -c "import torch"``: median wall time and CPU time (user +
system, which other jobs on a shared machine disturb much less). Each command is run once
more under ``python -X importtime``; the script fails if one imports a ``torch*`` module,
exits with another code than expected, or takes 0.5 s of CPU time or more.

Part 1, the pre-commit path: ``--files`` ordinary Python files (functions, classes,
imports, no ``nn.Module``) in a temporary directory, timed in fresh processes:

* ``python -c pass`` (the interpreter alone),
* ``python -m initlint check --skip-files-without-models FILES...``,
* ``python -c "import torch"`` (what the check would cost if it imported torch);

the check is run once more under ``python -X importtime`` and the script fails if any
``torch*`` module appears in the import log (or if the exit code is not 0).

Part 2, a folder: ``--folder-files`` files of which ``--models`` define a small torch
model, the others plain Python of three kinds (a small module with dataclasses, a module
whose classes derive from a sibling module's base class and from ``enum``/``Exception``,
and a 300-line module of functions and classes). Measured:

* in a fresh process, ``initlint.inputs.targets.collect([FOLDER])`` (walk + static scan of every
  file, once) with ``torch`` absent from ``sys.modules`` afterwards, and ``scan_file`` of
  each plain file on its own (best of 5 per file, nothing cached; median and maximum);
* interleaved fresh processes of ``initlint check FOLDER`` and ``initlint check`` of the
  model files alone: the difference divided by the plain files is what each one costs
  end to end (it includes the walk), in wall time and in CPU time (user + system of the
  process, which other jobs on a shared machine disturb much less).

The script fails when torch is imported for the plain files or a plain file costs 1 ms or more.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

PLAIN_FILE = '''"""Helpers number {i}."""
import os
from dataclasses import dataclass


@dataclass
class Record{i}:
    name: str
    size: int = {i}

    def describe(self) -> str:
        return f"{{self.name}} ({{self.size}})"


def total_{i}(values):
    return sum(v * {i} for v in values if v)


class Module{i}Helper:  # the name ends in "Helper", not "Module": not a torch module
    pass
'''

DERIVED_FILE = '''"""Classes built on the project's own base classes."""
import enum

from .plain_base import Base, Mixin


class Kind{i}(enum.Enum):
    SMALL = 1
    LARGE = 2


class Failure{i}(Exception):
    pass


class Worker{i}(Base, Mixin):
    def run(self, items):
        return [self.describe(item) for item in items]
'''

BASE_FILE = '''"""Base classes of the plain files (no torch)."""


class Base:
    def describe(self, item):
        return repr(item)


class Mixin:
    pass
'''

LONG_UNIT = '''

class Parser{j}(object):
    """Parse section {j}."""

    def __init__(self, text):
        self.text = text
        self.lines = text.splitlines()

    def headings(self):
        return [line for line in self.lines if line.startswith("#")]

    def words(self):
        return sum(len(line.split()) for line in self.lines)


def normalise_{j}(value, *, lower=True, strip=True):
    if strip:
        value = value.strip()
    if lower:
        value = value.lower()
    return value.replace("  ", " ")
'''

MODEL_FILE = '''import torch.nn as nn


class Net{i}(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())
'''


# ----------------------------------------------------------------------------- part 0
NO_MODEL_COMMANDS = [
    # (label, arguments of initlint, expected exit code)
    ("initlint rules", ["rules"], 0),
    ("initlint explain IL003", ["explain", "IL003"], 0),
    ("initlint check missing.py", ["check", "missing.py"], 2),
    ("initlint check net.py --format yaml", ["check", "net.py", "--format", "yaml"], 2),
    ("initlint check net.py --select IL999", ["check", "net.py", "--select", "IL999"], 2),
    ("initlint check net.py --input-shape 8,x", ["check", "net.py", "--input-shape", "8,x"], 2),
]
CPU_LIMIT = 0.5


def part_zero(repeats: int) -> None:
    py = sys.executable
    script = os.path.join(os.path.dirname(py), "initlint")
    with tempfile.TemporaryDirectory() as directory:
        with open(os.path.join(directory, "net.py"), "w") as fh:
            fh.write(MODEL_FILE.format(i=0))
        commands = {"python -c pass": ([py, "-c", "pass"], 0)}
        commands.update({label: ([script, *args], code) for label, args, code in NO_MODEL_COMMANDS})
        commands["python -c 'import torch'"] = ([py, "-c", "import torch"], 0)
        for argv, code in commands.values():
            run(argv, directory, ok=(code,))  # warm the file system cache
        samples: Dict[str, List[Tuple[float, float]]] = {k: [] for k in commands}
        for _ in range(repeats):  # interleaved, so load on the machine hits every command alike
            for key, (argv, code) in commands.items():
                samples[key].append(run_timed(argv, directory, ok=(code,)))
        imported = {label: torch_imports(["-m", "initlint", *args], directory, ok=(code,))
                    for label, args, code in NO_MODEL_COMMANDS}
    rows = [[k, f"{statistics.median(w for w, _ in v) * 1000:.0f}", f"{statistics.median(c for _, c in v) * 1000:.0f}",
             str(len(imported[k])) if k in imported else ""] for k, v in samples.items()]
    print(f"\nPart 0: commands that need no model. Median of {repeats} fresh processes.\n")
    print(C.table(["command", "wall time (ms)", "CPU time (ms)", "torch modules imported"], rows))
    if any(imported.values()):
        raise SystemExit(f"FAILED: torch imported by {[k for k, v in imported.items() if v]}")
    slow = [k for k, _, _ in NO_MODEL_COMMANDS if statistics.median(c for _, c in samples[k]) >= CPU_LIMIT]
    if slow:
        raise SystemExit(f"FAILED: {CPU_LIMIT} s of CPU time or more: {slow}")


# ----------------------------------------------------------------------------- part 1
def write_files(directory: str, count: int) -> List[str]:
    paths = []
    for i in range(count):
        path = os.path.join(directory, f"plain_{i:03d}.py")
        with open(path, "w") as fh:
            fh.write(PLAIN_FILE.format(i=i))
        paths.append(path)
    return paths


def env() -> Dict[str, str]:
    return dict(os.environ, INITLINT_NO_PROGRESS="1")


def run(argv: List[str], cwd: str, ok=(0,)) -> float:
    return run_timed(argv, cwd, ok)[0]


def run_timed(argv: List[str], cwd: str, ok=(0,)) -> Tuple[float, float]:
    """Wall time and CPU time (user + system) of one fresh process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env(), capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in ok:
        raise SystemExit(f"{' '.join(argv[:4])} ... exited {done.returncode}: {done.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def torch_imports(argv: List[str], cwd: str, ok=(0,)) -> List[str]:
    traced = subprocess.run([sys.executable, "-X", "importtime", *argv], cwd=cwd, env=env(), capture_output=True,
                            text=True)
    if traced.returncode not in ok:
        raise SystemExit(f"FAILED: exit {traced.returncode}: {traced.stderr.strip()[-500:]}")
    imported = [line.rsplit("|", 1)[-1].strip() for line in traced.stderr.splitlines()
                if line.startswith("import time:")]
    return [m for m in imported if m.split(".")[0] == "torch"]


def part_one(files: int, repeats: int) -> None:
    py = sys.executable
    with tempfile.TemporaryDirectory() as directory:
        names = [os.path.basename(p) for p in write_files(directory, files)]
        check = [py, "-m", "initlint", "check", "--skip-files-without-models", *names]
        commands = {"python -c pass": [py, "-c", "pass"], f"initlint check ({files} files)": check,
                    "python -c 'import torch'": [py, "-c", "import torch"]}
        for argv in commands.values():
            run(argv, directory)  # warm the file system cache
        samples: Dict[str, List[float]] = {k: [] for k in commands}
        for _ in range(repeats):
            for key, argv in commands.items():
                samples[key].append(run(argv, directory))
        torch_modules = torch_imports(check[1:], directory)
    rows = [[k, f"{statistics.median(v) * 1000:.0f}"] for k, v in samples.items()]
    print(f"\nPart 1: {files} plain files through the pre-commit path. Median of {repeats} fresh processes.\n")
    print(C.table(["command", "wall time (ms)"], rows))
    print(f"\ntorch modules imported by the check: {len(torch_modules)}")
    if torch_modules:
        raise SystemExit(f"FAILED: torch modules imported: {torch_modules[:5]}")


# ----------------------------------------------------------------------------- part 2
def write_folder(root: str, total: int, models: int) -> Dict[str, List[str]]:
    """A package of ``total`` files: ``models`` model files spread through it, the rest plain."""
    out: Dict[str, List[str]] = {"models": [], "plain": []}
    parts = 4  # sub-packages, each with a plain_base.py: they count towards ``total``
    step = max((total - parts) // max(models, 1), 1)
    for i in range(total - parts):
        sub = os.path.join(root, f"part{i % parts}")
        os.makedirs(sub, exist_ok=True)
        for init in (os.path.join(root, "__init__.py"), os.path.join(sub, "__init__.py")):
            if not os.path.exists(init):
                open(init, "w").close()
        path = os.path.join(sub, f"file_{i:03d}.py")
        if i % step == step - 1 and len(out["models"]) < models:
            text, kind = MODEL_FILE.format(i=i), "models"
        elif i % 3 == 0:
            text, kind = PLAIN_FILE.format(i=i), "plain"
        elif i % 3 == 1:
            text, kind = DERIVED_FILE.format(i=i), "plain"
        else:
            text, kind = '"""A long module."""\nimport re\n' + "".join(LONG_UNIT.format(j=j) for j in range(14)), "plain"
        with open(path, "w") as fh:
            fh.write(text)
        out[kind].append(path)
    for sub in sorted({os.path.dirname(p) for p in out["plain"] + out["models"]}):
        with open(os.path.join(sub, "plain_base.py"), "w") as fh:
            fh.write(BASE_FILE)
        out["plain"].append(os.path.join(sub, "plain_base.py"))
    return out


SCAN_SCRIPT = r'''
import json, statistics, sys, time
from initlint.inputs.scan import _Resolver, scan_file
import initlint.inputs.scan as scan
from initlint.inputs.targets import collect
folder, plain = sys.argv[1], json.loads(sys.argv[2])
start = time.perf_counter()
found = collect([folder])
walk = time.perf_counter() - start
per_file = []
for path in plain:
    best = float("inf")
    for _ in range(5):  # the best of 5: the file's own cost, without the other jobs' scheduling noise
        scan._RESOLVER = _Resolver()  # each file on its own, with nothing cached from the others
        start = time.perf_counter()
        verdict = scan_file(path).verdict
        best = min(best, time.perf_counter() - start)
        assert verdict == "none", (path, verdict)
    per_file.append(best)
print(json.dumps({"walk": walk, "targets": found.targets, "per_file": per_file, "torch": "torch" in sys.modules}))
'''


def part_two(total: int, models: int, repeats: int) -> None:
    py = sys.executable
    with tempfile.TemporaryDirectory() as directory:
        folder = os.path.join(directory, "proj")
        files = write_folder(folder, total, models)
        plain = files["plain"]
        scanned = json.loads(subprocess.run([py, "-c", SCAN_SCRIPT, folder, json.dumps(plain)], env=env(),
                                            capture_output=True, text=True, check=True).stdout)
        if sorted(scanned["targets"]) != sorted(files["models"]):
            raise SystemExit(f"FAILED: the walk found {scanned['targets']}, not the model files")
        scan_imports = torch_imports(["-c", f"from initlint.inputs.targets import collect; collect([{folder!r}])"], directory)
        check_dir = [py, "-m", "initlint", "check", folder]
        check_models = [py, "-m", "initlint", "check", *files["models"]]
        for argv in (check_dir, check_models):
            run(argv, directory)
        samples: Dict[str, List[Tuple[float, float]]] = {"dir": [], "models": []}
        for _ in range(repeats):  # interleaved, so load on the machine hits both alike
            samples["dir"].append(run_timed(check_dir, directory))
            samples["models"].append(run_timed(check_models, directory))
    n_plain = len(plain)
    per_file = scanned["per_file"]
    dir_ms, models_ms = (statistics.median(w for w, _ in samples[k]) * 1000 for k in ("dir", "models"))
    dir_cpu, models_cpu = (statistics.median(c for _, c in samples[k]) * 1000 for k in ("dir", "models"))
    print(f"\nPart 2: a folder of {n_plain + len(files['models'])} files, {len(files['models'])} of them models.\n")
    rows = [["walk + scan of the folder, one process (ms)", f"{scanned['walk'] * 1000:.1f}"],
            ["scan of one plain file, best of 5, median over the files (ms)", f"{statistics.median(per_file) * 1000:.3f}"],
            ["scan of one plain file, best of 5, slowest file (ms)", f"{max(per_file) * 1000:.3f}"],
            [f"initlint check FOLDER, median of {repeats}: wall / CPU (ms)", f"{dir_ms:.0f} / {dir_cpu:.0f}"],
            [f"initlint check MODEL FILES, median of {repeats}: wall / CPU (ms)", f"{models_ms:.0f} / {models_cpu:.0f}"],
            ["end to end per plain file, (FOLDER - MODEL FILES) / plain files: wall / CPU (ms)",
             f"{(dir_ms - models_ms) / n_plain:.3f} / {(dir_cpu - models_cpu) / n_plain:.3f}"],
            ["torch modules imported by the walk and scan", str(len(scan_imports))],
            ["torch in sys.modules after the walk and scan", str(scanned["torch"])]]
    print(C.table(["measure", "value"], rows))
    if scan_imports or scanned["torch"]:
        raise SystemExit(f"FAILED: the scan imported torch: {scan_imports[:5]}")
    if max(per_file) >= 1e-3:
        raise SystemExit(f"FAILED: a plain file cost {max(per_file) * 1000:.3f} ms to scan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--folder-files", type=int, default=200)
    parser.add_argument("--models", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only-commands", action="store_true", help="part 0 alone")
    opts = parser.parse_args()
    print(f"machine: {C.machine()}")
    print(f"code: {C.revision()}")
    part_zero(opts.repeats)
    if opts.only_commands:
        return
    part_one(opts.files, opts.repeats)
    part_two(opts.folder_files, opts.models, opts.repeats)


if __name__ == "__main__":
    main()
