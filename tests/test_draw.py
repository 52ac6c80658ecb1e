"""The probe's random tensors: drawn on the device they are used on, from that device's seeded generator,
with the numbers the probe always drew on the host."""
import pytest
import torch

from initlint.probe import draw


def test_host_draws_keep_the_stream_of_a_seeded_cpu_generator():
    old = torch.randn((3, 5), generator=torch.Generator().manual_seed(7)).to(torch.float64)
    new = draw.randn((3, 5), draw.generator("cpu", 7), torch.device("cpu"), torch.float64)
    assert new.dtype == torch.float64 and torch.equal(new, old)
    assert torch.equal(draw.rand((4,), draw.generator("cpu", 1), "cpu"),
                       torch.rand(4, generator=torch.Generator().manual_seed(1)))
    assert torch.equal(draw.randint(10, (6,), draw.generator("cpu", 2), "cpu"),
                       torch.randint(0, 10, (6,), generator=torch.Generator().manual_seed(2)))


def test_a_meta_draw_has_a_shape_and_no_generator():
    assert draw.generator("meta", 0) is None
    out = draw.randn((2, 3), None, torch.device("meta"), torch.float16)
    assert out.device.type == "meta" and out.shape == (2, 3) and out.dtype == torch.float16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_draw_is_made_on_the_device_and_repeats_with_its_seed():
    gen = draw.generator("cuda", 0)
    assert gen.device.type == "cuda"
    first = draw.randn((8, 8), gen, torch.device("cuda"), torch.bfloat16)
    again = draw.randn((8, 8), draw.generator("cuda", 0), torch.device("cuda"), torch.bfloat16)
    assert first.device.type == "cuda" and first.dtype == torch.bfloat16 and torch.equal(first, again)


def test_the_audit_reports_the_same_figures_twice_with_inputs_it_infers():
    import initlint

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    first, second = initlint.audit(model), initlint.audit(model)
    assert first.probe.grads == second.probe.grads and first.probe.ops == second.probe.ops
