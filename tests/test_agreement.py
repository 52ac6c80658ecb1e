"""The sentence every rank raises when some rank of a sharded audit failed (initlint.scale.agreement).

The exchange itself runs over several processes in tests/test_distributed_failure.py (slow tier);
here, what the ranks make of the statuses they exchanged."""
from initlint.scale.agreement import _FAILED, _FINAL, _sentence

OOM = ("the forward probe", "RuntimeError: CUDA out of memory", "the model's forward raised RuntimeError: CUDA out of "
       "memory on the probe input (8, 64)")


def test_one_rank_failed_names_it_and_its_error():
    failed = _sentence([(1, _FAILED, OOM)], members=4, world=4)
    assert failed.sentence == f"rank 1 of 4 failed in the forward probe: {OOM[2]}"
    assert failed.reason == "rank 1: RuntimeError: CUDA out of memory"
    assert not failed.final


def test_the_first_failing_rank_is_named_and_the_others_counted():
    other = ("the backward probe", "ValueError: x", "the model's forward raised ValueError: x")
    failed = _sentence([(1, _FAILED, OOM), (2, _FAILED, other), (3, _FAILED, OOM)], members=4, world=4)
    assert failed.sentence == f"rank 1 of 4 failed in the forward probe: {OOM[2]} (ranks 2, 3 failed too)"
    assert _sentence([(0, _FAILED, OOM), (3, _FAILED, OOM)], members=4, world=4).sentence.endswith(
        "(rank 3 failed too)")


def test_every_rank_failed_alike_is_the_error_itself():
    failed = _sentence([(r, _FAILED, OOM) for r in range(4)], members=4, world=4)
    assert failed.sentence == OOM[2]
    assert failed.reason == OOM[1]


def test_one_of_initlints_own_errors_is_final():
    text = ("preparing its probe batch", "the example inputs contain NaN or Inf", "the example inputs contain NaN or Inf")
    assert _sentence([(0, _FAILED, OOM), (2, _FINAL, text)], members=4, world=4).final
