"""report.plot / --plot: the four-panel signal profile against depth."""
import sys

import pytest
import torch
import torch.nn as nn
from click.testing import CliRunner

import initlint
from initlint.capture import ops as O
from initlint.cli import main
from initlint.report.plot import PlotError, measured_ops, signal_series
from initlint.report.findings import Report

PNG = b"\x89PNG\r\n\x1a\n"


def relu_mlp(depth=8, width=64, kaiming=False):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        linear = nn.Linear(width, width)
        if kaiming:
            nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
            nn.init.zeros_(linear.bias)
        layers += [linear, nn.ReLU()]
    return nn.Sequential(*layers)


@pytest.fixture(scope="module")
def default_report():
    return initlint.audit(relu_mlp())


def test_plot_writes_a_png_with_one_point_per_measured_layer(default_report, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "signal.png"
    series = default_report.plot(str(path))
    assert path.read_bytes().startswith(PNG) and path.stat().st_size > 10_000
    weight_ops = [op for op in default_report.graph.ops
                  if op.kind in O.WEIGHT_KINDS and op.id in default_report.probe.ops]
    assert len(weight_ops) == 8
    assert len(series["weight layers"]) == len(weight_ops)
    assert len(series["activations"]) == 8 and len(series["relu"]) == 8
    assert len(measured_ops(default_report)) == 16
    assert series["weight layers"].depth == [0, 2, 4, 6, 8, 10, 12, 14]  # execution order
    assert len(series["saturated"]) == 0  # no bounded activation in this model


def test_gradient_panel_uses_the_weight_gradients(default_report):
    assert default_report.probe.backward_ran
    grads = signal_series(default_report)["weight gradients"]
    assert grads.modules == [str(i) for i in range(0, 16, 2)]
    expected = [default_report.probe.grads[f"{i}.weight"]["std"] for i in range(0, 16, 2)]
    assert grads.values == pytest.approx(expected)


def test_flagged_layers_are_the_modules_of_findings(default_report):
    assert {m for code, m in default_report.codes() if code == "IL001"} == {str(i) for i in range(0, 16, 2)}
    series = signal_series(default_report)
    assert all(series["weight layers"].flagged)
    clean = signal_series(initlint.audit(relu_mlp(kaiming=True)))
    assert not any(clean["weight layers"].flagged) and len(clean["weight layers"]) == 8


def test_saturation_of_bounded_activations():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Sigmoid())
    nn.init.normal_(model[0].weight, std=2.0)  # drives tanh into its flat tails
    series = signal_series(initlint.audit(model))
    assert series["saturated"].depth == [1, 3]
    assert series["saturated"].values[0] > 0.5


def test_missing_matplotlib_is_a_plot_error(default_report, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(PlotError, match=r"pip install 'initlint\[plot\]'"):
        default_report.plot(str(tmp_path / "x.png"))
    assert not (tmp_path / "x.png").exists()


def test_nothing_to_plot_without_a_probe(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(PlotError, match="nothing to plot"):
        Report(model="M").plot(str(tmp_path / "x.png"))


MODEL = '''
import torch.nn as nn


class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(32, 32), nn.ReLU())])

    def forward(self, x):
        return self.layers(x)
'''


def test_cli_plot_option(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deep.py").write_text(MODEL)
    result = CliRunner().invoke(main, ["check", "deep.py", "--plot", "signal.png"])
    assert result.exit_code in (0, 1), result.output
    assert (tmp_path / "signal.png").read_bytes().startswith(PNG)


def test_cli_plot_without_matplotlib_exits_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deep.py").write_text(MODEL)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = CliRunner().invoke(main, ["check", "deep.py", "--plot", "signal.png"])
    assert result.exit_code == 2
    assert "pip install 'initlint[plot]'" in result.stderr
    assert not (tmp_path / "signal.png").exists()


class FunctionalRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.block = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(self.block(h))


def test_a_functional_call_is_named_by_its_source_line_not_model():
    pytest.importorskip("matplotlib")
    import inspect

    from initlint.report.plot import depth_labels, signal_figure

    report = initlint.audit(FunctionalRelu())
    lines, start = inspect.getsourcelines(FunctionalRelu.forward)
    relu_line = start + next(i for i, line in enumerate(lines) if "torch.relu" in line)
    expected = ["fc1", f"torch.relu (test_plot.py:{relu_line})", "block.0", "block.1", "fc2"]
    assert depth_labels(measured_ops(report)) == expected
    fig, _ = signal_figure(report)
    assert [t.get_text() for t in fig.axes[-1].get_xticklabels()] == expected
