"""What IL014 (init-not-applied) costs on the real-size zoo: time and the largest private copy.

    python benchmarks/bench_declared.py [NAME ...] [--threads 1]

For each model of ``tests/zoo_real.py`` (all of them by default), built at its real init:

* ``judge``: the wall time of IL014's comparison alone (its declared init run on private copies,
  the statistics of every parameter), as the rule runs it (on one thread);
* ``audit``: the wall time of ``initlint.audit`` without IL014 (``ignore=["IL014"]``), for scale;
* ``copy``: the largest private copy the declared init was built on, against the model's own
  parameter bytes (the extra memory IL014 holds at once: one block, never the model twice);
* ``verdicts``: what IL014 reports (0 on the zoo at its real init).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402

import initlint  # noqa: E402
from initlint.probe import declared  # noqa: E402
from initlint.rules import il014_init_not_applied as il014  # noqa: E402


def _bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in {id(p): p for p in module.parameters()}.values())


def measure(name: str, threads: int) -> str:
    from zoo_real import build

    torch.set_num_threads(threads)
    model, inputs = build(name)
    copies = []
    original = declared._private_copy

    def recorded(root, unit, whole):
        private = original(root, unit, whole)
        copies.append(_bytes(private))
        return private

    declared._private_copy = recorded
    try:
        start = time.perf_counter()
        with declared.one_thread():
            verdicts = list(il014.judge(model, il014.InitNotApplied.options["std-tolerance"]))
        judge = time.perf_counter() - start
    finally:
        declared._private_copy = original
    start = time.perf_counter()
    initlint.audit(model, inputs, ignore=["IL014"], batch_size=2)
    audit = time.perf_counter() - start
    size = _bytes(model)
    largest = max(copies, default=0)
    line = (f"| {name} | {size / 1e6:.0f} MB | {judge:.1f} s | {audit:.1f} s | {largest / 1e6:.0f} MB "
            f"({100 * largest / size:.0f}%) | {len(verdicts)} |")
    del model, inputs
    gc.collect()
    return line


def main() -> None:
    from zoo_real import ZOO

    parser = argparse.ArgumentParser()
    parser.add_argument("names", nargs="*", default=list(ZOO))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print("| model | parameters | IL014 judge | audit without IL014 | largest copy | verdicts |")
    print("|---|---|---|---|---|---|")
    for name in args.names:
        print(measure(name, args.threads), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
