"""Every finding points at source: the construction line of a module, the call line of a functional op."""
import os
import textwrap

import pytest
import torch
from cli_server import run_initlint

import initlint
from initlint.inputs.load import import_file

SOURCE = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Net(nn.Module):
        def __init__(self, branch=False):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(8)
            self.fc = nn.Linear(8, 64)
            nn.init.constant_(self.fc.bias, -10.0)
            self.head = nn.Linear(64, 2)
            self.branch = branch

        def forward(self, x):
            h = self.bn1(self.conv1(x)).mean(dim=(2, 3))
            if self.branch and h.sum() > 1e9:
                h = h * 2
            z = F.relu(self.fc(h))
            return self.head(z)
''')


def line_of(text):
    return next(i for i, line in enumerate(SOURCE.splitlines(), start=1) if text in line)


@pytest.mark.parametrize("branch,capture", [(False, "fx"), (True, "runtime")])
def test_module_and_functional_findings_point_at_their_lines(tmp_path, branch, capture):
    path = tmp_path / "net.py"
    path.write_text(SOURCE)
    module = import_file(str(path))
    report = initlint.audit(module.Net(branch))
    assert report.capture == capture
    where = {f.code: f.location for f in report.findings}
    assert where["IL002"] == (str(path), line_of("self.conv1 = nn.Conv2d"))
    assert where["IL003"] == (str(path), line_of("z = F.relu(self.fc(h))"))


def test_text_output_uses_path_line_col(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "net.py"
    path.write_text(SOURCE)
    out = run_initlint(["check", "net.py", "--format", "concise"], cwd=tmp_path)
    assert out.returncode == 1
    assert f"net.py:{line_of('self.conv1 = nn.Conv2d')}:1: IL002 [conv1]" in out.stdout


# ----------------------------------------------------------------------------- models built inside a library
GPT2 = textwrap.dedent('''
    import torch.nn as nn
    from transformers import GPT2Config, GPT2LMHeadModel


    def config():
        return GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=100, n_positions=32, initializer_range=2.0)


    def build():
        return GPT2LMHeadModel(config())


    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = GPT2LMHeadModel(config())

        def forward(self, input_ids):
            return self.backbone(input_ids).logits
''')
"""A GPT-2 whose weights are drawn 16x too wide: its attention rows are one-hot (IL011)."""


def gpt2_line(text):
    return next(i for i, line in enumerate(GPT2.splitlines(), start=1) if text in line)


@pytest.fixture()
def gpt2_file(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt.py").write_text(GPT2)
    return tmp_path / "gpt.py"


def test_library_files_are_named_from_their_package_folder():
    pytest.importorskip("transformers")
    import transformers.models.gpt2.modeling_gpt2 as gpt2

    from initlint.capture.locate import is_library, shown_path
    from initlint.report.findings import Finding
    from initlint.report.table import where

    assert is_library(gpt2.__file__) and not is_library(__file__)
    assert shown_path(gpt2.__file__) == os.path.join("transformers", "models", "gpt2", "modeling_gpt2.py")
    inside = Finding("IL011", "n", "warning", "h.0.attn", "m", "f", location=(gpt2.__file__, 233))
    assert where(inside) == "transformers/models/gpt2/modeling_gpt2.py:233"  # a line to read, not to edit: no column
    own = Finding("IL011", "n", "warning", "fc", "m", "f", location=(os.path.abspath("net.py"), 7))
    assert where(own) == "net.py:7:1"


def test_a_library_model_inside_a_user_module_points_at_the_line_that_built_it(gpt2_file):
    module = import_file(str(gpt2_file))
    report = initlint.audit(module.Wrapped(), torch.randint(0, 100, (4, 16)))
    assert ("IL011", "backbone.transformer.h.0.attn.c_attn") in report.codes()
    assert {f.location for f in report.findings} == {(str(gpt2_file), gpt2_line("self.backbone = GPT2LMHeadModel"))}


def test_a_library_model_on_its_own_is_located_in_the_library_shortened():
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=100, n_positions=32,
                                       initializer_range=2.0))
    report = initlint.audit(model, torch.randint(0, 100, (4, 16)))
    il011 = next(f for f in report.findings if f.code == "IL011")
    assert os.path.basename(il011.location[0]) == "modeling_gpt2.py"
    with pytest.raises(AssertionError) as failed:
        report.assert_clean()
    assert "transformers/models/gpt2/modeling_gpt2.py:" in str(failed.value)
    assert "site-packages" not in str(failed.value)


def run_cli(*args, cwd):
    env = dict(os.environ, INITLINT_NO_PROGRESS="1", NO_COLOR="1")
    return run_initlint(["check", *args], cwd=cwd, env=env)


def test_a_library_model_built_by_a_factory_points_at_the_factory_line_in_every_format(gpt2_file):
    import json
    from pathlib import Path

    pytest.importorskip("jsonschema")
    import jsonschema
    from click.testing import CliRunner

    from initlint.cli import main

    def check(fmt):  # in this process: transformers is imported once
        result = CliRunner().invoke(main, ["check", "gpt.py:build", "--format", fmt])
        assert result.exit_code == 1, result.output
        return result.stdout

    line = gpt2_line("return GPT2LMHeadModel(config())")
    (result,) = json.loads(check("json"))["results"]
    assert ("IL011", "transformer.h.0.attn.c_attn") in {(f["code"], f["module"]) for f in result["findings"]}
    assert {(f["location"]["path"], f["location"]["line"]) for f in result["findings"]} == {("gpt.py", line)}

    sarif = json.loads(check("sarif"))
    schema = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(sarif)
    physical = [loc["physicalLocation"] for r in sarif["runs"][0]["results"] for loc in r["locations"]]
    assert physical and all(p == {"artifactLocation": {"uri": "gpt.py", "uriBaseId": "%SRCROOT%"},
                                  "region": {"startLine": line}} for p in physical)

    github = check("github").splitlines()
    assert github and all(f"file=gpt.py,line={line}," in annotation for annotation in github)


def test_json_and_text_name_a_file_the_same_way_whatever_the_target_spelling(tmp_path):
    import json

    path = tmp_path / "net.py"
    path.write_text(SOURCE)
    line = line_of("self.conv1 = nn.Conv2d")
    text = run_cli(str(path), cwd=tmp_path).stdout  # an absolute target
    doc = json.loads(run_cli(str(path), "--format", "json", cwd=tmp_path).stdout)
    il002 = next(f for r in doc["results"] for f in r["findings"] if f["code"] == "IL002")
    assert il002["location"] == {"path": "net.py", "line": line}
    assert f"net.py:{line}:1 " in text and str(tmp_path) not in text.split("\n", 1)[1]


CLASSES = textwrap.dedent('''
    import torch.nn as nn


    class Block(nn.Module):
        def __init__(self, flag=True):
            super().__init__()
            # self.proj = nn.Linear(4, 8)
            if flag: self.gate = nn.Linear(4, 4)
            self.proj: nn.Module = nn.Linear(4, 4)
            self.add_module("out-1", nn.Linear(4, 4))
            self.extra = nn.Identity(); self.spare = nn.Tanh()


    class Tower(nn.Module):
        """A stack of blocks, for example::

            self.norm = nn.LayerNorm(4)  # in a docstring: not where the norm is built
        """

        def __init__(self):
            super().__init__()
            self.head: nn.Module  # declared, built below
            note = "self.blocks = nn.ModuleList(...) in a string"
            self.blocks = nn.ModuleList([Block(), Block()])
            self.first, self.norm = nn.Identity(), nn.LayerNorm(4)
            self.head = nn.Linear(4, 2)


    def make_head():
        class Head(nn.Module):
            """self.out = nn.Linear(4, 2), as its docstring says."""

            def __init__(self):
                super().__init__()
                self.out = nn.Linear(4, 2)
        return Head()
