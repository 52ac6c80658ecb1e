"""The torch versions initlint supports (initlint/compat.py): one sentence on an older torch, and the
fallbacks for APIs newer than the oldest supported torch give what the newer API gives."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from initlint import compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("version, expected", [("2.4.1+cu121", (2, 4)), ("2.15.0", (2, 15)), ("2.13.0+cpu", (2, 13)),
                                               ("2.6.0a0+git1234", (2, 6)), ("2.10.0rc1", (2, 10))])
def test_torch_version_reads_major_and_minor(version, expected):
    assert compat.torch_version(version) == expected


def test_a_torch_older_than_the_minimum_gets_one_sentence_naming_it():
    assert compat.unsupported("2.4.0") == "" and compat.unsupported("2.15.0") == ""
    message = compat.unsupported("2.3.1")
    assert "torch >= 2.4" in message and "2.3.1" in message and "\n" not in message


_OLD_TORCH = "import sys, torch; torch.__version__ = '2.1.2'; sys.argv[0] = 'initlint'; "


@pytest.mark.parametrize("args", [["check", "examples/naive_mlp.py"], ["fix", "examples/naive_mlp.py"]])
def test_the_command_line_on_an_old_torch_exits_2_with_that_sentence(args):
    code = _OLD_TORCH + "from initlint.cli import main; main()"
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("initlint")]  # torch may warn first
    assert said == ["initlint: error: " + compat.unsupported("2.1.2")], done.stderr


def test_the_api_on_an_old_torch_raises_that_sentence():
    code = _OLD_TORCH + "import initlint\ntry:\n    initlint.audit\nexcept ImportError as e:\n    print(e)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert done.stdout.strip() == compat.unsupported("2.1.2"), done.stderr


def _aten_overloads():
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        for overload in getattr(packet, "overloads", lambda: [])():
            yield getattr(packet, overload)


def _named_in_place(op) -> bool:
    """torch.Tag.inplace where torch has it (2.13), else the name: an in-place variant ends with ``_``, or is
    a dunder name starting ``__i``."""
    if hasattr(torch.Tag, "inplace"):
        return torch.Tag.inplace in op.tags
    name = op._schema.name.split("::")[1]
    if name.startswith("__") and name.endswith("__"):
        return name.startswith("__i")  # __ilshift__, __ixor__: in place; __lshift__, __xor__: not
    return name.endswith("_")


def test_the_schema_tells_in_place_ops_as_torch_does_on_every_pointwise_op():
    pointwise = [op for op in _aten_overloads() if torch.Tag.pointwise in op.tags]
    assert len(pointwise) > 300
    disagree = [str(op) for op in pointwise if compat.inplace_from_schema(op) != _named_in_place(op)]
    assert disagree == []
    assert compat.inplace_from_schema(torch.ops.aten.mul_.Tensor)
    assert not compat.inplace_from_schema(torch.ops.aten.mul.Tensor)
    assert not compat.inplace_from_schema(torch.ops.aten.mul.out)


def test_tree_is_leaf_opens_what_pytree_opens():
    from collections import namedtuple

    pair = namedtuple("pair", "a b")
    for obj, leaf in [(torch.zeros(2), True), ((1, 2), False), ([1], False), ({"a": 1}, False), (pair(1, 2), False),
                      (3, True), ("text", True)]:
        assert bool(compat.tree_is_leaf(obj)) is leaf, obj  # pytree._is_leaf before torch 2.8


def test_version_counters_are_set_together():
    a, b = torch.zeros(3), torch.ones(2)
    a.add_(1)
    a.add_(1)
    b.mul_(2)
    compat.set_version_counters([a, b], [7, 5])
    assert (a._version, b._version) == (7, 5)
