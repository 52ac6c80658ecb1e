"""The sweep calibration's factories build what they claim, and bench_sweep's arithmetic holds."""
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_sweep as B  # noqa: E402
import sweep_factories as S  # noqa: E402

SMALL = {"d_model": 64, "width": 32, "n_layer": 2}


# gpt_mup needs the benchmark-only ``mup`` package: benchmarks/sweep_factories.py checks it (``check_mup_twin``)
@pytest.mark.parametrize("name", [n for n in S.FACTORIES if n not in S.NEEDS_MUP])
def test_factory_builds_and_trains_one_step(name):
    fac = S.FACTORIES[name]
    torch.manual_seed(0)
    model = fac.build(**{fac.keyword: SMALL[fac.keyword]})
    task = S.TASKS[fac.task](0)
    x, y = task.batch(torch.Generator().manual_seed(0), 2)
    out = model(x)
    assert out.shape[-1] == (S.VOCAB if fac.task == "markov" else S.CLASSES)
    loss = task.loss(out, y)
    assert math.isfinite(float(loss.detach()))
    opt = fac.optimizer(model, 1e-3)
    loss.backward()
    opt.step()


def test_default_gpt_attention_scale_is_one_over_sqrt_head_width():
    head = 256 // S.HEADS
    assert S.gpt_default(d_model=256, n_layer=1).h[0].attn.scale == pytest.approx(1 / math.sqrt(head))


def test_sp_init_is_fixed_and_projections_scaled_by_depth():
    torch.manual_seed(0)
    model = S.gpt_sp(d_model=256, n_layer=2)
    assert model.h[0].mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert model.h[0].mlp.c_proj.weight.std().item() == pytest.approx(0.02 / 2, rel=0.02)
    assert S.mlp_std002(width=256).fc[1].weight.std().item() == pytest.approx(0.02, rel=0.02)


def test_stack_variants_differ_only_in_depth_scaling():
    torch.manual_seed(0)
    plain = S.stack_plain(n_layer=8)
    torch.manual_seed(0)
    scaled = S.stack_init_scaled(n_layer=8)
    assert torch.allclose(scaled.h[3].proj.weight, plain.h[3].proj.weight / 4)
    assert torch.equal(scaled.h[3].fc.weight, plain.h[3].fc.weight)
    assert torch.count_nonzero(S.stack_zero_ends(n_layer=8).h[3].proj.weight) == 0
    assert S.stack_multiplier(n_layer=8).h[0].multiplier == pytest.approx(0.25)
    assert plain.h[0].multiplier == 1.0


def test_role_pools_blocks_only():
    assert B.role("h.11.mlp.c_fc") == "h.{i}.mlp.c_fc"
    assert B.role("h.3") == "h.{i}"
    assert B.role("fc.2") == "fc.2"


def test_fit_recovers_the_exponent_and_refuses_zero():
    sizes = [64, 128, 256, 512]
    slope, err = B.fit(sizes, [3 * s ** 0.5 for s in sizes])
    assert slope == pytest.approx(0.5) and err == pytest.approx(0.0, abs=1e-12)
    assert B.fit(sizes, [0.0, 1.0, 2.0, 3.0]) is None


def test_transfer_flags_a_lost_best_lr_only_beyond_the_margin():
    fac = S.FACTORIES["gpt_sp"]
    results = {(64, 1e-3): [2.0, 2.0], (64, 3e-3): [1.8, 1.8],
               (512, 1e-3): [1.60, 1.62], (512, 3e-3): [1.70, 1.70]}
    tr = B.transfer(fac, results)
    assert (tr["lr_small"], tr["lr_large"], tr["loses"]) == (3e-3, 1e-3, True)
    results[(512, 3e-3)] = [1.62, 1.63]  # within 2% of 1.61
    assert B.transfer(fac, results)["loses"] is False
    results[(512, 3e-3)] = [math.inf, math.inf]  # diverged
    assert B.transfer(fac, results)["loses"] is True
