"""The probe's statistics against the same quantities computed directly with torch."""
from __future__ import annotations

import math

import torch
import torch.nn as nn

import initlint
from initlint.probe.run import ProbeResult, _Collector, run_probe


def test_statistics_match_a_direct_computation():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 48), nn.Tanh(), nn.Linear(48, 4))
    nn.init.normal_(model[2].weight, std=2.0)  # drives part of the tanh into saturation
    with torch.no_grad():
        model[0].bias[:10] = -10.0  # kills ten ReLU units
    x = torch.randn(64, 32)
    report = initlint.audit(model, x)
    with torch.no_grad():
        h0 = model[0](x)
        h1 = torch.relu(h0)
        h3 = torch.tanh(model[2](h1))
    ops = {op.module: op for op in report.graph}
    stats = report.probe.ops
    assert math.isclose(stats[ops["0"].id]["rms"], h0.pow(2).mean().sqrt().item(), rel_tol=1e-5)
    assert math.isclose(stats[ops["0"].id]["absmax"], h0.abs().max().item(), rel_tol=1e-6)
    assert stats[ops["1"].id]["dead"] == int((h1.amax(0) == 0).sum())
    assert stats[ops["1"].id]["dead"] >= 10
    assert math.isclose(stats[ops["1"].id]["absmax"], h1.max().item(), rel_tol=1e-6)
    saturated = ((h3 < -0.98) | (h3 > 0.98)).float().mean().item()
    assert saturated > 0 and math.isclose(stats[ops["3"].id]["saturated"], saturated, rel_tol=1e-6)
    w = model[2].weight.detach()
    params = report.probe.params["2.weight"]
    assert math.isclose(params["rms"], w.pow(2).mean().sqrt().item(), rel_tol=1e-5)
    assert "low" not in params and "spread" not in params  # its units differ: neither zero nor constant
    assert params["dup_rows"] == 0 and params["rows"] == 48
    assert math.isclose(report.probe.params["0.bias"]["mean"], model[0].bias.mean().item(), rel_tol=1e-5)


def test_weights_that_may_be_zero_or_constant_get_their_exact_extremes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(),
                          nn.Linear(6, 1))
    with torch.no_grad():
        model[0].weight.fill_(0.25)  # constant
        model[2].weight.zero_()
        model[4].weight.copy_(torch.randn(1, 6).expand(6, 6))  # every unit alike, not constant
        model[6].weight.fill_(1e-30)  # below float32's squares: norm 0, not zero
    params = initlint.audit(model, torch.randn(16, 8)).probe.params
    assert (params["0.weight"]["low"], params["0.weight"]["spread"], params["0.weight"]["mean"]) == (0.25, 0.0, 0.25)
    assert (params["2.weight"]["absmax"], params["2.weight"]["spread"]) == (0.0, 0.0)
    w4 = model[4].weight.detach()
    assert (params["4.weight"]["low"], params["4.weight"]["high"]) == (w4.min().item(), w4.max().item())
    assert params["6.weight"]["rms"] == 0.0 and math.isclose(params["6.weight"]["absmax"], 1e-30, rel_tol=1e-6)


def test_extremes_of_other_weights_are_taken_when_a_rule_asks_for_them():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    probe = initlint.audit(model, torch.randn(16, 8)).probe
    stats = probe.params["2.weight"]
    assert stats.absmax is None  # neither zero nor constant: no pass over it in the probe
    w = model[2].weight.detach()
    assert stats.get("absmax") is None  # the report keeps no reference to the model's weights
    from initlint.capture import capture  # a rule's view, during the audit: taken exactly when asked for
    result = run_probe(capture(model), (torch.randn(16, 8),), {})
    stats = result.params["2.weight"]
    assert stats.absmax is None
    assert (stats.get("low"), stats["high"], stats["absmax"]) == (w.min().item(), w.max().item(), w.abs().max().item())
    assert "spread" in stats and stats.spread == w.max().item() - w.min().item()


def test_counts_stay_exact_next_to_half_precision_values():
    c = _Collector()
    c.put("ops", 0, "count", torch.tensor(70001))
    c.put("ops", 0, "high", torch.tensor(3.0, dtype=torch.float16))
    result = ProbeResult()
    c.finish(result)
    assert result.ops[0]["count"] == 70001  # float16 would round it to 70016
    assert result.ops[0]["high"] == 3.0


def test_token_similarity_is_the_mean_cosine_of_the_sampled_token_pairs(monkeypatch):
    """IL013's statistic from two sums over the tokens equals the mean off-diagonal cosine of their Gram matrix."""
    from initlint.probe.rows import TOKEN_COUNT, TOKEN_SEQUENCES, _row_positions, put_token_cosine

    def direct(y: torch.Tensor) -> float:
        seqs = y[:TOKEN_SEQUENCES].double()
        count, step = _row_positions(seqs.shape[1], TOKEN_COUNT)
        v = seqs[:, ::step][:, :count]
        v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-300)
        gram = v @ v.transpose(1, 2)
        return float((gram.sum() - gram.diagonal(dim1=1, dim2=2).sum()) / (v.shape[0] * count * (count - 1)))

    torch.manual_seed(0)
    shared = torch.randn(1, 1, 768)
    cases = {
        "independent": torch.randn(4, 200, 768),
        "near one direction": shared + 1e-3 * torch.randn(4, 200, 768),
        "identical": torch.full((2, 50, 64), 3.0),
        "shifted": torch.randn(2, 100, 512) + 2.0,
        "with zero tokens": torch.cat([torch.zeros(2, 10, 32), torch.randn(2, 10, 32)], dim=1),
        "half precision": (torch.randn(2, 64, 256) + 0.5).half(),
    }
    for name, y in cases.items():
        c = _Collector()
        put_token_cosine(c, 0, y, batch_first=True)
        c.flush()
        assert abs(float(c.values[-1]) - direct(y)) < 1e-6, name
    c = _Collector()
    put_token_cosine(c, 0, cases["identical"], batch_first=True)
    c.flush()
    assert abs(float(c.values[-1]) - 1.0) < 1e-6
    # samples of one shape are reduced in one batch, each to its own value; the output may change after
    c = _Collector()
    batch = {key: cases[name].clone() for key, name in enumerate(("independent", "near one direction", "shifted"))}
    for key, y in batch.items():
        put_token_cosine(c, key, y, batch_first=True)
    expected = {key: direct(y) for key, y in batch.items()}
    for y in batch.values():
        y.zero_()
    assert c.values == [] and len(c.batched) == 2  # nothing computed yet: two shapes wait
    c.flush()
    got = {key: float(v) for (_, key, _), v in zip(c.keys, c.values) if key is not None}
    assert got.keys() == expected.keys()
    assert all(abs(got[k] - expected[k]) < 1e-6 for k in expected), (got, expected)
    # past the limit of waiting elements, the batch is computed at once (memory stays bounded)
    import initlint.probe.collector as collector

    monkeypatch.setattr(collector, "BATCHED_ELEMENTS", 1)
    c = _Collector()
    put_token_cosine(c, 0, cases["shifted"], batch_first=True)
    assert not c.batched and abs(float(c.values[-1]) - direct(cases["shifted"])) < 1e-6
