"""CLI start-up on a directory of files without models, and proof that torch is not imported.

    python benchmarks/bench_startup.py [--files 100] [--repeats 5]

Writes ``--files`` ordinary Python files (functions, classes, imports, no ``nn.Module``)
into a temporary directory and times, in fresh processes,

* ``python -c pass`` (the interpreter alone),
* ``python -m initlint check --skip-files-without-models FILES...`` (the pre-commit path),
* ``python -c "import torch"`` (what the check would cost if it imported torch),

then runs the check once more with ``python -X importtime`` and fails if any module whose
name starts with ``torch`` appears in the import log (or if the exit code is not 0).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List

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


def write_files(directory: str, count: int) -> List[str]:
    paths = []
    for i in range(count):
        path = os.path.join(directory, f"plain_{i:03d}.py")
        with open(path, "w") as fh:
            fh.write(PLAIN_FILE.format(i=i))
        paths.append(path)
    return paths


def run(argv: List[str], cwd: str) -> float:
    env = dict(os.environ, INITLINT_NO_PROGRESS="1")
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... exited {done.returncode}: {done.stderr.strip()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    py = sys.executable
    print(f"machine: {C.machine()}")
    print(f"code: {C.revision()}")
    with tempfile.TemporaryDirectory() as directory:
        files = write_files(directory, opts.files)
        names = [os.path.basename(p) for p in files]
        check = [py, "-m", "initlint", "check", "--skip-files-without-models", *names]
        commands = {"python -c pass": [py, "-c", "pass"], f"initlint check ({opts.files} files)": check,
                    "python -c 'import torch'": [py, "-c", "import torch"]}
        for argv in commands.values():
            run(argv, directory)  # warm the file system cache
        samples = {k: [] for k in commands}
        for _ in range(opts.repeats):
            for key, argv in commands.items():
                samples[key].append(run(argv, directory))
        env = dict(os.environ, INITLINT_NO_PROGRESS="1")
        traced = subprocess.run([py, "-X", "importtime", *check[1:]], cwd=directory, env=env, capture_output=True,
                                text=True)
    imported = [line.rsplit("|", 1)[-1].strip() for line in traced.stderr.splitlines() if line.startswith("import time:")]
    torch_modules = [m for m in imported if m.split(".")[0] == "torch"]
    rows = [[k, f"{statistics.median(v) * 1000:.0f}"] for k, v in samples.items()]
    print()
    print(f"Median of {opts.repeats} fresh processes, milliseconds.")
    print()
    print(C.table(["command", "wall time (ms)"], rows))
    print()
    print(f"exit code of the check: {traced.returncode}; modules imported: {len(imported)}; "
          f"torch modules among them: {len(torch_modules)}")
    if traced.returncode != 0 or torch_modules:
        raise SystemExit(f"FAILED: exit {traced.returncode}, torch modules imported: {torch_modules[:5]}")
    print("torch was not imported")


if __name__ == "__main__":
    main()