''')


def test_locations_are_found_on_demand_and_agree_with_the_source(tmp_path, monkeypatch):
    from initlint.capture import locate

    path = tmp_path / "tower.py"
    path.write_text(CLASSES)
    module = import_file(str(path))
    lines = CLASSES.splitlines()

    def line(text, after=0):
        return next(i for i, s in enumerate(lines, start=1) if i > after and text in s)

    read = []
    original = locate._assignments.__wrapped__
    monkeypatch.setattr(locate, "_assignments", lambda cls: read.append(cls.__name__) or original(cls))
    where = locate.ModuleLocations(module.Tower())
    assert read == []  # nothing is read until a location is asked for
    assert where["blocks.1.proj"] == (str(path), line("self.proj: nn.Module"))
    assert read == ["Block"]  # the parent's class only
    assert where["blocks.1.gate"] == (str(path), line("if flag: self.gate"))  # after an `if x:` on its line
    assert where["blocks.0.out-1"] == (str(path), line('add_module("out-1"'))
    assert where["blocks.0.spare"] == where["blocks.0.extra"] == (str(path), line("self.extra = nn.Identity(); self.spare"))
    assert where["blocks.0"] == where["blocks"] == (str(path), line("self.blocks = nn.ModuleList([Block()"))
    assert where["norm"] == where["first"] == (str(path), line("self.first, self.norm"))  # not the docstring's line
    assert where["head"] == (str(path), line("self.head = nn.Linear"))  # not its bare annotation
    assert where[""] == (str(path), line("class Tower"))
    assert "nowhere" not in where and where.get("blocks.0.nowhere") is None
    assert dict(where) == {p: where[p] for p, _ in module.Tower().named_modules()}  # every module of the tree
    # a class defined inside a function: its source is indented
    head = locate.ModuleLocations(module.make_head())
    assert head["out"] == (str(path), line("self.out = nn.Linear(4, 2)", after=line("def __init__", after=line("class Head"))))


def test_a_clean_audit_reads_no_class_source(monkeypatch):
    from initlint.capture import locate

    read = []
    original = locate._assignments.__wrapped__
    monkeypatch.setattr(locate, "_assignments", lambda cls: read.append(cls) or original(cls))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    assert initlint.audit(model, torch.randn(32, 16)).findings == []
    assert read == []
