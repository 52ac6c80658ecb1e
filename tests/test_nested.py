"""Tensors inside nested inputs and outputs: found in order, and mapped keeping the containers."""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Optional

import pytest
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from initlint.attempts import _halve_batch
from initlint.inputs.load import move_inputs
from initlint.capture.nested import map_tensors, tensors

Pair = collections.namedtuple("Pair", "first second")


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    extra: Any = None
    note: str = "plain dataclass, no pytree registration"


class OutputDict(collections.OrderedDict):
    """Shaped like a Hugging Face ``ModelOutput``, but registered with nobody."""


class Shapes(dict):
    pass


def _packed() -> PackedSequence:
    return pack_padded_sequence(torch.randn(3, 5, 2), torch.tensor([5, 3, 2]), batch_first=True)


def _same(found: list, expected: list) -> bool:
    return len(found) == len(expected) and all(a is b for a, b in zip(found, expected))


def test_tensors_in_order_through_every_container_kind():
    a, b, c, d, e = (torch.randn(2) for _ in range(5))
    nested = (Pair(a, 1), {"z": b, "y": [None, "text", c]}, Output(d, extra=OutputDict(h=e)))
    assert _same(tensors(nested), [a, b, c, d, e])
    assert _same(tensors(a), [a])
    assert tensors((1, "x", None, 2.5, torch.Size([3, 4]))) == []


def test_a_tensor_held_twice_is_listed_twice():
    a = torch.randn(2)
    assert _same(tensors((a, [a])), [a, a])


def test_model_output_and_unregistered_subclasses_are_opened():
    pytest.importorskip("transformers")
    import transformers

    a, b, c = (torch.randn(2) for _ in range(3))
    out = transformers.modeling_outputs.BaseModelOutput(last_hidden_state=a, hidden_states=(b, c))
    assert _same(tensors(out), [a, b, c])
    assert _same(tensors(OutputDict(x=b, y=a)), [b, a])
    assert _same(tensors(Shapes(x=c)), [c])


def test_an_object_reaching_itself_ends_at_the_depth_guard():
    a = torch.randn(2)
    loop: list = [a]
    loop.append(loop)
    found = tensors(loop)
    assert found and all(t is a for t in found)

    @dataclasses.dataclass
    class Node:
        value: torch.Tensor
        parent: Optional["Node"] = None

    node = Node(a)
    node.parent = node
    assert 1 < len(tensors(node)) < 10


def test_map_keeps_container_types_and_leaves_other_values_alone():
    a = torch.ones(2)
    marker = object()
    given = (Pair(a, "keep"), collections.OrderedDict(x=a, y=marker), [a, 3, None], Shapes(s=a))
    doubled = map_tensors(lambda t: t * 2, given)
    assert type(doubled) is tuple and type(doubled[0]) is Pair and doubled[0].second == "keep"
    assert type(doubled[1]) is collections.OrderedDict and doubled[1]["y"] is marker
    assert doubled[2][1:] == [3, None]
    assert isinstance(doubled[3], dict) and torch.equal(doubled[3]["s"], 2 * a)
    assert all(torch.equal(t, 2 * a) for t in tensors(doubled))
    assert torch.equal(a, torch.ones(2))


def test_a_packed_sequence_reaches_the_function_whole():
    seen = []
    packed = _packed()
    map_tensors(lambda t: seen.append(t) or t, {"x": packed})
    assert len(seen) == 1 and seen[0] is packed


def test_move_inputs_moves_a_packed_sequence_with_its_own_to():
    packed = _packed()
    moved = move_inputs(((packed, Pair(torch.randn(2), 1)),), torch.device("meta"))
    moved_packed, pair = moved[0]
    assert type(moved_packed) is PackedSequence and moved_packed.data.device.type == "meta"
    assert moved_packed.batch_sizes.device.type == "cpu"  # packing wants the batch sizes on the CPU
    assert type(pair) is Pair and pair.first.device.type == "meta" and pair.second == 1


def test_halving_the_batch_cuts_only_batch_leading_dense_tensors():
    x, mask, other = torch.randn(8, 3), torch.ones(8, 3), torch.randn(5)
    packed = _packed()
    args, kwargs = _halve_batch((Pair(x, packed),), {"mask": mask, "other": other, "flag": True})
    assert args[0].first.shape == (4, 3) and args[0].second is packed
    assert kwargs["mask"].shape == (4, 3) and kwargs["other"] is other and kwargs["flag"] is True
