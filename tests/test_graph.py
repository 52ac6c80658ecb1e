"""The graph is read-only once the capture is over; what the probe measures lives in its result."""
import copy
import pickle

import pytest
import torch
import torch.nn as nn

import initlint
from initlint.capture.graph import FrozenGraph, Graph
from initlint.rules.base import Rule


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))


@pytest.mark.parametrize("capture", ["fx", "runtime"])
def test_the_audited_graph_refuses_every_write(capture, monkeypatch):
    if capture == "runtime":
        monkeypatch.setattr("initlint.capture.fx.FxCapture.__init__",
                            lambda self, model: (_ for _ in ()).throw(initlint.capture.CaptureError("forced")))
    report = initlint.audit(_mlp(), torch.randn(16, 32))
    assert report.capture == capture
    graph = report.graph
    relu = graph.of_kind("relu")[0]
    writes = [
        lambda: relu.attrs.__setitem__("units", 3),
        lambda: relu.attrs.update(shape=(1,)),
        lambda: setattr(relu, "kind", "gelu"),
        lambda: relu.inputs.append(0),
        lambda: relu.users.clear(),
        lambda: relu.params.__setitem__("weight", "x"),
        lambda: graph.add("relu", "F.relu", "", [0]),
        lambda: graph.ops.pop(),
        lambda: graph.outputs.append(0),
        lambda: graph.module_types.__setitem__("", "Other"),
        lambda: setattr(graph, "inputs", []),
    ]
    for write in writes:
        with pytest.raises(FrozenGraph):
            write()


def test_shapes_and_units_are_in_the_probe_result_not_in_the_graph():
    report = initlint.audit(_mlp(), torch.randn(16, 32))
    relu = report.graph.of_kind("relu")[0]
    first, last = report.graph.of_kind("linear")
    assert "shape" not in relu.attrs and "units" not in relu.attrs
    assert report.probe.shapes[relu.id] == (16, 64)
    assert report.probe.shapes[last.id] == (16, 8)
    stats = report.probe.ops[relu.id]
    assert stats.units == 64 and stats.unit_axis == 1 and 0 <= stats.dead < 64
    assert first.id in report.probe.shapes


def test_a_frozen_graph_copies_and_pickles_and_stays_frozen():
    report = initlint.audit(_mlp(), torch.randn(16, 32))
    for clone in (copy.deepcopy(report.graph), pickle.loads(pickle.dumps(report.graph))):
        assert [(op.kind, op.inputs, op.users, dict(op.attrs)) for op in clone] == \
            [(op.kind, op.inputs, op.users, dict(op.attrs)) for op in report.graph]
        with pytest.raises(FrozenGraph):
            clone.ops[0].attrs["x"] = 1


def test_a_rule_that_writes_the_graph_becomes_an_il000_finding(monkeypatch):
    class Scribbler(Rule):
        """Writes into the graph (not allowed)."""
        code, name, severity = "IL990", "scribbler", "warning"

        def check(self, audit):
            audit.graph.ops[0].attrs["mine"] = 1
            return iter(())

    monkeypatch.setattr("initlint.rules.all_rules",
                        lambda real=initlint.rules.all_rules: {**real(), "IL990": Scribbler})
    report = initlint.audit(_mlp(), torch.randn(16, 32), select=["IL000", "IL990"])
    assert [(f.code, "IL990" in f.message, "read-only" in f.message) for f in report.findings] == \
        [("IL000", True, True)]


def test_back_walks_the_main_path_nearest_first():
    graph = Graph()
    x = graph.add("input", "input", "", [])
    a = graph.add("linear", "nn.Linear", "a", [x.id])
    v = graph.add("view", "Tensor.view", "", [a.id])
    d = graph.add("dropout", "nn.Dropout", "d", [v.id])
    assert [op.id for op in graph.back(d)] == [d.id, v.id, a.id, x.id]
    assert [op.id for op in graph.back(d, through={"view", "dropout"})] == [d.id, v.id, a.id]
    assert [op.id for op in graph.back(d, limit=2)] == [d.id, v.id]
    assert graph.unit_axis(d) == -1
