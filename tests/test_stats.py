"""The probe's statistics are typed records: a misspelt statistic is an error, never a silent None."""
import pytest
import torch
import torch.nn as nn

import initlint
from initlint.probe.stats import OpStats, ParamStats, TensorStats, UnknownStatistic


def test_probe_results_are_typed_records():
    torch.manual_seed(0)
    report = initlint.audit(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    probe = report.probe
    assert all(isinstance(s, OpStats) for s in probe.ops.values())
    assert all(isinstance(s, ParamStats) for s in probe.params.values())
    assert probe.grads and all(isinstance(s, TensorStats) for s in probe.grads.values())
    relu = next(op for op in report.graph if op.kind == "relu")
    stats = probe.ops[relu.id]
    assert stats.rms == stats.get("rms") == stats["rms"] > 0 and "rms" in stats
    assert stats.maxprob is None and "maxprob" not in stats and stats.get("maxprob", 7) == 7


def test_a_misspelt_statistic_raises():
    stats = OpStats(rms=1.0)
    with pytest.raises(UnknownStatistic):
        stats.get("rsm")
    with pytest.raises(UnknownStatistic):
        "rsm" in stats  # noqa: B015 - the lookup itself must raise
    with pytest.raises(UnknownStatistic):
        ParamStats.from_dict({"rms": 1.0, "dup_row": 2.0})
    with pytest.raises(KeyError):
        stats["absmax"]  # a real statistic that was not measured
