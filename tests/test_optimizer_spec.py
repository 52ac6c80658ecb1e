"""``--optimizer`` specs: parsed with ast, never evaluated; bad ones are one sentence."""
import sys

import pytest
import torch

from initlint.errors import UsageError
from initlint.inputs.optimizer import parse_optimizer


def test_a_torch_optim_class_with_literal_arguments():
    model = torch.nn.Linear(4, 3)
    opt = parse_optimizer("AdamW(lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95))")(model)
    assert type(opt) is torch.optim.AdamW
    group = opt.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["betas"]) == (3e-4, 0.1, (0.9, 0.95))
    assert [id(p) for p in group["params"]] == [id(p) for p in model.parameters()]


def test_a_bare_name_takes_the_class_defaults_and_a_module_path_names_any_class():
    model = torch.nn.Linear(4, 3)
    assert parse_optimizer("Adam")(model).param_groups[0]["lr"] == torch.optim.Adam(model.parameters()).defaults["lr"]
    assert type(parse_optimizer("torch.optim:SGD(lr=0.1, momentum=0.9)")(model)) is torch.optim.SGD


def test_a_spec_never_runs_code(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(UsageError, match="must be a literal"):
        parse_optimizer(f"AdamW(lr=open({str(marker)!r}, 'w'))")
    assert not marker.exists()


def test_parsing_needs_no_torch():
    import subprocess

    code = ("import sys; from initlint.inputs.optimizer import parse_optimizer as p; "
            "p('AdamW(lr=1e-3)'); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("text, words", [
    ("", "is empty"),
    ("Adamw(lr=1e-3)", "no optimizer named Adamw"),
    ("AdamW(lr=x)", "lr must be a literal"),
    ("AdamW(lr=1e-3", "not valid syntax"),
    ("json:dumps", "is not a torch.optim.Optimizer subclass"),
    ("no_such_package_xyz:Opt(lr=1)", "cannot import no_such_package_xyz"),
    ("AdamW(**kw)", "name each keyword"),
    ("AdamW(lr=-1.0)", "refused its arguments: Invalid learning rate"),
    ("AdamW(lrr=1e-3)", "refused its arguments"),
    ("optim.AdamW(lr=1)", "not a class name"),
    ("1 2:Adam", "not a module path"),
])
def test_a_bad_spec_is_one_sentence(text, words):
    with pytest.raises(UsageError) as exc:
        parse_optimizer(text)(torch.nn.Linear(2, 2))
    assert words in str(exc.value) and "\n" not in str(exc.value)
